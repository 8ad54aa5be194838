"""A packed forward of decode tokens only, run as ``[R, 1]`` rows: the fast path of the
packed layout's steady state (every row decoding, no prefill chunk beside them).

Knows: the page table's page ids per request, the chunks, numpy. Must not know: MLX, requests,
the model.

When every chunk of a forward is one decode token that samples, the ``[1, T]`` packed
sequence is the ``[R, 1]`` batch the padded layout runs, without its padding: the same
matmuls (MLX folds the leading axes of ``[R, 1, hidden]`` and ``[1, R, hidden]`` into one
``[R, hidden]`` GEMM), each row's RoPE at its own position through mlx-lm's ``[B]`` offsets
(no per-token transposes), the decode group's attention on queries ``[R, H, 1, D]`` as they
come (no transpose in or out), and every row's hidden state to the LM head (no gather of
sampled positions). :func:`decode_index` builds the forward's index arrays from the page table
in a handful of numpy calls (the general :func:`~workbench.engine.packed.indices.forward_index`
plus :meth:`~workbench.engine.packed.indices.ForwardIndex.slot_grid` take about four times as
many, a few microseconds each on this project's CPU: host time that the device waits for).

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
        slots: ``[R, L]`` int32 slots of each row's positions ``0 .. end - 1``, right-padded
            with slot 0 (``L``: the longest row's end).
        mask: ``[R, L]`` bool, position ``j`` below the row's end; ``None`` when every row is
            as long (no padding).
    """

    write: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    mask: np.ndarray | None


def decode_index(table: PageTable, chunks: Sequence[Chunk]) -> DecodeIndex:
    """The :class:`DecodeIndex` of one-token decode ``chunks`` (:func:`decode_only`) over
    ``table``'s pages: the same ``write``, ``positions`` and decode slot grid as
    :func:`~workbench.engine.packed.indices.forward_index` and ``slot_grid`` give.

    Raises:
        ValueError: a chunk beyond its request's pages (the message of
            :meth:`~workbench.engine.packed.indices.ForwardIndex.check`)."""
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
