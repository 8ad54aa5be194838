"""Attention over a quantized KV cache where MLX has no quantized-matmul kernel for the shape.

mlx-lm computes attention over quantized keys and values with ``mx.quantized_matmul``, which
MLX's CUDA backend has for some problem shapes only. :func:`dequantized_attention` computes
the same attention by dequantizing the step's keys and values (per position, so as
row-independent as the float path) and running MLX's fused attention: the cache keeps its
quantized bytes, the step writes a float copy. :func:`choose_attention` picks the path once,
at construction (on CUDA always ``"dequantize"``). Measurements and history:
``docs/lab/engine-notes.md``, "levers/quantized_attention.py"; ``docs/gpu.md``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
import mlx_lm.models.base as mlx_base

from ..model_hooks import hooks_of

PROBE_SHAPES = ((1, 1, 1), (1, 1, 60), (3, 1, 33), (1, 8, 60), (3, 8, 33))  # (GQA repeats, queries, keys)
ATTENTION_PATHS = ("quantized_matmul", "dequantize")


def dequantized_attention(
    queries: mx.array,
    q_keys: tuple[mx.array, mx.array, mx.array],
    q_values: tuple[mx.array, mx.array, mx.array],
    scale: float,
    mask: mx.array | str | None,
    group_size: int = 64,
    bits: int = 8,
) -> mx.array:
    """Attention over quantized keys and values, dequantized first.

    Mirrors mlx-lm's ``models.base.quantized_scaled_dot_product_attention`` (same arguments,
    same result within float rounding).

    Args:
        queries: ``[B, n_q_heads, L, D]``.
        q_keys, q_values: ``(packed [B, n_kv_heads, S, D * bits / 32] uint32, scales
            [B, n_kv_heads, S, D / group_size], biases [same])`` as ``mx.quantize`` returns.
        scale: the softmax scale; mask: ``None``, ``"causal"`` or an array broadcasting to
            ``[B, n_q_heads, L, S]``; group_size, bits: the quantization.

    Returns:
        ``[B, n_q_heads, L, D]`` in the queries' dtype.
    """
    keys = mx.dequantize(*q_keys, group_size=group_size, bits=bits).astype(queries.dtype)
    values = mx.dequantize(*q_values, group_size=group_size, bits=bits).astype(queries.dtype)
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)


def _runs(
    attention: Callable[..., mx.array], n_kv: int, dim: int, dtype: Any, group_size: int, bits: int
) -> str:
    """``""`` when ``attention`` runs at every :data:`PROBE_SHAPES`, else the first failure."""
    for repeats, n_q, n_k in PROBE_SHAPES:
        q_keys = mx.quantize(mx.zeros((1, n_kv, n_k, dim), dtype), group_size=group_size, bits=bits)
        try:
            mx.eval(
                attention(
                    mx.zeros((1, n_kv * repeats, n_q, dim), dtype),
                    q_keys,
                    q_keys,
                    scale=1.0,
                    mask=None,
                    group_size=group_size,
                    bits=bits,
                )
            )
        except (RuntimeError, ValueError) as e:
            return f"{n_kv * repeats} query heads, {n_q} queries, {n_k} keys: {e}"
    return ""


def choose_attention(n_kv: int, dim: int, dtype: Any, group_size: int, bits: int) -> str:
    """The attention path for a quantized cache of ``n_kv`` heads of ``dim`` on the default
    device: ``"quantized_matmul"`` where MLX runs it at every probed shape
    (:data:`PROBE_SHAPES`), else ``"dequantize"`` where that runs.

    Raises:
        ValueError: neither runs, naming ``kv_bits``, ``kv_group_size``, the head dim, the
            failing shape and the device.
    """
    from ...runtime.device import backend

    failed = _runs(mlx_base.quantized_scaled_dot_product_attention, n_kv, dim, dtype, group_size, bits)
    if backend() == "cuda" and not failed:  # shapes the probe cannot cover fail there (module docstring)
        failed = "MLX's CUDA quantized_matmul covers some problem shapes only"
    if not failed:
        return "quantized_matmul"
    if not _runs(dequantized_attention, n_kv, dim, dtype, group_size, bits):
        return "dequantize"
    raise ValueError(
        f"kv_bits={bits}, kv_group_size={group_size}: MLX cannot run quantized attention for head dim "
        f"{dim} on {mx.default_device()} ({failed}), nor dequantized; use kv_bits=None or another "
        "kv_group_size"
    )


@contextlib.contextmanager
def attention_path(model: Any, path: str | None) -> Iterator[None]:
    """Within the block, ``model``'s attention over a quantized cache (this instance only)
    takes ``path`` (``"dequantize"``: :func:`dequantized_attention`; else unchanged)."""
    if path != "dequantize":
        yield
        return
    with hooks_of(model).using(quantized=dequantized_attention):
        yield
