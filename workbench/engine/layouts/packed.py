"""The packed layout: every in-flight token of an iteration in one ``[1, T]`` forward, KV in
pages (:mod:`workbench.engine.packed`).

Knows: the :class:`~workbench.engine.packed.batch.PackedBatch` (pages, pools, the launched
forward), the :class:`~workbench.engine.packed.ledger.PageLedger`, the packed pacer. Must not
know: the queue's order, admission's policy, how a read token ends a row.

One request's path: the scheduler :meth:`~PackedLayout.start` s it (it enters the batch at
once, ``PREFILLING``, with its pages) -> each :meth:`~PackedLayout.step` plans one forward
(:meth:`PackedBatch.plan`: every running row's next token, then prefill chunks of joining
rows up to ``token_budget``) and launches it; a joining row whose chunk ends its inputs
joins (``join`` event, mode ``"packed"``) with its first token. With ``pipeline``, the next
forward is built from this one's unread tokens and started as soon as they are read. With
``speculative``, each running row's drafts ride in the same forward as more of its tokens
(:meth:`~PackedLayout._step_speculative`, :mod:`workbench.engine.packed.verify`).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from functools import partial
from types import SimpleNamespace
from typing import Any

import mlx.core as mx

from ...observe.events import Event
from ...observe.packed import DECODE
from ...observe.recorder import Recorder
from ..config import SchedulerConfig
from ..forward import Forward, ForwardLevers, Pending, row_context, sample_pending
from ..kv import caches as kv
from ..kv.ledger import KVLedger
from ..levers import speculative
from ..levers.invariant_packed import paged_row_attention
from ..levers.pacing import pacing_from
from ..levers.packed_pacing import PackedPacer
from ..levers.quantized_attention import dequantized_attention
from ..packed import families, verify
from ..packed.adapters import check_bank, selected_tokens
from ..packed.batch import PackedBatch
from ..packed.ledger import PageLedger
from ..packed.quantized_pages import QuantizedPackedBatch
from ..state import RequestState, Status
from .layout import NON_FINITE, Layout, Read, speculation_of


class PackedLayout(Layout):
    """The packed layout of one scheduler (see the module docstring).

    Args:
        model: the mlx-lm model (a llama-family one: :func:`check`). config: the settings.
        recipe: the :class:`~workbench.engine.kv.caches.CacheRecipe` (bytes per token).
        prompt_cache: an int: prefix caching, at most that many unreferenced pages kept.
        adapters: the :class:`~workbench.engine.levers.lora.AdapterBank` (each token runs its
        request's adapter: :mod:`workbench.engine.packed.adapters`). quant: the
        :class:`~workbench.engine.levers.quantized_kv.KVQuant` (quantized pages:
        :mod:`workbench.engine.packed.quantized_pages`). invariance: the batch-invariant mode
        (every token runs the mode's per-row path: :mod:`workbench.engine.levers.invariant_packed`).
        vocab_size: a draft model must have ``vocab_size`` outputs.

    Raises:
        ValueError: what :func:`~workbench.engine.levers.pacing.pacing_from` and
            :func:`~workbench.engine.levers.speculative.configure` raise.
    """

    packed = True

    def __init__(
        self,
        model: Any,
        config: SchedulerConfig,
        recipe: kv.CacheRecipe,
        adapters: Any = None,
        invariance: Any = None,
        quant: Any = None,
        prompt_cache: Any = None,
        vocab_size: int = 0,
    ):
        cfg = self.config = config
        self.model, self.invariance = model, invariance
        check_bank(adapters)  # adapters on the decoder layers only
        self.adapters, self.quant = adapters, quant
        self.speculation = speculation_of(model, cfg, vocab_size)
        self.pacing = pacing_from(cfg.pacing)
        self.pacer = None if self.pacing is None else PackedPacer(self.pacing, cfg.token_budget)
        self.page_bytes = cfg.page_size * KVLedger(recipe.profile(), cfg).base.full_token_bytes
        self.ledger = PageLedger(cfg.page_size, self.page_bytes, cfg)
        self._cached_pages = prompt_cache

    @property
    def levers(self) -> ForwardLevers:
        """Every lever this layout's forwards take (:meth:`ForwardLevers.applied`): each
        token its request's adapter, the invariant mode's projections; the pages attend by
        themselves (quantized, or each token alone, as :meth:`new_batch` made them)."""
        return ForwardLevers(self.model, self.adapters, self.invariance, select_tokens=selected_tokens)

    @staticmethod
    def check(model: Any, config: SchedulerConfig, prompt_cache: Any, adapters: Any) -> None:
        """Refuse a model or settings the packed layout cannot run, by name
        (:mod:`workbench.engine.packed.families`)."""
        families.check_model(model)
        families.check_settings(config, prompt_cache, adapters)

    def new_batch(self) -> PackedBatch:
        """An empty :class:`PackedBatch`: pages of ``page_size`` positions,
        ``page_size * full_token_bytes`` bytes each, at most ``kv_budget_bytes`` of them."""
        cfg = self.config
        args = (
            cfg.page_size,
            self.page_bytes,
            len(self.model.model.layers),
            None if cfg.kv_budget_bytes is None else cfg.kv_budget_bytes // self.page_bytes,
            self._cached_pages,
        )
        if self.quant is not None:  # pages held quantized
            attention = (
                dequantized_attention if self.quant.attention == "dequantize" else None
            )  # None: mlx-lm's
            return QuantizedPackedBatch(
                *args, quant=self.quant, prefill_step_size=cfg.prefill_step_size, attention=attention
            )
        return PackedBatch(
            *args,
            decode_kernel=False if cfg.fast_decode is False or self.invariance else None,  # False: MLX ops
            token_attention=None if self.invariance is None else paged_row_attention,  # each token alone
        )

    def prompt_cache(self) -> None:
        """None: the packed layout's prompt cache is pages of its batch."""
        return None

    def start(self, st: Any, chosen: Sequence[RequestState]) -> None:
        """The chosen rows enter the batch (their prefill runs in :meth:`step`)."""
        st.batch.add(chosen)

    def admit(self, st: Any, recorder: Recorder) -> Iterator[int | None]:
        """Asks for one group; joiners enter the batch and prefill in ``step()``."""
        yield None

    def preemptable(self, status: Status) -> bool:
        """Running rows and rows still prefilling (they hold pages)."""
        return status in (Status.RUNNING, Status.PREFILLING)

    def snapshot_fields(self, st: Any) -> dict[str, Any]:
        """``packed``: the batch's pages and last forward."""
        return {"packed": st.batch.state(self.config.token_budget)}

    def step(self, st: Any, recorder: Recorder) -> Generator[Read | Event, None, bool]:
        """One packed forward's tokens (see the module docstring); returns False when
        nothing was planned."""
        if self.speculation is not None:
            return (yield from self._step_speculative(st, recorder))
        batch, cfg = st.batch, self.config
        current = batch.launched
        if current is None:
            current = self._launch(st, recorder)
            if current is None:
                return False
            mx.async_eval(*current.outputs)
        carried = batch.carried(current)  # the rows are the same until the reads are taken
        nxt = self._launch(st, recorder, current, carried) if cfg.pipeline and current.uids else None
        read = current.pending.read() if current.pending is not None else mx.eval(*current.outputs)
        if self.pacer is not None:  # the forward's measured time; the next one's starts now
            read_s = recorder.clock()
            self.pacer.observe(current.paced, read_s)
            if nxt is not None:
                nxt.paced = self.pacer.started(nxt.paced, read_s)
        if nxt is not None:
            mx.async_eval(*nxt.outputs)  # after the read: the pools are written in place then
        batch.launched = nxt
        yield from self._read(st, current, read, recorder, carried)
        batch.after_read(nxt)  # each row's held tokens and ``fed`` set
        batch.last_chunks, batch.last_paced = current.chunks, current.paced
        return True

    def _launch(self, st: Any, recorder: Recorder, after: Any = None, unread: dict | None = None) -> Any:
        """Build the next packed forward and its sampling (lazy: not started), or ``None``
        when nothing is planned. ``after``: a launched forward whose tokens are unread; the
        next one counts them as known and feeds them, and is built only when it carries
        decode tokens alone (a joiner admitted meanwhile waits one forward). ``unread``:
        ``batch.carried(after)`` when the caller has it."""
        batch, cfg = st.batch, self.config
        if unread is None:  # rows that left since ``after`` was built take none of its tokens
            unread = batch.carried(after)
        chunks = batch.plan(cfg.token_budget, cfg.packed_schedule, unread)
        if not chunks or (after is not None and any([c.kind != DECODE for c in chunks])):
            return None
        paced = None
        if self.pacer is not None:  # prefill tokens capped to the time budget
            plan = partial(batch.plan, schedule=cfg.packed_schedule, unread=unread)
            paced = self.pacer.choose(plan, chunks, recorder.clock())
            chunks = paced.chunks

        def sample(logits: mx.array, sampled: list[int]) -> Pending:
            rows = [batch.rows[b] for b in sampled]
            at = [unread[r.uid] if r.uid in unread else None for r in rows]  # its row in ``after``
            contexts = [
                row_context(r, None if i is None else after.pending, i or 0) for r, i in zip(rows, at)
            ]
            index = [len(r.tokens) + (i is not None) for r, i in zip(rows, at)]
            return sample_pending(logits, [r.sampler for r in rows], contexts, index, asynchronous=None)

        adapter_of = {r.uid: r.valid.request.adapter for r in batch.rows}
        with self.levers.applied(Forward.of_chunks(chunks, adapter_of)):  # each token its request's adapter
            launched = batch.launch(self.model, chunks, sample, after, unread)
        launched.paced = paced
        return launched

    def _read(
        self, st: Any, current: Any, read: tuple | None, recorder: Recorder, carried: dict[int, int]
    ) -> Iterator[Read]:
        """The reads of a read packed forward: ``prefill`` per prefill chunk (logged), then
        per sampling row (``join`` logged for a joiner) its token, or its error. Rows that
        left the batch or finished since it was launched are skipped, and so is a uid admitted
        again since (preempted, then re-queued and admitted: ``carried``, its
        :meth:`PackedBatch.carried`)."""
        batch = st.batch
        for c in current.chunks:
            if c.kind != DECODE:
                recorder.log("prefill", c.uid, st.step_index, n_tokens=c.n_tokens)
        if read is None:
            return
        toks, lps, finite = read
        tops = current.pending.read_top()
        errors = current.pending.errors
        rows = {r.uid: b for b, r in enumerate(batch.rows)}
        finished, prefilling = Status.FINISHED, Status.PREFILLING
        for i, uid in enumerate(current.uids):
            if uid not in carried:
                continue
            b = rows[uid]
            row = batch.rows[b]
            if row.status is finished:
                continue
            if row.status is prefilling:
                _join(st, row, b, recorder)
            message = (errors.get(i) if errors else None) or ("" if finite[i] else NON_FINITE)
            yield Read(row, b, toks[i], lps[i], message, tops.get(i, ()) if tops else ())

    def _step_speculative(self, st: Any, recorder: Recorder) -> Generator[Read | Event, None, bool]:
        """``step()`` with speculation: one ``[1, T]`` forward carries every running row's
        latest token and its drafts (:meth:`_plan_speculative`) beside the prefill chunks that
        fit; :func:`~workbench.engine.levers.speculative.decide` chooses each sampling row's
        tokens (a joiner's first one as without speculation); per row a ``draft`` event, its
        accepted drafts and its next token are read, then its pages keep its latest token and
        the drafts it accepted (:func:`_keep_accepted`). Not pipelined: drafting reads the
        tokens. Returns False when nothing was planned."""
        batch, spec = st.batch, self.speculation
        running, drafting, drafts, chunks, paced = self._plan_speculative(st, recorder)
        held = dict(zip((r.uid for r in batch.rows), batch.held))
        verified, groups = None, []
        if chunks:
            rows = {r.uid: r for r in batch.rows}
            adapter_of = {r.uid: r.valid.request.adapter for r in batch.rows}
            with self.levers.applied(Forward.of_chunks(chunks, adapter_of, drafts)):
                logits = batch.forward(self.model, chunks, tokens=verify.forward_tokens(rows, chunks, drafts))
            groups = verify.sampling_groups(batch.sampled)
            sampling = [batch.rows[b] for b, _ in groups]
            if groups:
                verified = speculative.decide(
                    verify.position_logits(logits, groups),
                    [drafts.get(r.uid, []) for r in sampling],
                    [r.sampler for r in sampling],
                    [row_context(r, None, 0) for r in sampling],
                    [len(r.tokens) for r in sampling],
                )
            else:  # prefill chunks alone: their writes
                mx.eval([a for a in batch.pools.keys + batch.pools.values if a is not None])
            if self.pacer is not None:
                self.pacer.observe(paced, recorder.clock())
        if spec.draft is not None:  # the draft model's caches keep the drafts each row accepted
            accepted = {} if verified is None else dict(zip((r.uid for r in sampling), verified.accepted))
            spec.draft.settle(drafting, [accepted.get(r.uid, 0) for r in running])
        if not chunks:
            return False
        for c in chunks:
            if c.kind != DECODE:
                recorder.log("prefill", c.uid, st.step_index, n_tokens=c.n_tokens)
        if verified is not None:
            yield from _verified_reads(st, batch, groups, verified, recorder)
            _keep_accepted(batch, groups, verified, held)
        batch.after_read(None)  # each row's held tokens and ``fed`` set
        batch.last_chunks, batch.last_paced = verify.observed_chunks(chunks), paced
        return True

    def _plan_speculative(self, st: Any, recorder: Recorder) -> tuple:
        """``(running rows, their drafting view, uid -> drafts, chunks, paced)`` of a
        speculative step: each running row drafts
        (:func:`~workbench.engine.levers.speculative.propose`; a draft model's caches follow
        these rows in ``PackedBatch.draft``), the drafts cut to the token budget
        (:func:`~workbench.engine.packed.verify.cap_drafts`), each a one-token decode chunk
        after its row's (:func:`~workbench.engine.packed.verify.verify_chunks`); with pacing
        the pacer's cap; a row the schedule stalls keeps no drafts."""
        batch, cfg = st.batch, self.config
        running = [r for r in batch.rows if r.status is Status.RUNNING and not r.finished]
        drafting = SimpleNamespace(rows=running, draft=batch.draft)
        proposed = verify.cap_drafts(
            speculative.propose(self.speculation, drafting), cfg.token_budget - len(running)
        )
        batch.draft = drafting.draft
        drafts = {r.uid: d for r, d in zip(running, proposed)}
        extra = sum(map(len, proposed))

        def plan(budget: int) -> tuple:
            return verify.verify_chunks(batch.plan(budget - extra, cfg.packed_schedule), drafts)

        chunks, paced = plan(cfg.token_budget), None
        if self.pacer is not None and chunks:
            paced = self.pacer.choose(plan, chunks, recorder.clock())
            chunks = paced.chunks
        fed = {c.uid for c in chunks if c.kind == DECODE}
        return running, drafting, {u: d if u in fed else [] for u, d in drafts.items()}, chunks, paced


def _keep_accepted(batch: Any, groups: Sequence[tuple[int, int]], verified: Any, held: dict) -> None:
    """After the reads: each verifying row of ``groups`` keeps in its pages its latest token
    and the drafts it accepted (at most its known tokens: a row that finished inside them),
    the pages of rejected drafts freed (:func:`~workbench.engine.packed.verify.truncate`);
    with prefix caching its full pages of accepted tokens are indexed. ``held``: uid -> its
    tokens in pages before the forward."""
    for g, (b, n) in enumerate(groups):
        row = batch.rows[b]
        if n > 1:
            keep = min(held[row.uid] + 1 + verified.accepted[g], row.n_inputs)
            verify.truncate(batch, b, keep)
            if batch.table.index is not None:
                batch.table.register(row.uid, row.inputs, held[row.uid], keep)


def _verified_reads(
    st: Any, batch: Any, groups: Sequence[tuple[int, int]], verified: Any, recorder: Recorder
) -> Iterator[Read | Event]:
    """Per sampling row ``(b, positions)`` of ``groups``: its ``join`` (a joiner), its
    ``draft`` event (a drafting row), then the reads of its accepted drafts and of its next
    token (:class:`~workbench.engine.levers.speculative.Verified`), up to where it finishes."""
    toks, lps, finite = verified.pending.read()
    tops = verified.pending.read_top()
    for g, (b, _) in enumerate(groups):
        row = batch.rows[b]
        _join(st, row, b, recorder)
        if verified.drafted[g]:
            n, a = verified.drafted[g], verified.accepted[g]
            yield recorder.log("draft", row.uid, st.step_index, row=b, n_tokens=n, n_accepted=a)
        reads = [Read(row, b, t, lp, "") for t, lp in zip(verified.tokens[g], verified.logprobs[g])]
        message = verified.pending.errors.get(g) or ("" if finite[g] else NON_FINITE)
        for read in [*reads, Read(row, b, toks[g], lps[g], message, tops.get(g, ()))]:
            if not row.finished:
                yield read


def _join(st: Any, row: RequestState, b: int, recorder: Recorder) -> None:
    """A joining row that sampled its first token runs from now on (``join`` event, mode
    ``"packed"``); nothing for a running row."""
    if row.status is Status.PREFILLING:
        row.status, row.join_order, st.joins = Status.RUNNING, st.joins, st.joins + 1
        n = len(row.valid.prompt_ids)
        recorder.log("join", row.uid, st.step_index, row=b, n_tokens=n, join_mode="packed")
