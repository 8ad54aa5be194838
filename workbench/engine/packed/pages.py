"""The page table: fixed-size pages of KV positions, a free list, each request's pages,
and (with prefix caching) pages shared by requests and cached after them. No MLX.

A request's position ``p`` lives in page ``pages[uid][p // page_size]`` at slot
``page * page_size + p % page_size`` of every layer's pool; a freed page is reused first.
Mirrors vLLM's ``BlockManager`` / nano-vllm's ``BlockManager.allocate / deallocate``; prefix
caching (``cache_pages``) is vLLM's automatic prefix caching (life cycle:
``docs/lab/engine-notes.md``, "packed/pages.py").

Example (page_size 4)::

    t = PageTable(4); t.reserve(0, 6); t.reserve(1, 3)   # uid 0: pages [0, 1]; uid 1: [2]
    t.slots(0, 4, 6) -> [4, 5]; t.free(0); t.reserve(2, 1) -> uid 2 gets page 0 (freed, reused at once)
    t.fork(1, 3); t.refs[2] -> 2; t.copy_on_write(3, 3, 4) -> [(2, 1)]   # uid 3 writes into a copy
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .prefix import PrefixIndex


class PageTable:
    """Pages per request, their reference counts, the free list and the cached pages.

    Args:
        page_size: token positions per page (``>= 1``).
        max_pages: most pages made before a cached one is evicted (``None``: no limit).
        cache_pages: most unreferenced pages kept cached (``None``: no prefix caching;
            ``0``: pages shared while held, none kept after).

    Attributes:
        pages: uid -> its page ids, in position order.
        refs: page -> how many requests hold it (held pages only).
        free_list: page ids free for reuse (holding nothing), the next handed out first.
        cached: unreferenced indexed pages, least recently used first.
        capacity: pages ever created (``max page id + 1``).
        handouts: page -> times it was handed out (its slots written anew).
        index: the :class:`PrefixIndex` (``None`` without prefix caching).
    """

    def __init__(self, page_size: int, max_pages: int | None = None, cache_pages: int | None = None):
        self.page_size, self.max_pages, self.cache_pages = int(page_size), max_pages, cache_pages
        self.pages: dict[int, list[int]] = {}
        self.refs: dict[int, int] = {}
        self.free_list: list[int] = []
        self.cached: list[int] = []
        self.capacity = 0
        self.handouts: dict[int, int] = {}
        self.index = None if cache_pages is None else PrefixIndex()

    def pages_for(self, tokens: int) -> int:
        """Pages that hold ``tokens`` positions: ``ceil(tokens / page_size)``."""
        return math.ceil(max(tokens, 0) / self.page_size)

    @property
    def used(self) -> int:
        """Distinct pages held by requests (a shared page counted once)."""
        return len(self.refs)

    def _take(self) -> int:
        """A page for new content: free, else new, else the LRU cached page evicted."""
        if self.free_list:
            page = self.free_list.pop(0)
        elif self.cached and self.max_pages is not None and self.capacity >= self.max_pages:
            page = self.cached[0]
            self._uncache(page)
            self.free_list.remove(page)
        else:
            page, self.capacity = self.capacity, self.capacity + 1
        self.handouts[page] = self.handouts.get(page, 0) + 1
        self.refs[page] = 1
        return page

    def _uncache(self, page: int) -> None:
        """Forget ``page`` and its subtree in the index; those of them cached become free."""
        for p in self.index.forget(page):
            if p in self.cached:
                self.cached.remove(p)
                self.free_list.insert(0, p)

    def reserve(self, uid: int, tokens: int) -> list[int]:
        """Give ``uid`` pages for ``tokens`` positions in all; returns the pages added."""
        have = self.pages.setdefault(uid, [])
        added = [self._take() for _ in range(self.pages_for(tokens) - len(have))]
        have.extend(added)
        return added

    def match(self, tokens: Sequence[int]) -> list[int]:
        """The pages of ``tokens``' longest indexed prefix of whole pages (``[]``: none)."""
        if self.index is None:
            return []
        out = self.index.match(tokens, self.page_size, self.handouts)
        for page in [p for p in self.cached if p not in self.index]:  # forgotten as stale just now
            self.cached.remove(page)
            self.free_list.insert(0, page)
        return out

    def share(self, uid: int, pages: Sequence[int]) -> None:
        """``uid`` (holding no page yet) takes ``pages``, each count up by one."""
        for page in pages:
            self.refs[page] = self.refs.get(page, 0) + 1
            if page in self.cached:
                self.cached.remove(page)
        if pages:
            self.pages[uid] = list(pages)

    def fork(self, src: int, dst: int) -> None:
        """``dst`` shares all of ``src``'s pages (a partly filled last page included)."""
        self.pages.pop(dst, None)
        self.share(dst, self.pages.get(src, []))

    def copy_on_write(self, uid: int, start: int, end: int) -> list[tuple[int, int]]:
        """Replace ``uid``'s shared pages over positions ``start .. end - 1`` by new ones;
        returns ``(source, copy)`` pairs for the caller to copy before the write."""
        pages, out = self.pages.get(uid, []), []
        for i in range(start // self.page_size, min(self.pages_for(end), len(pages))):
            if self.refs[pages[i]] > 1:
                self.refs[pages[i]] -= 1
                copy = self._take()
                out.append((pages[i], copy))
                pages[i] = copy
        return out

    def prepare(self, spans: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
        """:meth:`copy_on_write` then :meth:`reserve` per ``(uid, start, end)`` span; the pairs."""
        P, out = self.page_size, []
        held = self.pages
        for uid, start, end in spans:
            pages = held[uid] if uid in held else ()
            n, first, last = len(pages), start // P, -(-end // P)
            last = n if last > n else last  # no min(): a call per span
            if last - first > 1 or (last > first and self.refs[pages[first]] > 1):
                out += self.copy_on_write(uid, start, end)
            if n * P < end:
                self.reserve(uid, end)
        return out

    def register(self, uid: int, tokens: Sequence[int], start: int, end: int) -> None:
        """Index ``uid``'s pages filled by positions ``start .. end - 1`` of its ``tokens``."""
        if self.index is None:
            return
        P, pages = self.page_size, self.pages.get(uid, [])
        for i in range(start // P, min(end // P, len(pages))):
            parent = pages[i - 1] if i else -1
            self.index.add(pages[i], parent, tokens[i * P : (i + 1) * P], self.handouts.get(pages[i], 0))

    def free(self, uid: int, keep: int = 0) -> list[int]:
        """``uid`` gives back its pages but the first ``keep``, each count down by one; returns
        those reaching 0 (indexed: cached, last page first; else: the free list's front)."""
        gone, held = [], self.pages.get(uid, [])
        back = held[keep:]
        if keep:
            del held[keep:]
        else:
            self.pages.pop(uid, None)
        for page in back:
            self.refs[page] -= 1
            if not self.refs[page]:
                del self.refs[page]
                gone.append(page)
        self.free_list[:0] = [p for p in gone if self.index is None or p not in self.index]
        self.cached += [p for p in reversed(gone) if self.index is not None and p in self.index]
        while self.cache_pages is not None and len(self.cached) > self.cache_pages:
            self._uncache(self.cached[0])
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

    def clone(self, share_handouts: bool = False) -> "PageTable":
        """An independent copy; ``share_handouts`` (a savepoint) keeps one hand-out count."""
        out = PageTable(self.page_size, self.max_pages, self.cache_pages)
        out.pages = {u: list(p) for u, p in self.pages.items()}
        out.refs, out.free_list, out.cached = dict(self.refs), list(self.free_list), list(self.cached)
        out.capacity = self.capacity
        out.handouts = self.handouts if share_handouts else dict(self.handouts)
        out.index = None if self.index is None else self.index.clone()
        return out

    def problems(self) -> list[str]:
        """What disagrees in the books (counts, held/free/cached overlaps, index); ``[]``: none."""
        out, counts = [], {}
        for pages in self.pages.values():
            for p in pages:
                counts[p] = counts.get(p, 0) + 1
        if counts != self.refs:
            out.append(f"reference counts {self.refs} but pages held {counts}")
        places = list(self.refs) + self.free_list + self.cached
        if len(places) != len(set(places)) or set(places) - set(range(self.capacity)):
            out.append("a page is held twice, or in two of held / free / cached, or past the capacity")
        if self.cached and (self.index is None or any(p not in self.index for p in self.cached)):
            out.append(f"cached pages {self.cached} not all indexed")
        if self.cache_pages is not None and len(self.cached) > self.cache_pages:
            out.append(f"{len(self.cached)} cached pages, at most {self.cache_pages}")
        return out
