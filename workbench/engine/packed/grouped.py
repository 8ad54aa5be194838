"""Attention over pages by groups: the decode tokens of a packed forward as one batched
one-query attention, each prefill chunk as its own causal attention, so no token pays
for other requests' keys (why, in numbers: ``docs/lab/engine-notes.md``, "packed/grouped.py").

- the leading run of decode chunks: queries ``[R, H, 1, D]`` against each row's keys
  gathered into ``[R, n_kv_heads, L_max, D]`` (right-padded, masked where a row is shorter):
  mlx-lm's batched decode attention without left padding;
- each other chunk: queries ``[1, H, n, D]`` against its request's keys ``[1, n_kv_heads,
  end, D]`` with mlx-lm's ``"causal"`` mask, the call mlx-lm's chunked prefill makes.

Outputs are concatenated in packed order, within float rounding of the masked attention.
Axis letters: ``T`` packed tokens, ``R`` decode rows, ``L`` keys per row, ``H`` heads,
``D`` head dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from ...observe.packed import DECODE, Chunk
from .indices import ForwardIndex, forward_index
from .pages import PageTable


@dataclass(frozen=True)
class Groups:
    """The attention groups of one packed forward (shared by every layer).

    Attributes:
        n_decode: decode rows ``R`` (the leading 1-token decode chunks).
        decode_slots: ``[R, L_max]`` int32 pool slots of each decode row's keys (right-padded
            with slot 0), or ``None`` when ``R == 0``.
        decode_mask: ``[R, 1, 1, L_max]`` bool, or ``None`` (every row as long).
        chunks: ``(first packed token, tokens, slots [end])`` of every other chunk.
        flat: ``(id(slots), n_kv_heads)`` -> :func:`flat_indices`, made once per forward.
    """

    n_decode: int
    decode_slots: mx.array | None
    decode_mask: mx.array | None
    chunks: tuple[tuple[int, int, mx.array], ...]
    flat: dict = field(default_factory=dict, compare=False, repr=False)


def groups_of(
    table: PageTable, chunks: Sequence[Chunk], index: ForwardIndex | None = None, skip: int = 0
) -> Groups:
    """The :class:`Groups` of ``chunks[skip:]`` over ``table``'s pages (``index``: made when ``None``).

    Raises:
        ValueError: a chunk beyond its request's pages."""
    index = forward_index(table, chunks) if index is None else index
    index.check(chunks)
    n = 0
    while skip + n < len(chunks) and chunks[skip + n].kind == DECODE and chunks[skip + n].n_tokens == 1:
        n += 1
    slots, mask = None, None
    if n:
        ends = index.ends[skip : skip + n]
        slots = mx.array(index.slot_grid(skip, skip + n))
        if ends.min() < ends.max():
            mask = mx.array(np.arange(int(ends.max()))[None, :] < ends[:, None])[:, None, None, :]
    rest, at = [], n
    for i in range(skip + n, len(chunks)):
        rest.append((at, chunks[i].n_tokens, mx.array(index.slot_grid(i, i + 1)[0])))
        at += chunks[i].n_tokens
    return Groups(n, slots, mask, tuple(rest))


def flat_indices(slots: mx.array, n_kv_heads: int) -> mx.array:
    """Rows of the flat pool ``[N * n_kv_heads, D]`` holding each head of each slot:
    ``slots`` ``[..., L]`` -> ``[..., n_kv_heads, L]`` int32 (``slot * n_kv_heads + head``)."""
    heads = mx.arange(n_kv_heads, dtype=mx.int32)[:, None]  # [n_kv_heads, 1]
    return slots[..., None, :] * n_kv_heads + heads


def _gather(pool: mx.array, slots: mx.array, groups: Groups | None = None) -> mx.array:
    """``pool`` ``[N, n_kv_heads, D]`` at ``slots`` ``[..., L]`` -> ``[..., n_kv_heads, L, D]``,
    row-contiguous (one gather at :func:`flat_indices`)."""
    N, H, D = pool.shape
    key = (id(slots), H)
    flat = None if groups is None else groups.flat.get(key)
    if flat is None:
        flat = slots[..., None, :] * H + mx.arange(H, dtype=mx.int32)[:, None]  # flat_indices(slots, H)
        if groups is not None:
            groups.flat[key] = flat
    return pool.reshape(N * H, D)[flat]


def grouped_attention(
    queries: mx.array, keys_pool: mx.array, values_pool: mx.array, groups: Groups, scale: float
) -> mx.array:
    """Attention of ``queries`` ``[1, H, T, D]`` (RoPE applied) over the pools ``[N,
    n_kv_heads, D]`` by :class:`Groups`. Returns ``[1, H, T, D]``."""
    outs = []
    R = groups.n_decode
    if R:
        q = (queries if queries.shape[2] == R else queries[:, :, :R]).transpose(2, 1, 0, 3)
        k, v = (
            _gather(keys_pool, groups.decode_slots, groups),
            _gather(values_pool, groups.decode_slots, groups),
        )  # [R, n_kv, L, D]
        o = mx.fast.scaled_dot_product_attention(
            q, k, v, scale=scale, mask=groups.decode_mask
        )  # [R, H, 1, D]
        outs.append(o.transpose(2, 1, 0, 3))  # [1, H, R, D]: one view each way, no copy
    for first, n, slots in groups.chunks:
        k, v = (
            _gather(keys_pool, slots, groups)[None],
            _gather(values_pool, slots, groups)[None],
        )  # [1, n_kv, end, D]
        mask = "causal" if n > 1 else None
        outs.append(
            mx.fast.scaled_dot_product_attention(
                queries[:, :, first : first + n], k, v, scale=scale, mask=mask
            )
        )
    return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)
