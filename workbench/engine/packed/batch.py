"""The packed batch: the requests in flight (joining and running), their tokens in pages,
and the pools, changed together.

Knows: request states (:class:`workbench.engine.state.RequestState`), the page table,
the pools, the packed forward. Must not know: the queue, admission, events.

Each request of the batch has *known* tokens (its inputs: prompt plus generated) of
which ``held`` are in its pages. A joining row (PREFILLING) has many unheld tokens, a
running row exactly one (its latest token, fed by the next forward). The read-only
surface the scheduler and snapshots share with :class:`workbench.engine.batch.Batch`
(``rows``, ``caches``, ``view``, ``pending``, ``free``, ``fast_path``, ``kv_bytes``,
``filter``, ``compact``, ``clone``) keeps one scheduler loop for both layouts.

Axis letters: ``B`` requests in the batch (row order = arrival in the batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from ...observe.packed import Chunk, PackedState
from ..state import RequestState, Status
from .attention import Pools, packed_forward
from .pages import PageTable
from .plan import Want, plan_chunks

GROWTH = 8  # the pools grow by at least 1/GROWTH of their pages (or what is needed)


class PackedBatch:
    """Requests in flight in the packed layout.

    Args:
        page_size: token positions per page. page_bytes: bytes of one page over all
            layers (keys and values). n_layers: the model's layers.
        max_pages: most pages the pools may allocate (``kv_budget_bytes // page_bytes``;
            ``None``: no limit).

    Attributes:
        rows: request states in row order. held: ``[B]`` tokens in each row's pages.
        table: the :class:`PageTable`. pools: the :class:`Pools`.
        last_chunks: the chunks of the latest packed forward.
    """

    fast_path = "packed"
    caches = None  # no mlx-lm batch cache: the pools hold the KV
    view = None
    pending = None
    free: tuple[int, ...] = ()  # no free slots: a freed page returns to the free list at once

    def __init__(self, page_size: int, page_bytes: int, n_layers: int, max_pages: int | None = None):
        self.page_size, self.page_bytes, self.n_layers, self.max_pages = (
            page_size,
            page_bytes,
            n_layers,
            max_pages,
        )
        self.rows: list[RequestState] = []
        self.held: list[int] = []
        self.table = PageTable(page_size)
        self.pools = Pools(n_layers)
        self.last_chunks: tuple[Chunk, ...] = ()

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def kv_bytes(self) -> int:
        """Bytes the requests' pages hold: ``used pages * page_bytes``."""
        return self.table.used * self.page_bytes

    @property
    def pool_bytes(self) -> int:
        """Bytes the pools allocate: ``capacity pages * page_bytes`` (free pages included)."""
        return self.pools.slots // self.page_size * self.page_bytes

    def add(self, states: Sequence[RequestState]) -> None:
        """Append joining rows (nothing of them in pages yet)."""
        self.rows += list(states)
        self.held += [0] * len(states)

    def wants(self) -> list[Want]:
        """Each unfinished row's work (:class:`Want`), row order."""
        return [
            Want(r.uid, h, len(r.inputs), r.status is Status.RUNNING)
            for r, h in zip(self.rows, self.held, strict=True)
            if not r.finished
        ]

    def plan(self, budget: int, schedule: str = "hybrid") -> tuple[Chunk, ...]:
        """The next forward's chunks (:func:`workbench.engine.packed.plan.plan_chunks`)."""
        return plan_chunks(self.wants(), budget, schedule)

    def forward(self, model: Any, chunks: Sequence[Chunk]) -> mx.array:
        """Reserve the chunks' pages (growing the pools by at least 1/8 when the free list
        runs out), run the packed forward, count the chunks' tokens as held. Returns the
        logits ``[R, V]`` of the sampling chunks, in chunk order."""
        by_uid = {r.uid: b for b, r in enumerate(self.rows)}
        for c in chunks:
            self.table.reserve(c.uid, c.end)
        have = self.pools.slots // self.page_size
        if self.table.capacity > have:
            grown = max(self.table.capacity, have + math.ceil(have / GROWTH))
            self.pools.slots = min(grown, max(self.max_pages or grown, self.table.capacity)) * self.page_size
        tokens = [t for c in chunks for t in self.rows[by_uid[c.uid]].inputs[c.start : c.end]]
        logits = packed_forward(model, self.pools, self.table, chunks, tokens)
        for c in chunks:
            self.held[by_uid[c.uid]] = c.end
        self.last_chunks = tuple(chunks)
        return logits

    def settle(self) -> None:
        """Evaluate the pools (a forward whose logits nobody reads still wrote them)."""
        mx.eval([a for a in self.pools.keys + self.pools.values if a is not None])

    def filter(self, keep: Sequence[int], reuse_slots: bool | None = None) -> None:
        """Keep only rows ``keep`` (sorted row indices); the others' pages go back to the
        free list at once (``reuse_slots`` has no meaning here)."""
        keep = set(keep)
        for b, r in enumerate(self.rows):
            if b not in keep:
                self.table.free(r.uid)
        self.rows = [r for b, r in enumerate(self.rows) if b in keep]
        self.held = [h for b, h in enumerate(self.held) if b in keep]

    def compact(self) -> bool:
        """Nothing to compact (no free slots). Returns False."""
        return False

    def clone(
        self, state_of: Callable[[RequestState], RequestState], share_appended: bool = False
    ) -> "PackedBatch":
        """An independent copy (page table copied; pools as :meth:`Pools.clone` with
        ``share=share_appended``); ``state_of`` maps each row's state to the copy's."""
        out = PackedBatch(self.page_size, self.page_bytes, self.n_layers, self.max_pages)
        out.rows, out.held = [state_of(r) for r in self.rows], list(self.held)
        out.table, out.pools, out.last_chunks = (
            self.table.clone(),
            self.pools.clone(share_appended),
            self.last_chunks,
        )
        return out

    def state(self, token_budget: int) -> PackedState:
        """The frozen :class:`PackedState` now."""
        held = dict(zip((r.uid for r in self.rows), self.held, strict=True))
        pages = tuple((r.uid, tuple(self.table.pages[r.uid])) for r in self.rows if r.uid in self.table.pages)
        return PackedState(
            self.page_size,
            self.page_bytes,
            self.pools.slots // self.page_size,
            pages,
            tuple(self.table.free_list),
            tuple((u, held[u]) for u, _ in pages),
            self.last_chunks,
            token_budget,
        )

    def problems(self) -> list[str]:
        """What disagrees in the books: a row's pages against its held tokens, a page held
        twice or both held and free, pools smaller than the pages handed out."""
        out = []
        seen: list[int] = []
        for r, h in zip(self.rows, self.held, strict=True):
            n = len(self.table.pages.get(r.uid, []))
            if n < self.table.pages_for(h) or h > len(r.inputs):
                out.append(
                    f"uid {r.uid}: {h} tokens held, {len(r.inputs)} known, in {n} page(s) of {self.page_size}"
                )
            seen += self.table.pages.get(r.uid, [])
        if set(self.table.pages) - {r.uid for r in self.rows}:
            out.append(
                f"pages held by uids not in the batch: {sorted(set(self.table.pages) - {r.uid for r in self.rows})}"
            )
        if len(seen) != len(set(seen)) or set(seen) & set(self.table.free_list):
            out.append("a page is held twice, or held and free")
        if self.table.capacity * self.page_size > self.pools.slots and self.pools.keys[0] is not None:
            out.append(f"{self.table.capacity} pages handed out, pools of {self.pools.slots} slots")
        return out
