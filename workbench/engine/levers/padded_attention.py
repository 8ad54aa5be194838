"""Decode attention over left-padded rows without a mask array, on CUDA: one fused kernel
that starts each row at its own left padding (row ``b`` attends columns
``left_padding[b] .. idx - 1`` of mlx-lm's ``BatchKVCache`` buffers), within float rounding
of ``mx.fast.scaled_dot_product_attention`` with the padding mask. Why and how:
``docs/lab/engine-notes.md``, "levers/padded_attention.py".
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import mlx.core as mx

WARPS = 4  # warps per (row, query head): the columns are split between them
HEAD_DIMS = (64, 128)  # head dims the kernel is built for (lanes hold head_dim / 32 each)
DTYPES = (mx.float16, mx.bfloat16, mx.float32)  # input dtypes it serves (accumulating in float32)

_SOURCE = """
    constexpr int W = WARPS_T;
    constexpr int P = D / 32;
    int lane = threadIdx.x % 32;
    int w = threadIdx.x / 32;
    int S = dims[0], n = dims[1], Hq = dims[2], Hkv = dims[3], B = dims[4];
    int bh = blockIdx.x;
    if (bh >= B * Hq) return;
    int b = bh / Hq, h = bh % Hq, hk = h / (Hq / Hkv);
    float sc = scale[0];
    float qv[P];
    #pragma unroll
    for (int i = 0; i < P; ++i) qv[i] = static_cast<float>(q[(size_t)bh * D + lane * P + i]) * sc;
    const T* kb = k + (size_t)(b * Hkv + hk) * S * D + lane * P;
    const T* vb = v + (size_t)(b * Hkv + hk) * S * D + lane * P;
    float m = -INFINITY, l = 0.f, acc[P];
    #pragma unroll
    for (int i = 0; i < P; ++i) acc[i] = 0.f;
    #pragma unroll 4
    for (int s = left_padding[b] + w; s < n; s += W) {
        float part = 0.f;
        #pragma unroll
        for (int i = 0; i < P; ++i) part += qv[i] * static_cast<float>(kb[(size_t)s * D + i]);
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffff, part, off);
        float m_new = fmaxf(m, part);
        float corr = (m == -INFINITY) ? 0.f : expf(m - m_new);
        float p = expf(part - m_new);
        l = l * corr + p;
        #pragma unroll
        for (int i = 0; i < P; ++i) acc[i] = acc[i] * corr + p * static_cast<float>(vb[(size_t)s * D + i]);
        m = m_new;
    }
    __shared__ float sm_m[W];
    __shared__ float sm_l[W];
    __shared__ float sm_acc[W][D];
    if (lane == 0) { sm_m[w] = m; sm_l[w] = l; }
    #pragma unroll
    for (int i = 0; i < P; ++i) sm_acc[w][lane * P + i] = acc[i];
    __syncthreads();
    if (w == 0) {
        float M = -INFINITY;
        for (int j = 0; j < W; ++j) M = fmaxf(M, sm_m[j]);
        float L = 0.f, o[P];
        #pragma unroll
        for (int i = 0; i < P; ++i) o[i] = 0.f;
        for (int j = 0; j < W; ++j) {
            float c = (sm_m[j] == -INFINITY) ? 0.f : expf(sm_m[j] - M);
            L += sm_l[j] * c;
            #pragma unroll
            for (int i = 0; i < P; ++i) o[i] += sm_acc[j][lane * P + i] * c;
        }
        #pragma unroll
        for (int i = 0; i < P; ++i) out[(size_t)bh * D + lane * P + i] = static_cast<T>(o[i] / L);
    }
"""


@lru_cache(maxsize=1)
def _kernel() -> Any:
    return mx.fast.cuda_kernel(
        name="workbench_padded_decode_attention",
        input_names=["q", "k", "v", "left_padding", "dims", "scale"],
        output_names=["out"],
        source=_SOURCE.replace("WARPS_T", str(WARPS)),
    )


@lru_cache(maxsize=4)
def _step_constants(
    S: int, columns: int, n_q: int, n_kv: int, B: int, scale: float
) -> tuple[mx.array, mx.array]:
    """The kernel's ``dims`` and ``scale`` inputs, made once per step for every layer."""
    return mx.array([S, columns, n_q, n_kv, B], dtype=mx.int32), mx.array([scale], dtype=mx.float32)


def supported(queries: mx.array, keys: mx.array) -> bool:
    """True when :func:`padded_decode_attention` serves these shapes (one query per row, head
    dim in :data:`HEAD_DIMS`, GQA, float16 / bfloat16 / float32)."""
    return (
        queries.ndim == 4
        and queries.shape[2] == 1
        and queries.shape[-1] == keys.shape[-1]
        and queries.shape[-1] in HEAD_DIMS
        and queries.shape[1] % keys.shape[1] == 0
        and queries.dtype in DTYPES
        and keys.dtype == queries.dtype
    )


def padded_decode_attention(
    queries: mx.array, keys: mx.array, values: mx.array, left_padding: mx.array, columns: int, scale: float
) -> mx.array:
    """One decode step's attention over left-padded rows, on CUDA, without a mask array.

    Row ``b`` attends columns ``left_padding[b] .. columns - 1``: the masked fused attention
    with ``BatchKVCache.make_mask(1)``, within float rounding.

    Args:
        queries: ``[B, n_q_heads, 1, head_dim]``, the step's queries (RoPE applied).
        keys, values: a ``BatchKVCache``'s whole buffers ``[B, n_kv_heads, S, head_dim]``
            (``S >= columns``; row-contiguous, as mlx-lm allocates them).
        left_padding: ``[B]`` int, each row's padding columns.
        columns: the cache's write index after this step's token (tokens).
        scale: the softmax scale (``head_dim ** -0.5`` for llama).

    Returns:
        ``[B, n_q_heads, 1, head_dim]`` in the queries' dtype.

    Raises:
        ValueError: shapes or dtypes :func:`supported` refuses, or ``columns`` outside
            ``1 .. S``.
    """
    if not supported(queries, keys) or values.shape != keys.shape:
        raise ValueError(
            f"padded_decode_attention serves one-query steps with head_dim in {HEAD_DIMS} and "
            f"matching dtypes; got queries {queries.shape} {queries.dtype}, keys {keys.shape} "
            f"{keys.dtype}, values {values.shape}"
        )
    B, n_q, _, D = queries.shape
    _, n_kv, S, _ = keys.shape
    if not 1 <= columns <= S:
        raise ValueError(f"columns must be in 1..{S} (the buffers' width), got {columns}")
    dims, scale_array = _step_constants(S, columns, n_q, n_kv, B, float(scale))
    threads = 32 * WARPS
    if left_padding.dtype != mx.int32:
        left_padding = left_padding.astype(mx.int32)
    return _kernel()(
        inputs=[queries, keys, values, left_padding, dims, scale_array],
        template=[("T", queries.dtype), ("D", D)],
        grid=(B * n_q * threads, 1, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[queries.shape],
        output_dtypes=[queries.dtype],
    )[0]
