"""The packed batch: the requests in flight (joining and running), their tokens in pages,
and the pools, changed together.

Each request has *known* tokens (prompt plus generated) of which ``held`` are in its pages:
a joining row many unheld, a running row exactly one (fed by the next forward). Samples of one
``submit_n`` share one prefill (a *leader* and its *followers*); a launched forward records
each row's *admission* (:meth:`PackedBatch.carried`). How and why: ``docs/lab/engine-notes.md``,
"packed/batch.py". Axis letters: ``B`` requests in the batch (row order = arrival).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from ...observe.packed import DECODE, Chunk, PackedState
from ..forward import Pending
from ..siblings import shared_rows
from ..state import RequestState, Status
from .attention import Pools, packed_forward
from .pages import PageTable
from .plan import SCHEDULES, Want, plan_chunks
from .steady import decode_plan, known_tokens, lengths

GROWTH = 8  # the pools grow by at least 1/GROWTH of their pages (or what is needed)


@dataclass
class Launched:
    """A packed forward built whose sampled tokens are not read yet (pipelining).

    Attributes:
        chunks: its chunks. uids: the uid of each row it samples, in the order of
            ``pending``'s rows (a leader's followers after it).
        pending: the lazy :class:`~workbench.engine.forward.Pending` (``None``: no row samples).
        outputs: the arrays whose evaluation runs it (``pending``'s, or the pools).
        deferred: chunks ending at an unread token; pages indexed on read (:meth:`PackedBatch.after_read`).
        paced: with pacing, the pacer's ``PacedForward`` on it.
        admitted: uid -> the admission of each row when it was built.
    """

    chunks: tuple[Chunk, ...]
    uids: tuple[int, ...]
    pending: Pending | None
    outputs: list[mx.array]
    deferred: tuple[Chunk, ...] = ()
    paced: Any = None
    admitted: dict[int, int] = field(default_factory=dict)

    def clone(self) -> "Launched":
        """A copy sharing the arrays (nothing writes them in place)."""
        pending = None if self.pending is None else self.pending.clone()
        return Launched(
            self.chunks,
            self.uids,
            pending,
            list(self.outputs),
            self.deferred,
            self.paced,
            dict(self.admitted),
        )


class PackedBatch:
    """Requests in flight in the packed layout.

    Args:
        page_size: token positions per page. page_bytes: bytes of one page over all
            layers (keys and values). n_layers: the model's layers.
        max_pages: most pages the pools may allocate (``kv_budget_bytes // page_bytes``;
            ``None``: no limit).
        cache_pages: prefix caching: most unreferenced pages kept cached (``None``: off).
        decode_kernel, token_attention: as
            :func:`~workbench.engine.packed.attention.packed_forward`'s.

    Attributes:
        rows: request states in row order. held: ``[B]`` tokens in each row's pages.
        admitted: ``[B]`` each row's admission number (a re-admitted uid gets a new one).
        table: the :class:`PageTable`. pools: the :class:`Pools`.
        last_chunks: the chunks of the latest packed forward whose tokens were read.
        last_paced: with pacing, the pacer's decision on that forward (``None``: off).
        follows: follower uid -> its leader's uid (samples waiting for one prefill).
        sampled: row indices the latest forward's logits are for, in order.
        launched: the forward launched before the previous one's tokens were read
            (:class:`Launched`; ``None``: none in flight).
    """

    fast_path = "packed"
    caches = None  # no mlx-lm batch cache: the pools hold the KV
    view = None
    pending = None
    free: tuple[int, ...] = ()  # no free slots: a freed page returns to the free list at once
    draft: Any = None  # speculating with a draft model: its caches (levers/draft_model.py), by uid

    def __init__(
        self,
        page_size: int,
        page_bytes: int,
        n_layers: int,
        max_pages: int | None = None,
        cache_pages: int | None = None,
        decode_kernel: bool | None = None,
        token_attention: Any = None,
    ):
        self.page_size, self.page_bytes, self.n_layers = page_size, page_bytes, n_layers
        self.token_attention = token_attention
        self.max_pages, self.cache_pages, self.decode_kernel = max_pages, cache_pages, decode_kernel
        self.rows: list[RequestState] = []
        self.held: list[int] = []
        self.admitted: list[int] = []
        self.admissions = 0  # the next admission's number
        self.table = PageTable(page_size, max_pages, cache_pages)
        self.pools = Pools(n_layers)
        self.last_chunks: tuple[Chunk, ...] = ()
        self.last_paced: Any = None
        self.follows: dict[int, int] = {}
        self.sampled: list[int] = []
        self.launched: Launched | None = None

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def kv_bytes(self) -> int:
        """Bytes the requests' pages hold: ``used pages * page_bytes`` (a shared page once)."""
        return self.table.used * self.page_bytes

    @property
    def cached_bytes(self) -> int:
        """Bytes of the cached pages no request holds: ``cached pages * page_bytes``."""
        return len(self.table.cached) * self.page_bytes

    @property
    def pool_bytes(self) -> int:
        """Bytes the pools allocate: ``capacity pages * page_bytes`` (free pages included)."""
        return self.pools.slots // self.page_size * self.page_bytes

    def add(self, states: Sequence[RequestState]) -> None:
        """Append joining rows, each from its longest cached prefix; a ``submit_n`` sample
        follows its group's first member."""
        leaders = shared_rows(states)
        for b, s in enumerate(states):
            hit = self.table.match(s.inputs) if leaders[b] == b else []
            self.table.share(s.uid, hit)
            if leaders[b] != b:
                self.follows[s.uid] = states[leaders[b]].uid
            s.cached_tokens = len(hit) * self.page_size
            self.rows.append(s)
            self.held.append(s.cached_tokens)
            self.admitted.append(self.admissions)
            self.admissions += 1

    def carried(self, launched: Launched | None) -> dict[int, int]:
        """uid -> its index in ``launched.uids`` of each row ``launched`` samples that is still
        the admission it was built for (``{}`` for ``None``).

        Example: ``launched.uids == (3, 5)``, uid 5 preempted and admitted again since
        -> ``{3: 0}``."""
        if launched is None:
            return {}
        now, then = dict(zip([r.uid for r in self.rows], self.admitted, strict=True)), launched.admitted
        return {u: i for i, u in enumerate(launched.uids) if u in now and u in then and then[u] == now[u]}

    def _promote(self, leaving: Sequence[int] = ()) -> None:
        """Followers of a finished or ``leaving`` leader: the next one leads."""
        if not self.follows:
            return
        alive = {r.uid for r in self.rows if not r.finished and r.uid not in set(leaving)}
        held = dict(zip((r.uid for r in self.rows), self.held, strict=True))
        for b, f in [(b, r.uid) for b, r in enumerate(self.rows) if r.uid in self.follows]:
            lead = self.follows[f]
            if f in alive and lead in alive:
                continue
            del self.follows[f]
            if f not in alive:
                continue
            self.table.fork(lead, f)
            self.held[b] = held[f] = held.get(lead, 0)
            self.follows.update({g: f for g, ld in self.follows.items() if ld == lead})

    def wants(self, unread: Collection[int] = ()) -> list[Want]:
        """Each unfinished row's :class:`Want`; uids in ``unread`` count their unread token as known."""
        self._promote()
        return [
            Want(r.uid, h, r.n_inputs + (r.uid in unread), r.status is Status.RUNNING or r.uid in unread)
            for r, h in zip(self.rows, self.held, strict=True)
            if not r.finished
            and r.uid not in self.follows
            and not (r.uid in unread and len(r.tokens) + 1 >= r.valid.request.max_tokens)
        ]

    def plan(self, budget: int, schedule: str = "hybrid", unread: Collection[int] = ()) -> tuple[Chunk, ...]:
        """The next forward's chunks (:func:`workbench.engine.packed.plan.plan_chunks`)
        over :meth:`wants` with ``unread``; while no row joins nor follows, the same chunks
        without the wants (:func:`~workbench.engine.packed.steady.decode_plan`)."""
        if schedule in SCHEDULES and not self.follows:
            chunks = decode_plan(self.rows, self.held, unread, budget)
            if chunks is not None:
                return chunks
        return plan_chunks(self.wants(unread), budget, schedule)

    def forward(
        self,
        model: Any,
        chunks: Sequence[Chunk],
        after: Launched | None = None,
        tokens: mx.array | None = None,
        unread: dict[int, int] | None = None,
        known: dict[int, int] | None = None,
    ) -> mx.array:
        """Reserve the chunks' pages and build the packed forward (lazy), fed ``after``'s unread
        tokens or ``tokens`` ``[T]`` (a verify's drafts); returns logits ``[R, V]`` of :attr:`sampled`.
        ``unread``: :meth:`carried` of ``after`` when the caller has it (else made here);
        ``known``: uid -> its known tokens (``n_inputs``) when the caller has them."""
        by_uid = {r.uid: b for b, r in enumerate(self.rows)}
        copies = self.table.prepare([(c.uid, c.start, c.start + c.n_tokens) for c in chunks])
        have = self.pools.slots // self.page_size
        if self.table.capacity > have:
            grown = max(self.table.capacity, have + math.ceil(have / GROWTH))
            self.pools.slots = min(grown, max(self.max_pages or grown, self.table.capacity)) * self.page_size
        self.pools.copy_pages(copies, self.page_size)
        charge = getattr(model, "charge_packed", None)  # a model that prices its forwards (a cost clock)
        if charge is not None:
            charge(chunks)
        logits = packed_forward(
            model,
            self.pools,
            self.table,
            chunks,
            self._tokens(chunks, after, unread, known) if tokens is None else tokens,
            decode_kernel=self.decode_kernel,
            token_attention=self.token_attention,
        )
        indexing = self.table.index is not None  # prefix caching: index the pages filled
        held = self.held
        for c in chunks:
            b, end = by_uid[c.uid], c.start + c.n_tokens
            held[b] = end
            if indexing and end <= self.rows[b].n_inputs:
                self.table.register(c.uid, self.rows[b].inputs, c.start, end)
        return self._fan_out(logits, [by_uid[c.uid] for c in chunks if c.samples])

    def _tokens(
        self,
        chunks: Sequence[Chunk],
        after: Launched | None,
        unread: dict[int, int] | None = None,
        known: dict[int, int] | None = None,
    ) -> mx.array:
        """The chunks' tokens ``[T]`` uint32, unread ones from ``after`` (``unread``: its
        :meth:`carried`, made when ``None``; ``known``: uid -> ``n_inputs``, made when ``None``)."""
        rows = {r.uid: r for r in self.rows}
        unread = self.carried(after) if unread is None else unread
        known = {u: r.n_inputs for u, r in rows.items()} if known is None else known
        if chunks and unread and not [c for c in chunks if c.n_tokens != 1 or c.start < known[c.uid]]:
            src = [unread[c.uid] for c in chunks]  # each chunk its row's unread token (a pipelined step)
        else:
            at, src, tokens = self._known_tokens(chunks, rows, unread, known)
            if not at or len(at) < len(tokens):  # some known token: scatter the unread ones
                out = mx.array(tokens, dtype=mx.uint32)
                if at:
                    out[mx.array(at)] = after.pending.tokens[mx.array(src)].astype(mx.uint32)
                return out
        unread_tokens = after.pending.tokens  # every token unread: no scatter
        same = src == list(range(unread_tokens.shape[0]))
        return (unread_tokens if same else unread_tokens[mx.array(src)]).astype(mx.uint32)

    @staticmethod
    def _known_tokens(
        chunks: Sequence[Chunk], rows: dict[int, RequestState], unread: dict[int, int], known: dict[int, int]
    ) -> tuple[list[int], list[int], list[int]]:
        """``(at, src, tokens)``: the chunks' known tokens ``[T]`` (0 at an unread one), where
        each unread token goes and its row in ``after``'s pending tokens."""
        tokens, at, src = [], [], []
        for c in chunks:
            r = rows[c.uid]
            n = known[c.uid]
            got = r.inputs_slice(c.start, c.start + c.n_tokens) if c.start < n else []
            tokens += got
            if len(got) < c.n_tokens:  # a decode chunk of the row's unread token
                at.append(len(tokens))
                src.append(unread[c.uid])
                tokens.append(0)
        return at, src, tokens

    def after_read(self, launched: Launched | None) -> None:
        """After a read: held tokens cut to known ones, each row's ``fed`` (its generated tokens
        in its pages) set, deferred chunks' pages indexed."""
        held = self.held
        for b, (r, n, m) in enumerate(zip(self.rows, *lengths(self.rows))):  # no call a row
            h, k = held[b], n + m
            if h > k:
                h = held[b] = k
            r.fed = h - n if h > n else 0
        if launched is None or self.table.index is None or not launched.deferred:
            return  # nothing to index (no prefix caching, or no chunk ended at an unread token)
        rows = {r.uid: r for r in self.rows}
        carried = self.carried(launched)
        for c in launched.deferred:
            r = rows.get(c.uid)
            if c.uid in carried and not r.finished and r.n_inputs >= c.end:
                self.table.register(c.uid, r.inputs, c.start, c.end)

    def _fan_out(self, logits: mx.array, sampling: list[int]) -> mx.array:
        """``logits`` ``[R, V]`` with a row repeated per follower; sets :attr:`sampled`."""
        if not self.follows:  # no sample waits for a leader: nothing to fan out
            self.sampled = list(sampling)
            return logits
        followers: dict[int, list[int]] = {}  # leader uid -> its followers' row indices, row order
        for f, r in enumerate(self.rows):
            if r.uid in self.follows:
                followers.setdefault(self.follows[r.uid], []).append(f)
        self.sampled, take = [], []
        for i, b in enumerate(sampling):
            lead = self.rows[b].uid
            joined = followers.get(lead, [])
            for f in joined:
                self.table.fork(lead, self.rows[f].uid)
                self.held[f] = self.held[b]
                del self.follows[self.rows[f].uid]
            self.sampled += [b, *joined]
            take += [i] * (1 + len(joined))
        return logits if len(take) == len(sampling) else logits[mx.array(take)]

    def launch(
        self,
        model: Any,
        chunks: Sequence[Chunk],
        sample: Callable[[mx.array, list[int]], Pending],
        after: Launched | None = None,
        unread: dict[int, int] | None = None,
    ) -> Launched:
        """The :class:`Launched` of ``chunks`` and ``sample(logits [R, V], rows)`` -> ``Pending``,
        not started (``mx.async_eval(*launched.outputs)``); ``unread``: as :meth:`forward`'s."""
        known = dict(zip([r.uid for r in self.rows], known_tokens(self.rows)))  # uid -> ``n_inputs``
        deferred = tuple([c for c in chunks if c.start + c.n_tokens > known[c.uid]])
        logits = self.forward(model, chunks, after, unread=unread, known=known)
        rows = list(self.sampled)
        pending = sample(logits, rows) if rows else None
        pools = [a for a in self.pools.keys + self.pools.values if a is not None]
        outputs = pending.arrays() if pending is not None else pools  # a prefill forward: its writes
        if pending is not None and any([c.kind != DECODE for c in chunks]):
            outputs = [*outputs, *pools]  # a row prefill's logits read none of its writes: made with them
        all_uids = [r.uid for r in self.rows]
        admitted = dict(zip(all_uids, self.admitted, strict=True))
        uids = tuple([all_uids[b] for b in rows])
        return Launched(tuple(chunks), uids, pending, outputs, deferred, admitted=admitted)

    def filter(self, keep: Sequence[int], reuse_slots: bool | None = None) -> None:
        """Keep only rows ``keep`` (sorted); the others' pages go back (``reuse_slots`` unused)."""
        keep = set(keep)
        self._promote([r.uid for b, r in enumerate(self.rows) if b not in keep])
        for b, r in enumerate(self.rows):
            if b not in keep:
                self.table.free(r.uid)
                self.follows.pop(r.uid, None)
        self.rows = [r for b, r in enumerate(self.rows) if b in keep]
        self.held = [h for b, h in enumerate(self.held) if b in keep]
        self.admitted = [a for b, a in enumerate(self.admitted) if b in keep]
        if self.launched is not None and not self.carried(self.launched):
            self.launched = None  # in flight for rows that all left: its tokens are never read

    def compact(self) -> bool:
        """Nothing to compact (no free slots). Returns False."""
        return False

    def clone(
        self, state_of: Callable[[RequestState], RequestState], share_appended: bool = False
    ) -> "PackedBatch":
        """An independent copy (``share_appended``: a savepoint); ``state_of`` maps row states."""
        out = PackedBatch(
            self.page_size,
            self.page_bytes,
            self.n_layers,
            self.max_pages,
            self.cache_pages,
            self.decode_kernel,
            self.token_attention,
        )
        out.rows, out.held = [state_of(r) for r in self.rows], list(self.held)
        out.admitted, out.admissions = list(self.admitted), self.admissions
        out.table, out.pools, out.last_chunks = (
            self.table.clone(share_handouts=share_appended),
            self.pools.clone(share_appended),
            self.last_chunks,
        )
        out.follows, out.sampled, out.last_paced = dict(self.follows), list(self.sampled), self.last_paced
        out.launched = None if self.launched is None else self.launched.clone()
        out.draft = None if self.draft is None else self.draft.clone(share_appended)
        return out

    def state(self, token_budget: int) -> PackedState:
        """The frozen :class:`PackedState` now."""
        held = dict(zip([r.uid for r in self.rows], self.held, strict=True))
        table = self.table.pages
        pages = tuple([(r.uid, tuple(table[r.uid])) for r in self.rows if r.uid in table])
        paced = self.last_paced
        return PackedState(
            self.page_size,
            self.page_bytes,
            self.pools.slots // self.page_size,
            pages,
            tuple(self.table.free_list),
            tuple([(u, held[u]) for u, _ in pages]),
            self.last_chunks,
            token_budget,
            None if self.table.index is None else tuple(self.table.cached),
            *((None, None, None) if paced is None else (paced.token_cap, paced.predicted_s, paced.budget_s)),
        )

    def problems(self) -> list[str]:
        """What disagrees in the books (pages against held tokens, followers, pools); ``[]``: none."""
        out, uids = self.table.problems(), {r.uid for r in self.rows}
        for r, h in zip(self.rows, self.held, strict=True):
            n = len(self.table.pages.get(r.uid, []))
            if n < self.table.pages_for(h) or h > len(r.inputs):
                out.append(
                    f"uid {r.uid}: {h} tokens held, {len(r.inputs)} known, in {n} page(s) of {self.page_size}"
                )
            if r.status is Status.RUNNING and h < r.n_inputs - 1:  # only its latest token may be unfed
                out.append(f"uid {r.uid} runs with {h} of its {r.n_inputs} known tokens in its pages")
            if r.uid in self.follows and (n or h or self.follows[r.uid] not in uids):
                out.append(f"uid {r.uid} follows uid {self.follows[r.uid]} but holds {n} page(s)")
        if set(self.table.pages) - uids:
            out.append(f"pages held by uids not in the batch: {sorted(set(self.table.pages) - uids)}")
        if self.table.capacity * self.page_size > self.pools.slots and self.pools.keys[0] is not None:
            out.append(f"{self.table.capacity} pages handed out, pools of {self.pools.slots} slots")
        return out
