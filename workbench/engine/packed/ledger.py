"""The KV books of the packed layout, in pages: bytes held, the projection admission
checks against ``kv_budget_bytes``, and refusals at ``submit``. No MLX.

A request reserves the pages of everything it may hold, ``ceil((prompt + max_tokens) /
page_size)``, from admission until ``filter()`` evicts it, so a step never runs out of pages
and never preempts mid-forward. A page several requests share counts once::

    projected = page_bytes * (|pages held by rows kept  U  pages joiners find cached|
                              + sum over rows kept of (reserve - pages held)
                              + sum over joiners of (reserve - pages found cached))
    held      = page_bytes * distinct pages handed out      <= projected <= kv_budget_bytes

Copies of shared pages and cached pages: ``docs/lab/engine-notes.md``, "packed/ledger.py".
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..kv.allocation import RowTokens
from ..kv.ledger import Held
from ..siblings import shared_rows
from ..state import Status


@dataclass(frozen=True)
class PagePlan:
    """The batch's reserved pages at one admission decision (the duck type of
    :class:`workbench.engine.kv.allocation.KVPlan` that admission reads).

    Attributes:
        page_size: positions per page. page_bytes: bytes of one page.
        rows: ``(uid, reserved pages)`` of each row in the batch.
        held: ``(uid, pages held)`` of each row (``()``: none shared).
        joining: joiners -> ``(pages shared, pages added)`` (``None``: their ``final_tokens``' pages).
    """

    page_size: int
    page_bytes: int
    rows: tuple[tuple[int, int], ...] = ()
    held: tuple[tuple[int, tuple[int, ...]], ...] = ()
    joining: Callable[[Sequence[RowTokens]], tuple[set[int], int]] | None = field(default=None, compare=False)

    def idle(self) -> "PagePlan":
        """This plan with no row in the batch (:meth:`KVPlan.idle`'s counterpart)."""
        return dataclasses.replace(self, rows=(), held=())

    def pages(self, tokens: int) -> int:
        """Pages for ``tokens`` positions."""
        return -(-max(tokens, 0) // self.page_size)

    def projected_bytes(
        self, joiners: Sequence[RowTokens] = (), dropped: Sequence[int] = (), started: bool = False
    ) -> int:
        """Bytes reserved by the rows not in ``dropped`` plus ``joiners``, a shared page once."""
        gone = set(dropped)
        held = {uid: pages for uid, pages in self.held if uid not in gone}
        distinct = {p for pages in held.values() for p in pages}
        have = dict(zip(held, map(len, held.values())))  # uid -> its pages, counted by one map
        future = sum([n - (have[uid] if uid in have else 0) for uid, n in self.rows if uid not in gone])
        if self.joining is not None and joiners:
            shared, added = self.joining(joiners)
            distinct |= shared
            future += added
        else:
            future += sum(self.pages(j.final_tokens) for j in joiners)
        return self.page_bytes * (len(distinct) + future)


class PageLedger:
    """The packed scheduler's byte books (the interface of
    :class:`workbench.engine.kv.ledger.KVLedger`).

    Args:
        page_size: positions per page. page_bytes: bytes of one page over all layers.
        config: the scheduler's settings (``kv_budget_bytes``).
    """

    def __init__(self, page_size: int, page_bytes: int, config: Any):
        self.page_size, self.page_bytes, self.config = page_size, page_bytes, config

    def _pages(self, tokens: int) -> int:
        return -(-max(tokens, 0) // self.page_size)

    def _final(self, s: Any) -> int:
        return self._pages(len(s.valid.prompt_ids) + s.valid.request.max_tokens)

    def _follower(self, s: Any) -> int:
        """Pages a ``submit_n`` follower adds to its leader's."""
        return self._final(s) - self._pages(len(s.inputs)) + bool(len(s.inputs) % self.page_size)

    def _reserve(self, s: Any, pages: Sequence[int], held: int, st: Any) -> int:
        """Pages row ``s`` (holding ``pages``, ``held`` tokens) may hold in all."""
        batch = st.batch
        if s.finished:
            return len(pages)
        if s.uid in batch.follows:
            return self._follower(s)
        copy = s.uid in batch.follows.values() and len(s.inputs) % self.page_size  # its followers will share
        copy = copy or (held % self.page_size and batch.table.refs.get(pages[-1], 0) > 1)
        return max(self._final(s), len(pages)) + bool(copy)

    def _joining(self, st: Any) -> Callable[[Sequence[RowTokens]], tuple[set[int], int]]:
        """What joiners would add to ``st``'s batch (cached prefixes, followers)."""
        table, found = st.batch.table, {}

        def joining(joiners: Sequence[RowTokens]) -> tuple[set[int], int]:
            states = [st.requests[j.uid] for j in joiners]
            leaders = shared_rows(states)
            led, shared, added = Counter(leaders), set(), 0
            for b, s in enumerate(states):
                if leaders[b] != b:
                    added += self._follower(s)
                    continue
                if s.uid not in found:
                    found[s.uid] = table.match(s.inputs)
                shared.update(found[s.uid])
                copy = led[b] > 1 and len(s.inputs) % self.page_size
                added += self._final(s) - len(found[s.uid]) + bool(copy)
            return shared, added

        return joining

    def plan(self, st: Any, held_prompts: bool = True, prompt_cache: bool = True) -> PagePlan:
        """The :class:`PagePlan` of engine state ``st`` now (the flags: ``KVLedger``'s signature)."""
        batch = st.batch
        table, P, refs, follows = batch.table.pages, self.page_size, batch.table.refs, batch.follows
        held = tuple([(r.uid, tuple(table[r.uid]) if r.uid in table else ()) for r in batch.rows])
        finished, prompts = Status.FINISHED, map(len, [r.valid.prompt_ids for r in batch.rows])
        final = [-(-(p + r.valid.request.max_tokens) // P) for r, p in zip(batch.rows, prompts)]
        rows = tuple(
            [
                (
                    r.uid,
                    self._reserve(r, pages, h, st)
                    if follows
                    or r.status is finished
                    or (h % P and pages[-1] in refs and refs[pages[-1]] > 1)
                    else f
                    if f > n
                    else n,
                )  # the common row (no follower, no shared last page): _reserve's last line
                for r, (_, pages), h, f, n in zip(
                    batch.rows, held, batch.held, final, map(len, [p for _, p in held]), strict=True
                )
            ]
        )
        return PagePlan(self.page_size, self.page_bytes, rows, held, self._joining(st))

    def projected_bytes(self, st: Any) -> int:
        """Bytes the batch's rows reserve now (0 when idle)."""
        return self.plan(st).projected_bytes()

    def alone_bytes(self, prompt_tokens: int, max_tokens: int) -> int:
        """Bytes one request reserves: ``ceil((prompt + max_tokens) / page_size)`` pages."""
        return PagePlan(self.page_size, self.page_bytes).projected_bytes(
            [RowTokens(-1, prompt_tokens, prompt_tokens + max_tokens)]
        )

    def refusal(self, prompt_tokens: int, max_tokens: int) -> str:
        """Why a request can never be admitted under the budget (``""`` when it can)."""
        need, budget = self.alone_bytes(prompt_tokens, max_tokens), self.config.kv_budget_bytes
        if budget is None or need <= budget:
            return ""
        return (
            f"request reserves {need:,} KV bytes ({need // self.page_bytes} pages of {self.page_size} tokens for "
            f"prompt {prompt_tokens} + max_tokens {max_tokens}) but kv_budget_bytes is {budget:,}; "
            "it could never be admitted"
        )

    def held(self, st: Any) -> Held:
        """Bytes held now (cached pages no request holds as the prompt cache's)."""
        return Held(st.batch.kv_bytes, 0, st.batch.cached_bytes)

    def make_room(self, st: Any, joiners: Sequence[Any] = (), dropped: Sequence[int] = ()) -> int:
        """Nothing to trim (cached pages are evicted as pages are taken). Returns 0."""
        return 0
