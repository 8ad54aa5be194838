"""The KV books of the packed layout, in pages: bytes held, the projection admission
checks against ``kv_budget_bytes``, and refusals at ``submit``.

Knows: the page size and bytes, request states' token counts. Must not know: the policy, MLX.

A request reserves the pages of everything it may hold, ``ceil((prompt + max_tokens) /
page_size)``, from admission until ``filter()`` evicts it (a finished row: the pages it
holds). So a step never runs out of pages and never preempts mid-forward; the pages it
actually holds (``PackedBatch.kv_bytes``) grow one at a time as its tokens arrive::

    projected = page_bytes * (sum over rows kept of their reserve + sum over joiners)
    held      = page_bytes * pages handed out            <= projected <= kv_budget_bytes
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..kv.allocation import RowTokens
from ..kv.ledger import Held


@dataclass(frozen=True)
class PagePlan:
    """The batch's reserved pages at one admission decision (the duck type of
    :class:`workbench.engine.kv.allocation.KVPlan` that admission reads).

    Attributes:
        page_size: positions per page. page_bytes: bytes of one page.
        rows: ``(uid, reserved pages)`` of each row in the batch.
    """

    page_size: int
    page_bytes: int
    rows: tuple[tuple[int, int], ...] = ()

    def pages(self, tokens: int) -> int:
        """Pages for ``tokens`` positions."""
        return -(-max(tokens, 0) // self.page_size)

    def projected_bytes(
        self, joiners: Sequence[RowTokens] = (), dropped: Sequence[int] = (), started: bool = False
    ) -> int:
        """Bytes reserved by the rows not in ``dropped`` plus ``joiners`` (their
        ``final_tokens``). ``started`` is accepted for :class:`KVPlan`'s signature."""
        kept = sum(n for uid, n in self.rows if uid not in set(dropped))
        return self.page_bytes * (kept + sum(self.pages(j.final_tokens) for j in joiners))


class PageLedger:
    """The packed scheduler's byte books (the interface of
    :class:`workbench.engine.kv.ledger.KVLedger`).

    Args:
        page_size: positions per page. page_bytes: bytes of one page over all layers.
        config: the scheduler's settings (``kv_budget_bytes``).
    """

    def __init__(self, page_size: int, page_bytes: int, config: Any):
        self.page_size, self.page_bytes, self.config = page_size, page_bytes, config

    def _reserve(self, s: Any, held_pages: int) -> int:
        if s.finished:
            return held_pages
        return -(-(len(s.valid.prompt_ids) + s.valid.request.max_tokens) // self.page_size)

    def plan(self, st: Any) -> PagePlan:
        """The :class:`PagePlan` of engine state ``st`` (its batch's rows) now."""
        table = st.batch.table
        return PagePlan(
            self.page_size,
            self.page_bytes,
            tuple((r.uid, self._reserve(r, len(table.pages.get(r.uid, [])))) for r in st.batch.rows),
        )

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
        """Bytes held now: the pages handed out (no prefilling group, no prompt cache)."""
        return Held(st.batch.kv_bytes, 0, 0)

    def make_room(self, st: Any, joiners: Sequence[Any] = (), dropped: Sequence[int] = ()) -> int:
        """Nothing to trim (no prompt cache in the packed layout). Returns 0."""
        return 0
