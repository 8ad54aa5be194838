"""A packed forward of decode tokens only, run as ``[R, 1]`` rows: the fast path of the
packed layout's steady state (every row decoding, no prefill chunk beside them).

The ``[1, T]`` sequence is then the padded layout's ``[R, 1]`` batch without its padding:
the same matmuls, RoPE at mlx-lm's ``[B]`` offsets, attention on ``[R, H, 1, D]`` queries as
they come, every row to the LM head. :func:`decode_index` builds the index arrays in a handful
of numpy calls (why it pays: ``docs/lab/engine-notes.md``, "packed/decode_rows.py").

Example (page_size 4; uid 0 holds pages ``[0, 1]``, uid 1 holds ``[2]``)::

    ix = decode_index(t, [Chunk(0, 5, 1, "decode"), Chunk(1, 2, 1, "decode")])
    ix.write -> [5, 10]; ix.positions -> [5, 2]
    ix.slots -> [[0, 1, 2, 3, 4, 5], [8, 9, 10, 0, 0, 0]]; ix.mask -> [[T]*6, [T, T, T, F, F, F]]

Axis letters: ``R`` decode rows, ``W`` pages of the longest row, ``L`` its positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...observe.packed import DECODE, Chunk
from .pages import PageTable


def decode_only(chunks: Sequence[Chunk]) -> bool:
    """Whether ``chunks`` are all one-token decode chunks that sample (at least one)."""
    return bool(chunks) and all(c.n_tokens == 1 and c.kind == DECODE and c.samples for c in chunks)


@dataclass(frozen=True)
class DecodeIndex:
    """The index arrays of a decode-only packed forward (numpy, host side).

    Attributes:
        write: ``[R]`` int32 pool slot of each row's new token.
        positions: ``[R]`` int32 its RoPE position (the row's held tokens before the step).
        slots: ``[R, L]`` int32 slots of each row's positions, right-padded with slot 0.
        mask: ``[R, L]`` bool, position below the row's end; ``None`` when all are as long.
    """

    write: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    mask: np.ndarray | None


def decode_index(table: PageTable, chunks: Sequence[Chunk]) -> DecodeIndex:
    """The :class:`DecodeIndex` of one-token decode ``chunks`` over ``table``'s pages (what
    :func:`~workbench.engine.packed.indices.forward_index` would give).

    Raises:
        ValueError: a chunk beyond its request's pages."""
    P = table.page_size
    pages = [table.pages.get(c.uid, ()) for c in chunks]
    starts = [c.start for c in chunks]
    L = max(starts) + 1
    W = -(-L // P)
    for c, held in zip(chunks, pages, strict=True):
        if c.start >= len(held) * P:
            raise ValueError(f"uid {c.uid}: positions up to {c.start} but only {len(held)} page(s) of {P}")
    grid = np.array([list(p[:W]) + [0] * (W - len(p)) if len(p) < W else p[:W] for p in pages], np.int32)
    slots = (grid[:, :, None] * P + np.arange(P, dtype=np.int32)).reshape(len(chunks), W * P)[:, :L]
    write = np.array([held[s // P] * P + s % P for held, s in zip(pages, starts, strict=True)], np.int32)
    mask = None
    if min(starts) + 1 < L:
        mask = np.arange(L)[None, :] <= np.array(starts)[:, None]
        slots = np.where(mask, slots, 0).astype(np.int32)
    return DecodeIndex(write, np.array(starts, np.int32), np.ascontiguousarray(slots), mask)
