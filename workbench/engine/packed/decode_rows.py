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
from typing import Any

import mlx.core as mx
import numpy as np

from ...observe.packed import DECODE, Chunk
from .pages import PageTable


def decode_only(chunks: Sequence[Chunk]) -> bool:
    """Whether ``chunks`` are all one-token decode chunks that sample (at least one)."""
    return bool(chunks) and all([c.n_tokens == 1 and c.kind == DECODE and c.samples for c in chunks])


@dataclass(frozen=True)
class DecodeIndex:
    """The index arrays of a decode-only packed forward (numpy, host side).

    Attributes:
        write: ``[R]`` int32 pool slot of each row's new token.
        positions: ``[R]`` int32 its RoPE position (the row's held tokens before the step).
        slots: ``[R, L]`` int32 slots of each row's positions, right-padded with slot 0
            (``None`` when not asked for: the CUDA kernel reads :attr:`pages`).
        mask: ``[R, L]`` bool, position below the row's end; ``None`` when all are as long
            (or with no ``slots``).
        pages: ``[R, W]`` int32 each row's first ``W`` page ids, right-padded with page 0 (the
            CUDA kernel's page table, :class:`~workbench.engine.packed.cuda_attention.DecodePages`).
        flat: ``[R, heads, L]`` int32 rows of the flat pool ``[N * heads, D]`` of each row's
            keys (``slot * heads + head``: :func:`~workbench.engine.packed.grouped.flat_indices`
            of :attr:`slots`, made on the host), or ``None`` when ``heads`` was not given.
    """

    write: np.ndarray
    positions: np.ndarray
    slots: np.ndarray | None
    mask: np.ndarray | None
    pages: np.ndarray
    flat: np.ndarray | None = None


_COLUMNS: dict = {}  # (L, P, heads) -> decode_index's read-only position columns, shared by forwards


def decode_index(
    table: PageTable, chunks: Sequence[Chunk], slots: bool = True, heads: int | None = None
) -> DecodeIndex:
    """The :class:`DecodeIndex` of one-token decode ``chunks`` over ``table``'s pages (what
    :func:`~workbench.engine.packed.indices.forward_index` would give; ``slots=False``: no
    slot grid nor mask, what the CUDA kernel needs; ``heads``: also :attr:`DecodeIndex.flat`
    for that many KV heads).

    Raises:
        ValueError: a chunk beyond its request's pages."""
    P, held = table.page_size, table.pages
    pages = [held[c.uid] if c.uid in held else () for c in chunks]
    starts = [c.start for c in chunks]
    n_pages = list(map(len, pages))  # one call for all rows (the step's per-row work is its cost)
    L = max(starts) + 1
    W = -(-L // P)
    beyond = [b for b, (s, n) in enumerate(zip(starts, n_pages)) if s >= n * P]
    if beyond:
        c, n = chunks[beyond[0]], n_pages[beyond[0]]
        raise ValueError(f"uid {c.uid}: positions up to {c.start} but only {n} page(s) of {P}")
    grid = np.array([p[:W] if n >= W else [*p, *[0] * (W - n)] for p, n in zip(pages, n_pages)], np.int32)
    positions = np.array(starts, np.int32)
    if not slots:
        write = np.array([p[s // P] * P + s % P for p, s in zip(pages, starts, strict=True)], np.int32)
        return DecodeIndex(write, positions, None, None, grid)
    key = (L, P, heads or 1)  # the columns of positions 0 .. L - 1, made once per length (inline: a leaf)
    if key not in _COLUMNS:
        if len(_COLUMNS) >= 64:
            _COLUMNS.clear()
        j = np.arange(L, dtype=np.int32)
        _COLUMNS[key] = (j, j // P, j % P, np.arange(key[2], dtype=np.int32)[:, None])
        for a in _COLUMNS[key]:
            a.flags.writeable = False  # read-only: shared by every forward of that length
    j, column, offset, head = _COLUMNS[key]
    grid_slots = grid[:, column] * P + offset  # [R, L]
    write = grid_slots[np.arange(len(chunks)), positions]
    mask = None
    if min(starts) + 1 < L:
        mask = j[None, :] <= positions[:, None]
        grid_slots *= mask  # slot 0 past each row's end
    flat = None if heads is None else grid_slots[:, None, :] * heads + head  # [R, heads, L]
    return DecodeIndex(write, positions, grid_slots, mask, grid, flat)


class DecodeRowsLayer:
    """The cache one layer's ``Attention`` gets in a decode-only forward (mlx-lm's cache
    protocol, and ``attend`` for the model hooks): the least Python a layer can take, every
    index array made once per forward for every layer.

    Args:
        pools: the :class:`~workbench.engine.packed.attention.Pools`; layer: this layer's index.
        write: ``[R]`` int32 pool slot of each row's new token (one row: a scalar, ``[]``);
            positions: ``[R]`` int32 its RoPE position (``offset``: mlx-lm's ``[B]`` offsets).
        flat: ``[R, n_kv_heads, L]`` int32 rows of the flat pool ``[N * n_kv_heads, D]`` of each
            row's keys (:func:`~workbench.engine.packed.grouped.flat_indices` of
            :attr:`DecodeIndex.slots`); mask: ``[R, 1, 1, L]`` bool, or ``None``.
        decode: the rows' :class:`~workbench.engine.packed.cuda_attention.DecodePages`: they
            attend by the CUDA kernel, straight from the pools (``flat`` and ``mask`` unused), or
            ``None``.
    """

    def __init__(
        self,
        pools: Any,
        layer: int,
        write: mx.array,
        positions: mx.array,
        flat: mx.array | None,
        mask: Any,
        decode: Any = None,
    ):
        self.pools, self.layer, self.write, self.offset = pools, layer, write, positions
        self.flat, self.mask, self.decode = flat, mask, decode

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write ``keys``, ``values`` ``[R, n_kv_heads, 1, head_dim]`` at the rows' slots;
        return them as they are (:meth:`attend` reads the pools)."""
        R, H, _, D = keys.shape
        # one row: a scalar slot and [H, D] (a [1] index has MLX squeeze and broadcast the update)
        shape = (H, D) if self.write.ndim == 0 else (R, H, D)
        k, v = keys.reshape(shape), values.reshape(shape)
        pools, layer = self.pools, self.layer
        kp = pools.keys[layer]
        if kp is None or kp.shape[0] < pools.slots:
            pools.fit(layer, keys.reshape(R, H, D))
            kp = pools.keys[layer]
        vp = pools.values[layer]
        kp[self.write] = k
        vp[self.write] = v
        return keys, values

    def attend(self, queries: mx.array, scale: float) -> mx.array:
        """One-query attention of ``queries`` ``[R, H, 1, D]`` over each row's keys, gathered
        row-contiguous from the flat pools; ``[R, H, 1, D]``."""
        kp, vp = self.pools.keys[self.layer], self.pools.values[self.layer]
        if self.decode is not None:  # the CUDA kernel reads each row's pages where they are
            from . import cuda_attention

            return cuda_attention.paged_decode_attention(queries, kp, vp, self.decode, scale)
        N, H, D = kp.shape
        return mx.fast.scaled_dot_product_attention(
            queries,
            kp.reshape(N * H, D)[self.flat],
            vp.reshape(N * H, D)[self.flat],
            scale=scale,
            mask=self.mask,
        )

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> None:
        """``None``: one query a row (the rows' lengths are :meth:`attend`'s ``mask``)."""
        return None
