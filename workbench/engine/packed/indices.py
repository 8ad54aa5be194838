"""The index arrays of one packed forward, built once for every layer by a few numpy calls
over the whole batch (no Python loop over tokens or positions).

A request's position ``p`` lives at pool slot ``pages[p // page_size] * page_size + p %
page_size`` (:meth:`PageTable.slots`). :func:`forward_index` lays each chunk's request's
pages out as one zero-padded matrix ``[C, W]`` (``W``: pages of the longest chunk's
request after the step); every index array of the forward is then a gather from it:

- ``write`` ``[T]``: the slot of each packed token (chunk ``c``'s positions ``start .. end - 1``);
- ``positions`` ``[T]``: each packed token's RoPE position;
- ``sampled`` ``[R]``: the packed index of each sampling chunk's last token;
- :meth:`ForwardIndex.slot_grid`: the slots of positions ``0 .. end - 1`` of chunks
  ``a .. b - 1``, right-padded with slot 0 (the grouped attention's gather);
- :meth:`ForwardIndex.page_grid`: the page ids themselves (the CUDA kernel's page table).

Example (page_size 4; uid 0 holds pages ``[0, 1]``, uid 1 holds ``[2]``)::

    ix = forward_index(t, [Chunk(0, 5, 1, "decode"), Chunk(1, 0, 3, "prefill")])
    ix.write() -> [5, 8, 9, 10]; ix.positions() -> [5, 0, 1, 2]; ix.sampled() -> [0, 3]
    ix.slot_grid(0, 2) -> [[0, 1, 2, 3, 4, 5], [8, 9, 10, 0, 0, 0]]

Axis letters: ``C`` chunks, ``W`` page-table width, ``T`` packed tokens, ``L`` keys per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from ...observe.packed import Chunk
from .pages import PageTable


@dataclass(frozen=True)
class ForwardIndex:
    """The pages and spans of one packed forward's chunks (numpy, host side).

    Attributes:
        page_size: positions per page.
        pages: ``[C, W]`` int32 page ids of each chunk's request, right-padded with page 0.
        held: ``[C]`` pages each chunk's request holds (all of them).
        starts, ends: ``[C]`` int64 first position and end (exclusive) of each chunk.
        samples: ``[C]`` bool, the chunk samples (its last token's logits are read).
    """

    page_size: int
    pages: np.ndarray
    held: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    samples: np.ndarray

    def check(self, chunks: Sequence[Chunk]) -> None:
        """Raise unless every chunk indexed ends within its request's pages.

        Raises:
            ValueError: naming the first chunk beyond its pages (as :meth:`PageTable.slots`)."""
        bad = np.flatnonzero(self.ends > self.held * self.page_size)
        if bad.size:
            c, P = chunks[bad[0]], self.page_size
            raise ValueError(
                f"uid {c.uid}: positions up to {c.end - 1} but only {self.held[bad[0]]} page(s) of {P}"
            )

    def _tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """``(chunk of each packed token [T], its position [T])``."""
        n = self.ends - self.starts
        chunk = np.repeat(np.arange(len(n)), n)
        first = np.cumsum(n) - n  # packed index of each chunk's first token
        return chunk, np.arange(int(n.sum())) - first[chunk] + self.starts[chunk]

    def positions(self) -> np.ndarray:
        """``[T]`` int32 RoPE position of each packed token."""
        return self._tokens()[1].astype(np.int32)

    def write(self) -> np.ndarray:
        """``[T]`` int32 pool slot of each packed token."""
        chunk, pos = self._tokens()
        P = self.page_size
        return (self.pages[chunk, pos // P] * P + pos % P).astype(np.int32)

    def sampled(self) -> np.ndarray:
        """``[R]`` int32 packed index of each sampling chunk's last token."""
        return (np.cumsum(self.ends - self.starts) - 1)[self.samples].astype(np.int32)

    def slot_grid(self, a: int, b: int) -> np.ndarray:
        """``[b - a, L]`` int32 slots of positions ``0 .. end - 1`` of chunks ``a .. b - 1``
        (``L``: their longest end), right-padded with slot 0."""
        ends, P = self.ends[a:b], self.page_size
        j = np.arange(int(ends.max()) if ends.size else 0)
        grid = self.pages[a:b, j // P] * P + j % P
        grid[j[None, :] >= ends[:, None]] = 0
        return grid.astype(np.int32)

    def page_grid(self, a: int, b: int) -> np.ndarray:
        """``[b - a, W']`` int32 page ids of chunks ``a .. b - 1`` (``W'``: pages of their
        longest end), right-padded with page 0."""
        width = int(-(-self.ends[a:b].max() // self.page_size)) if b > a else 0
        return np.ascontiguousarray(self.pages[a:b, :width], dtype=np.int32)


def forward_index(table: PageTable, chunks: Sequence[Chunk]) -> ForwardIndex:
    """The :class:`ForwardIndex` of ``chunks`` over ``table``'s pages (checked by
    :meth:`ForwardIndex.check`): vLLM's ``slot_mapping`` [T] and ``block_tables`` [R, W]."""
    C, P = len(chunks), table.page_size
    lists = [table.pages.get(c.uid, ()) for c in chunks]
    starts = np.fromiter((c.start for c in chunks), np.int64, C)
    ends = starts + np.fromiter((c.n_tokens for c in chunks), np.int64, C)
    held = np.fromiter(map(len, lists), np.int64, C)
    need = np.minimum(held, -(-ends // P))
    flat = np.fromiter(chain.from_iterable(lists), np.int32, int(held.sum()))
    rows = np.repeat(np.arange(C), held)
    cols = np.arange(flat.size) - (np.cumsum(held) - held)[rows]
    keep = cols < need[rows]
    pages = np.zeros((C, int(need.max()) if C else 0), np.int32)
    pages[rows[keep], cols[keep]] = flat[keep]
    samples = np.fromiter((c.samples for c in chunks), bool, C)
    return ForwardIndex(P, pages, held, starts, ends, samples)
