"""The page table: fixed-size pages of KV positions, a free list, and each request's pages.

Knows: page ids and token counts only (no MLX). Must not know: the model, the pools.

A request's position ``p`` lives in page ``pages[uid][p // page_size]`` at slot
``page * page_size + p % page_size`` of every layer's pool. A freed page goes to the
front of the free list, so the next request that needs one reuses it at once (no left
padding, no growth step). Mirrors vLLM's ``BlockManager`` / nano-vllm's
``BlockManager.allocate / deallocate`` without prefix sharing.

Example (page_size 4)::

    t = PageTable(4); t.reserve(0, 6); t.reserve(1, 3)   # uid 0: pages [0, 1]; uid 1: [2]
    t.slots(0, 4, 6) -> [4, 5]; t.free(0); t.reserve(2, 1) -> uid 2 gets page 0 (freed, reused at once)
"""

from __future__ import annotations

import math
from collections.abc import Sequence


class PageTable:
    """Pages per request and the free list.

    Args:
        page_size: token positions per page (``>= 1``).

    Attributes:
        pages: uid -> its page ids, in position order.
        free_list: page ids free for reuse, the next handed out first.
        capacity: pages ever created (``max page id + 1``); grows only when the free
            list is empty.
    """

    def __init__(self, page_size: int):
        self.page_size = int(page_size)
        self.pages: dict[int, list[int]] = {}
        self.free_list: list[int] = []
        self.capacity = 0

    def pages_for(self, tokens: int) -> int:
        """Pages that hold ``tokens`` positions: ``ceil(tokens / page_size)``."""
        return math.ceil(max(tokens, 0) / self.page_size)

    @property
    def used(self) -> int:
        """Pages held by requests."""
        return sum(len(p) for p in self.pages.values())

    def reserve(self, uid: int, tokens: int) -> list[int]:
        """Give ``uid`` pages for ``tokens`` positions in all (taking free pages first,
        then new ones). Returns the pages added."""
        have = self.pages.setdefault(uid, [])
        added = []
        for _ in range(self.pages_for(tokens) - len(have)):
            if self.free_list:
                added.append(self.free_list.pop(0))
            else:
                added.append(self.capacity)
                self.capacity += 1
        have.extend(added)
        return added

    def free(self, uid: int) -> list[int]:
        """Return ``uid``'s pages to the front of the free list (in its page order).
        Returns them; a uid holding none frees nothing."""
        gone = self.pages.pop(uid, [])
        self.free_list[:0] = gone
        return gone

    def slots(self, uid: int, start: int, end: int) -> list[int]:
        """Pool slots of ``uid``'s positions ``start .. end - 1``.

        Raises:
            ValueError: a position beyond its pages.
        """
        pages, P = self.pages.get(uid, []), self.page_size
        if end > len(pages) * P:
            raise ValueError(f"uid {uid}: positions up to {end - 1} but only {len(pages)} page(s) of {P}")
        return [pages[p // P] * P + p % P for p in range(start, end)]

    def gather_slots(self, spans: Sequence[tuple[int, int]]) -> list[int]:
        """Pool slots of each ``(uid, end)``'s positions ``0 .. end - 1``, concatenated."""
        return [s for uid, end in spans for s in self.slots(uid, 0, end)]

    def clone(self) -> "PageTable":
        """An independent copy."""
        out = PageTable(self.page_size)
        out.pages = {u: list(p) for u, p in self.pages.items()}
        out.free_list, out.capacity = list(self.free_list), self.capacity
        return out
