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
    if not cache.rotated:
        return x
    return mx.contiguous(mx.roll(x, -internals.write_index(cache), axis=2))


def per_row_attention(
    original: Callable[..., mx.array],
    queries: mx.array,
    keys: Any,
    values: Any,
    cache: Any,
    scale: float,
    held: Sequence[int],
    cuda: bool,
) -> mx.array:
    """Attention in which each row's bits depend only on its own keys, for ``L >= 1`` query
    positions per row (see the module docstring).

    Args:
        original: the attention the model would run (``(queries, keys, values, cache, scale,
            mask)``), used on CUDA for head dims the padded-rows kernel does not serve.
        queries: ``[B, H, L, D]`` (RoPE applied). keys, values: ``[B, n_kv_heads, S, D]`` as
            the cache returned them (``(packed, scales, biases)`` tuples for a quantized one).
        cache: the layer's ``BatchKVCache`` (or :class:`BatchQuantizedKVCache`), written.
        held: ``[B]`` tokens each row's cache held before this forward.
        cuda: run the CUDA padded-rows kernel where it serves.

    Returns:
        ``[B, H, L, D]`` in the queries' dtype.

    Raises:
        RuntimeError: ``held`` does not have ``B`` rows, or a row claims more tokens than
            the cache is wide.
    """
    from ..kv.cache_internals import write_index
    from .invariant import row_attention
    from .padded_attention import padded_decode_attention, supported

    B, _, L, _ = queries.shape
    if len(held) != B:
        raise RuntimeError(f"batch-invariant attention got {len(held)} held counts for {B} rows")
    quantized = hasattr(cache, "bits")
    keys, values = dequantized_parts(keys, values, cache, queries.dtype)
    ring = isinstance(cache, BatchRotatingKVCache)
    if ring:  # a sliding window: keys in temporal order, each row's last `max_size` tokens
        keys, values = temporal_order(keys, cache), temporal_order(values, cache)
        held = [min(n, cache.max_size - L) for n in held]
    S = keys.shape[-2]
    starts = [S - n - L for n in held]  # each row's own tokens are its last held[b] + L
    if min(starts) < 0:
        raise RuntimeError(f"rows claim {[n + L for n in held]} tokens in a cache {S} wide")
    first = mx.array(starts, dtype=mx.int32)
    if cuda and supported(queries, keys):  # the kernel reads whole buffers up to `columns`
        kbuf, vbuf = (keys, values) if quantized or ring else (cache.keys, cache.values)
        end = S if quantized or ring else write_index(cache)
        outs = [
            padded_decode_attention(
                mx.contiguous(queries[:, :, j : j + 1]), kbuf, vbuf, first, end - L + 1 + j, scale
            )  # the kernel reads the queries row-contiguous
            for j in range(L)
        ]
    elif not cuda:
        outs = [
            row_attention(
                queries[:, :, j : j + 1],
                keys[:, :, : S - L + 1 + j],
                values[:, :, : S - L + 1 + j],
                first,
                scale,
            )
            for j in range(L)
        ]
    else:  # each row and position alone
        outs = []
        for j in range(L):
            end = S - L + 1 + j
            rows = [
                mx.fast.scaled_dot_product_attention(
                    queries[b : b + 1, :, j : j + 1],
                    keys[b : b + 1, :, s:end],
                    values[b : b + 1, :, s:end],
                    scale=scale,
                )
                if quantized or ring
                else original(
                    queries[b : b + 1, :, j : j + 1],
                    keys[b : b + 1, :, s:end],
                    values[b : b + 1, :, s:end],
                    cache,
                    scale,
                    None,
                )
                for b, s in enumerate(starts)
            ]
            outs.append(rows[0] if B == 1 else mx.concatenate(rows))
    return outs[0] if L == 1 else mx.concatenate(outs, axis=2)
