"""The batch-invariant mode's per-row attention for every forward it hooks: one query or
several per row (a speculative verify forward, ``[B, 1 + K]``), over a float or a quantized
cache (``kv_bits``).

Knows: :func:`workbench.engine.levers.invariant.row_attention` (the CPU's one-query
attention whose bits depend only on the row's own keys), the CUDA padded-rows kernel
(:mod:`workbench.engine.levers.padded_attention`), mlx-lm's quantized cache parts
(``(packed, scales, biases)`` as ``mx.quantize`` returns them). Must not know: requests, the
queue, the scheduler.

Each query position is computed as a one-token step computes it: query ``j`` of row ``b``
attends its own keys from ``starts[b]`` up to (and including) its own position, one
:func:`row_attention` call (CPU) or padded-rows kernel call (CUDA) per position, so a
position's bits do not depend on how many positions the forward runs, on the other rows, or
on the padding. Worked example, a verify forward of ``L = 3`` over a cache ``S = 10`` wide,
row ``b`` held 4 tokens before it::

    starts[b] = S - held - L = 3          query 0 attends columns 3..7
                                          query 1 attends columns 3..8
                                          query 2 attends columns 3..9

A quantized cache is dequantized first (``mx.dequantize``: each position on its own, the same
values in any batch), then attended in the queries' dtype as a float one.

Axis letters: ``B`` rows, ``H`` query heads, ``L`` query positions per row, ``S`` cached
positions (this forward's included), ``D`` head dim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchRotatingKVCache

from ..kv import cache_internals as internals
from .padded_attention import padded_decode_attention, supported


def dequantized_parts(keys: Any, values: Any, cache: Any, dtype: Any) -> tuple[mx.array, mx.array]:
    """``(keys, values)`` ``[B, n_kv_heads, S, D]`` in ``dtype``: a quantized cache's
    ``(packed, scales, biases)`` parts dequantized (``cache.group_size``, ``cache.bits``), or
    float ones as they are."""
    if not hasattr(cache, "bits"):
        return keys, values
    out = (
        mx.dequantize(*p, group_size=cache.group_size, bits=cache.bits).astype(dtype) for p in (keys, values)
    )
    return tuple(out)


def temporal_order(x: mx.array, cache: BatchRotatingKVCache) -> mx.array:
    """A rotating cache's fetched keys or values ``[B, n_kv_heads, S, D]`` oldest first (its
    ring rolled so the position written last is last; mirrors mlx-lm's
    ``BatchRotatingKVCache._temporal_order``, without changing the cache): the same order
    for a row in any batch, where the ring's rotation is the batch's."""
    wrapped, slot = internals.ring_position(cache)
    return mx.contiguous(mx.roll(x, -slot, axis=2)) if wrapped and slot else x


def per_row_attention(
    original: Callable[..., mx.array],
    one_query: Callable[..., mx.array],
    queries: mx.array,
    keys: Any,
    values: Any,
    cache: Any,
    scale: float,
    held: Sequence[int],
    cuda: bool,
    memo: dict | None = None,
) -> mx.array:
    """Attention in which each row's bits depend only on its own keys, for ``L >= 1`` query
    positions per row (see the module docstring).

    Args:
        original: the attention the model would run (``(queries, keys, values, cache, scale,
            mask)``), used on CUDA for head dims the padded-rows kernel does not serve.
        one_query: the CPU's one-query per-row attention ``(queries [B, H, 1, D], keys,
            values, starts [B], scale, longest)`` (``longest``: the most keys a row has;
            :func:`workbench.engine.levers.invariant.row_attention`).
        queries: ``[B, H, L, D]`` (RoPE applied). keys, values: ``[B, n_kv_heads, S, D]`` as
            the cache returned them (``(packed, scales, biases)`` tuples for a quantized one).
        cache: the layer's ``BatchKVCache`` (or :class:`BatchQuantizedKVCache`, or
            ``BatchRotatingKVCache``), written.
        held: ``[B]`` tokens each row's cache held before this forward.
        cuda: run the CUDA padded-rows kernel where it serves.
        memo: one forward's store of its rows' columns (every layer of a forward attends
            from the same ones: worked out once, not per layer); ``None``: none kept.

    Returns:
        ``[B, H, L, D]`` in the queries' dtype.

    Raises:
        RuntimeError: ``held`` does not have ``B`` rows, or a row claims more tokens than
            the cache is wide.
    """
    B, _, L, _ = queries.shape
    if len(held) != B:
        raise RuntimeError(f"batch-invariant attention got {len(held)} held counts for {B} rows")
    keys, values = dequantized_parts(keys, values, cache, queries.dtype)
    window = None
    if isinstance(cache, BatchRotatingKVCache):  # a sliding window: each row's last `max_size` tokens
        keys, values = temporal_order(keys, cache), temporal_order(values, cache)
        window = cache.max_size
    columns = (memo if memo is not None else {}).get((keys.shape[-2], L, window))
    if columns is None:
        columns = _columns(held, keys.shape[-2], L, window, memo)
    starts, ends, first = columns
    if cuda and supported(queries, keys):
        outs = _kernel_positions(queries, keys, values, cache, first, ends, scale)
    elif not cuda:
        outs = _one_query_positions(one_query, queries, keys, values, starts, first, ends, scale)
    else:
        outs = _alone_positions(original, queries, keys, values, cache, starts, ends, scale)
    return outs[0] if L == 1 else mx.concatenate(outs, axis=2)


def _columns(
    held: Sequence[int], S: int, L: int, window: int | None, memo: dict | None
) -> tuple[list[int], list[int], mx.array]:
    """``(starts [B], ends [L], starts as a [B] int32 array)``: row ``b``'s query ``j`` attends
    columns ``starts[b] .. ends[j] - 1`` of a cache ``S`` wide (a sliding window of ``window``
    tokens keeps each row's last ones), kept in ``memo`` under ``(S, L, window)``.

    Raises:
        RuntimeError: a row claims more tokens than the cache is wide."""
    if window is not None:
        held = [min(n, window - L) for n in held]
    starts = [S - n - L for n in held]  # each row's own tokens are its last held[b] + L
    if min(starts) < 0:
        raise RuntimeError(f"rows claim {[n + L for n in held]} tokens in a cache {S} wide")
    ends = [S - L + 1 + j for j in range(L)]  # query j attends columns starts[b] .. ends[j] - 1
    columns = (starts, ends, starts_array(starts))
    if memo is not None:
        memo[(S, L, window)] = columns
    return columns


_STARTS: list = [None]  # (the last starts asked for, as a tuple, their [B] int32 array)


def starts_array(starts: Sequence[int]) -> mx.array:
    """``starts`` (``[B]`` column indices, in cache positions) as a ``[B]`` int32 array, the last
    one kept: every layer of a forward attends from the same starts, so a decode step makes one
    array, not one per layer. No mlx-lm counterpart (``BatchKVCache.left_padding`` plays this part
    there). Raises nothing of its own."""
    key, hit = tuple(starts), _STARTS[0]  # one read: another thread may replace it
    if hit is None or hit[0] != key:
        hit = _STARTS[0] = (key, mx.array(key, dtype=mx.int32))
    return hit[1]


def _one_query_positions(one_query, queries, keys, values, starts, first, ends, scale) -> list[mx.array]:
    """Each query position through the CPU's one-query attention over the columns up to its
    own (``keys[:, :, :end]``), told the most keys a row has there (``end - min(starts)``;
    ``first``: ``starts`` as a ``[B]`` array)."""
    return [
        one_query(
            queries[:, :, j : j + 1], keys[:, :, :end], values[:, :, :end], first, scale, end - min(starts)
        )
        for j, end in enumerate(ends)
    ]


def _as_stored(cache: Any) -> bool:
    """Whether the keys the attention reads are the cache's own buffers in its layout (a
    float ``BatchKVCache``), not a dequantized or reordered copy."""
    return not hasattr(cache, "bits") and not isinstance(cache, BatchRotatingKVCache)


def _kernel_positions(queries, keys, values, cache, first, ends, scale) -> list[mx.array]:
    """Each query position through the CUDA padded-rows kernel, which reads whole buffers up
    to a column count: the cache's own buffers, or the dequantized / reordered keys (``first``:
    the ``[B]`` starts array)."""
    stored = _as_stored(cache)
    kbuf, vbuf = (cache.keys, cache.values) if stored else (keys, values)
    shift = internals.write_index(cache) - keys.shape[-2] if stored else 0
    if len(ends) == 1:  # a decode step: the queries as they are (no slice of their one position)
        return [padded_decode_attention(mx.contiguous(queries), kbuf, vbuf, first, ends[0] + shift, scale)]
    return [
        padded_decode_attention(
            mx.contiguous(queries[:, :, j : j + 1]), kbuf, vbuf, first, end + shift, scale
        )  # the kernel reads the queries row-contiguous
        for j, end in enumerate(ends)
    ]


def _alone_positions(original, queries, keys, values, cache, starts, ends, scale) -> list[mx.array]:
    """Each row and query position in an attention call of its own (CUDA, head dims the
    kernel does not serve): the cache's own attention for a float cache, MLX's fused one on
    dequantized or reordered keys."""
    outs = []
    for j, end in enumerate(ends):
        rows = []
        for b, s in enumerate(starts):
            q, k, v = queries[b : b + 1, :, j : j + 1], keys[b : b + 1, :, s:end], values[b : b + 1, :, s:end]
            stored = _as_stored(cache)
            rows.append(
                original(q, k, v, cache, scale, None)
                if stored
                else mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
            )
        outs.append(rows[0] if len(rows) == 1 else mx.concatenate(rows))
    return outs
