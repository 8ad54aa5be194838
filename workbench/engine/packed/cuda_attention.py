"""Paged attention for a packed forward's decode tokens, on CUDA: one fused kernel that reads
each row's keys and values straight from the page pools through its page table (no gather
into a padded block, as :mod:`workbench.engine.packed.grouped` does).

Laid out as vLLM's ``paged_attention_v1`` / ``v2`` kernels (block tables ``[R, max pages]``
and lengths ``[R]`` in; a long row split into partitions that a reduce kernel merges) with
FlashInfer's GQA grouping (one block per KV head serves the query heads that share it), an
online softmax in float32. The same arithmetic in MLX ops: :func:`paged_decode_reference`.
Work layout in detail: ``docs/lab/engine-notes.md``, "packed/cuda_attention.py".

Axis letters: ``R`` decode rows, ``P`` page-table width (pages of the longest row), ``N``
pool slots, ``H`` query heads, ``Hkv`` KV heads, ``G = H / Hkv``, ``D`` head dim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import mlx.core as mx
import numpy as np

from ...observe.packed import DECODE, Chunk
from .grouped import Groups, grouped_attention
from .indices import ForwardIndex, forward_index
from .pages import PageTable

HEAD_DIMS = (32, 64, 128)  # head dims served: head_dim / VEC lanes per token must divide 32
DTYPES = (mx.float16, mx.bfloat16, mx.float32)  # pool and query dtypes served (float32 accumulation)
MAX_GROUP = 8  # most query heads per KV head (the kernel keeps G states per lane in registers)
TARGET_BLOCKS = 264  # blocks that fill an H200's 132 SMs twice: rows x KV heads fewer than this split


@dataclass(frozen=True)
class Layout:
    """How the kernel spreads a block's work: ``warps`` per block (row, KV head, split) and
    ``lane_bytes`` of a key or value row per lane."""

    warps: int = 4
    lane_bytes: int = 16

    def vec(self, dtype: mx.Dtype, head_dim: int) -> int:
        """Elements a lane holds: ``lane_bytes / itemsize``, at least ``head_dim / 32``."""
        return max(self.lane_bytes // dtype.size, head_dim // 32, 1)


LAYOUT = Layout()  # the default (tests/engine/test_packed_cuda.py checks others on the GPU)

_HEADER = """
// VEC elements of a row into float registers: one vector load where the pointer allows it.
template <int VEC, typename T>
__device__ inline void load_floats(const T* p, bool vector_ok, float* out) {
    if (vector_ok) {
        auto x = *reinterpret_cast<const mlx::core::cu::AlignedVector<T, VEC>*>(p);
        #pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] = static_cast<float>(x.val[i]);
    } else {
        #pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] = static_cast<float>(p[i]);
    }
}
"""

_BODY = """
    constexpr int LPT = D / VEC;   // lanes per token (each holds VEC contiguous elements)
    constexpr int TPW = 32 / LPT;  // tokens a warp takes at once (one per lane group)
    constexpr unsigned FULL = 0xffffffffu;
    const float NEG = -cuda::std::numeric_limits<float>::infinity();
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    int g = lane / LPT, li = lane % LPT;
    int R = dims[0], Hkv = dims[1], MAXP = dims[2], PPS = dims[3], SPLITS = dims[4];
    int Hq = Hkv * G;
    int split = blockIdx.x % SPLITS, rk = blockIdx.x / SPLITS;
    if (rk >= R * Hkv) return;
    int r = rk / Hkv, hk = rk % Hkv;
    int L = lengths[r];
    int n_pages = (L + PS - 1) / PS;
    int p0 = split * PPS;
    int p1 = (p0 + PPS < n_pages) ? p0 + PPS : n_pages;
    bool vector_ok = mlx::core::cu::is_aligned<VEC>(k_pool) && mlx::core::cu::is_aligned<VEC>(v_pool);
    float sc = scale[0];
    float qv[G][VEC], acc[G][VEC], m[G], l[G];
    #pragma unroll
    for (int j = 0; j < G; ++j) {
        m[j] = NEG;
        l[j] = 0.f;
        #pragma unroll
        for (int i = 0; i < VEC; ++i) {
            qv[j][i] = static_cast<float>(q[((size_t)r * Hq + hk * G + j) * D + li * VEC + i]) * sc;
            acc[j][i] = 0.f;
        }
    }
    const int* pt = page_table + (size_t)r * MAXP;
    for (int p = p0 + w; p < p1; p += WARPS) {
        int page = pt[p];
        #pragma unroll
        for (int t0 = 0; t0 < PS; t0 += TPW) {
            int t = t0 + g;
            bool valid = t < PS && p * PS + t < L;
            float kv[VEC], vv[VEC];
            if (valid) {
                size_t at = ((size_t)page * PS + t) * Hkv * D + (size_t)hk * D + li * VEC;
                load_floats<VEC>(k_pool + at, vector_ok, kv);
                load_floats<VEC>(v_pool + at, vector_ok, vv);
            } else {
                #pragma unroll
                for (int i = 0; i < VEC; ++i) { kv[i] = 0.f; vv[i] = 0.f; }
            }
            #pragma unroll
            for (int j = 0; j < G; ++j) {
                float s = 0.f;
                #pragma unroll
                for (int i = 0; i < VEC; ++i) s += qv[j][i] * kv[i];
                #pragma unroll
                for (int off = LPT / 2; off > 0; off >>= 1) s += __shfl_xor_sync(FULL, s, off);
                if (valid) {
                    float mn = fmaxf(m[j], s);
                    float corr = (m[j] == NEG) ? 0.f : expf(m[j] - mn);
                    float e = expf(s - mn);
                    l[j] = l[j] * corr + e;
                    #pragma unroll
                    for (int i = 0; i < VEC; ++i) acc[j][i] = acc[j][i] * corr + e * vv[i];
                    m[j] = mn;
                }
            }
        }
    }
    #pragma unroll
    for (int off = LPT; off < 32; off <<= 1) {
        #pragma unroll
        for (int j = 0; j < G; ++j) {
            float mo = __shfl_xor_sync(FULL, m[j], off);
            float lo = __shfl_xor_sync(FULL, l[j], off);
            float mn = fmaxf(m[j], mo);
            float ca = (m[j] == NEG) ? 0.f : expf(m[j] - mn);
            float cb = (mo == NEG) ? 0.f : expf(mo - mn);
            l[j] = l[j] * ca + lo * cb;
            #pragma unroll
            for (int i = 0; i < VEC; ++i) {
                float ao = __shfl_xor_sync(FULL, acc[j][i], off);
                acc[j][i] = acc[j][i] * ca + ao * cb;
            }
            m[j] = mn;
        }
    }
    __shared__ float sm_m[WARPS][G];
    __shared__ float sm_l[WARPS][G];
    __shared__ float sm_acc[WARPS][G][D];
    if (g == 0) {
        #pragma unroll
        for (int j = 0; j < G; ++j) {
            if (li == 0) { sm_m[w][j] = m[j]; sm_l[w][j] = l[j]; }
            #pragma unroll
            for (int i = 0; i < VEC; ++i) sm_acc[w][j][li * VEC + i] = acc[j][i];
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < G * D; e += 32 * WARPS) {
        int j = e / D, d = e % D, h = hk * G + j;
        float M = NEG;
        #pragma unroll
        for (int x = 0; x < WARPS; ++x) M = fmaxf(M, sm_m[x][j]);
        float lsum = 0.f, o = 0.f;
        #pragma unroll
        for (int x = 0; x < WARPS; ++x) {
            float c = (sm_m[x][j] == NEG) ? 0.f : expf(sm_m[x][j] - M);
            lsum += sm_l[x][j] * c;
            o += sm_acc[x][j][d] * c;
        }
"""

_WRITE_OUT = """
        out[((size_t)r * Hq + h) * D + d] = static_cast<T>(lsum > 0.f ? o / lsum : 0.f);
    }
"""

_WRITE_PARTS = """
        size_t at = ((size_t)r * Hq + h) * SPLITS + split;
        part_acc[at * D + d] = o;
        if (d == 0) { part_ml[at * 2] = M; part_ml[at * 2 + 1] = lsum; }
    }
"""

_REDUCE = """
    const float NEG = -cuda::std::numeric_limits<float>::infinity();
    int R = dims[0], Hq = dims[1], S = dims[2];
    int rh = blockIdx.x, d = threadIdx.x;
    if (rh >= R * Hq || d >= D) return;
    int r = rh / Hq, h = rh % Hq;
    const float* ml = part_ml + (size_t)rh * S * 2;
    const float* pa = part_acc + (size_t)rh * S * D;
    float M = NEG;
    for (int s = 0; s < S; ++s) M = fmaxf(M, ml[2 * s]);
    float lsum = 0.f, o = 0.f;
    for (int s = 0; s < S; ++s) {
        float c = (ml[2 * s] == NEG) ? 0.f : expf(ml[2 * s] - M);
        lsum += ml[2 * s + 1] * c;
        o += pa[(size_t)s * D + d] * c;
    }
    out[((size_t)r * Hq + h) * D + d] = static_cast<T>(lsum > 0.f ? o / lsum : 0.f);
"""

_INPUTS = ["q", "k_pool", "v_pool", "page_table", "lengths", "dims", "scale"]


@lru_cache(maxsize=2)
def _kernel(split: bool) -> Any:
    """The attention kernel: writing the output (one split) or partial states (``split``)."""
    if split:
        return mx.fast.cuda_kernel(
            name="workbench_paged_decode_split",
            input_names=_INPUTS,
            output_names=["part_ml", "part_acc"],
            source=_BODY + _WRITE_PARTS,
            header=_HEADER,
        )
    return mx.fast.cuda_kernel(
        name="workbench_paged_decode",
        input_names=_INPUTS,
        output_names=["out"],
        source=_BODY + _WRITE_OUT,
        header=_HEADER,
    )


@lru_cache(maxsize=1)
def _reduce_kernel() -> Any:
    return mx.fast.cuda_kernel(
        name="workbench_paged_decode_reduce",
        input_names=["part_ml", "part_acc", "dims"],
        output_names=["out"],
        source=_REDUCE,
    )


@dataclass(frozen=True)
class DecodePages:
    """The decode rows of one packed forward, as the kernel reads them (shared by every layer).

    Attributes:
        n_rows: decode rows ``R`` (the leading 1-token decode chunks).
        page_table: ``[R, P]`` int32 page ids of each row's pages, right-padded with page 0.
        lengths: ``[R]`` int32 keys of each row after the step (``>= 1``).
        page_size: positions per page. max_length: the longest row's length (host int).
    """

    n_rows: int
    page_table: mx.array
    lengths: mx.array
    page_size: int
    max_length: int


def leading_decodes(chunks: Sequence[Chunk]) -> int:
    """How many of ``chunks`` lead with one decode token each (the plan puts them first)."""
    return next((i for i, c in enumerate(chunks) if c.kind != DECODE or c.n_tokens != 1), len(chunks))


def decode_pages(
    table: PageTable, chunks: Sequence[Chunk], index: ForwardIndex | None = None
) -> DecodePages | None:
    """The :class:`DecodePages` of ``chunks``' leading decode rows over ``table`` (``None``: none).

    Raises:
        ValueError: a row whose length runs beyond its pages.
    """
    R = leading_decodes(chunks)
    if not R:
        return None
    index = forward_index(table, chunks[:R]) if index is None else index
    P, ends = table.page_size, index.ends[:R]
    bad = np.flatnonzero(index.held[:R] * P < ends)
    if bad.size:
        c = chunks[bad[0]]
        raise ValueError(f"uid {c.uid}: {c.end} keys but only {index.held[bad[0]]} page(s) of {P}")
    grid = index.page_grid(0, R)
    return DecodePages(R, mx.array(grid), mx.array(ends.astype(np.int32)), P, int(ends.max()))


def serves(n_heads: int, pool: mx.array | None) -> bool:
    """True when the kernel serves ``n_heads`` query heads over a pool ``[N, n_kv_heads,
    head_dim]`` (:data:`HEAD_DIMS`, :data:`DTYPES`, :data:`MAX_GROUP`; ``None``: False)."""
    if pool is None or pool.ndim != 3:
        return False
    n_kv, D = pool.shape[1], pool.shape[2]
    return (
        D in HEAD_DIMS and pool.dtype in DTYPES and n_heads % n_kv == 0 and 1 <= n_heads // n_kv <= MAX_GROUP
    )


def _check(queries: mx.array, k_pool: mx.array, v_pool: mx.array, pages: DecodePages) -> None:
    """Raise ``ValueError`` unless the shapes and dtypes are what :func:`paged_decode_attention` serves."""
    ok = (
        queries.ndim == 4
        and (queries.shape[0], queries.shape[2]) in ((1, pages.n_rows), (pages.n_rows, 1))
        and v_pool.shape == k_pool.shape
        and queries.shape[-1] == k_pool.shape[-1]
        and serves(queries.shape[1], k_pool)
        and queries.dtype == k_pool.dtype == v_pool.dtype
    )
    if not ok:
        raise ValueError(
            f"paged_decode_attention serves queries [1, H, {pages.n_rows}, D] or [{pages.n_rows}, H, 1, D] "
            f"over pools [N, n_kv_heads, D] "
            f"of one dtype in {DTYPES}, D in {HEAD_DIMS}, H a multiple of n_kv_heads by at most "
            f"{MAX_GROUP}; got queries {queries.shape} {queries.dtype}, pools {k_pool.shape} {k_pool.dtype} "
            f"and {v_pool.shape} {v_pool.dtype}"
        )


def split_plan(
    n_rows: int, n_kv_heads: int, max_pages: int, splits: int | None = None, min_pages: int = LAYOUT.warps
) -> tuple[int, int]:
    """``(splits, pages per split)`` for rows of at most ``max_pages`` pages, aiming at
    :data:`TARGET_BLOCKS` blocks with at least ``min_pages`` pages a split."""
    want = splits if splits is not None else math.ceil(TARGET_BLOCKS / max(1, n_rows * n_kv_heads))
    want = max(1, min(want, max_pages))
    per = math.ceil(max_pages / want)
    if splits is None:
        per = max(per, min(min_pages, max_pages))
    return math.ceil(max_pages / per), per


@lru_cache(maxsize=8)
def _scale_array(scale: float) -> mx.array:
    return mx.array([scale], dtype=mx.float32)


@lru_cache(maxsize=8)
def _dims(*dims: int) -> mx.array:
    """A kernel's ``dims`` input, made once per step's shapes and shared by every layer."""
    return mx.array(dims, dtype=mx.int32)


def paged_decode_attention(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    pages: DecodePages,
    scale: float,
    splits: int | None = None,
    layout: Layout = LAYOUT,
) -> mx.array:
    """One-query attention of each decode row over its own pages, on CUDA.

    Row ``r`` (query ``queries[0, :, r]``) attends its positions ``0 .. lengths[r] - 1``,
    read from the pools at ``page_table[r, p // page_size] * page_size + p % page_size``;
    query head ``h`` uses KV head ``h // (H / n_kv_heads)``. Equals
    :func:`paged_decode_reference` within float rounding; stands in for mlx-lm's
    ``scaled_dot_product_attention`` over a gathered, length-masked block.

    Args:
        queries: ``[1, H, R, D]`` the decode tokens' queries (RoPE applied), or ``[R, H, 1, D]``
            (decode rows, :mod:`~workbench.engine.packed.decode_rows`: read as they are, no copy).
        k_pool, v_pool: one layer's pools ``[N, n_kv_heads, D]``, row-contiguous.
        pages: the rows' :class:`DecodePages`.
        scale: the softmax scale (``head_dim ** -0.5`` for llama).
        splits: how many splits a row's pages are cut into (default: :func:`split_plan`).
        layout: warps per block and bytes per lane (:class:`Layout`).

    Returns:
        ``[1, H, R, D]`` in the queries' dtype (a view of the ``[R, H, 1, D]`` the kernel
        writes), or ``[R, H, 1, D]`` for rows.

    Raises:
        ValueError: shapes or dtypes it does not serve (see :func:`serves`).

    Example::

        pages = decode_pages(table, chunks)  # the forward's leading decode rows
        out = paged_decode_attention(queries[:, :, : pages.n_rows], k_pool, v_pool, pages, head_dim**-0.5)
    """
    _check(queries, k_pool, v_pool, pages)
    R, H, D = pages.n_rows, queries.shape[1], queries.shape[3]
    rows = queries.shape[0] == R > 1  # [R, H, 1, D]: already the kernel's [R, H, D] order
    n_kv = k_pool.shape[1]
    n_splits, per = split_plan(R, n_kv, pages.page_table.shape[1], splits, layout.warps)
    dims = _dims(R, n_kv, pages.page_table.shape[1], per, n_splits)
    q = queries if rows or R == 1 else mx.swapaxes(mx.squeeze(queries, 0), 0, 1)  # [R, H, (1,) D]
    template = [("T", queries.dtype), ("D", D), ("G", H // n_kv), ("PS", pages.page_size)]
    template += [("VEC", layout.vec(queries.dtype, D)), ("WARPS", layout.warps)]
    args = dict(
        inputs=[q, k_pool, v_pool, pages.page_table, pages.lengths, dims, _scale_array(float(scale))],
        template=template,
        grid=(R * n_kv * n_splits * 32 * layout.warps, 1, 1),
        threadgroup=(32 * layout.warps, 1, 1),
    )
    if n_splits == 1:  # written [R, H, 1, D]
        out = _kernel(False)(**args, output_shapes=[(R, H, 1, D)], output_dtypes=[queries.dtype])[0]
    else:
        out = _split_and_reduce(args, (R, H, D), n_splits, queries.dtype)
    return out if rows or R == 1 else out.transpose(2, 1, 0, 3)  # [1, H, R, D]: a view


def _split_and_reduce(args: dict, shape: tuple[int, int, int], n_splits: int, dtype: mx.Dtype) -> mx.array:
    """The split kernel's partial states ``[R, H, splits, 2]`` (maximum, sum) and ``[R, H,
    splits, D]`` (float32), merged by :data:`_REDUCE` into ``[R, H, 1, D]`` ``dtype``."""
    R, H, D = shape
    ml, acc = _kernel(True)(
        **args, output_shapes=[(R, H, n_splits, 2), (R, H, n_splits, D)], output_dtypes=[mx.float32] * 2
    )
    return _reduce_kernel()(
        inputs=[ml, acc, _dims(R, H, n_splits)],
        template=[("T", dtype), ("D", D)],
        grid=(R * H * D, 1, 1),
        threadgroup=(D, 1, 1),
        output_shapes=[(R, H, 1, D)],
        output_dtypes=[dtype],
    )[0]


def paged_decode_reference(
    queries: mx.array, k_pool: mx.array, v_pool: mx.array, pages: DecodePages, scale: float
) -> mx.array:
    """What :func:`paged_decode_attention` computes, in MLX ops on any device (float32 scores,
    summed elementwise so TF32 matmuls do not touch them; holds ``[R, n_kv_heads, G, S, D]``).

    Args and returns: as :func:`paged_decode_attention` (``[1, H, R, D]``, or ``[R, H, 1, D]``).
    """
    if queries.shape[0] == pages.n_rows > 1:  # decode rows [R, H, 1, D]
        return paged_decode_reference(queries.transpose(2, 1, 0, 3), k_pool, v_pool, pages, scale).transpose(
            2, 1, 0, 3
        )
    _, H, R, D = queries.shape
    n_kv, P = k_pool.shape[1], pages.page_size
    pos = mx.arange(pages.page_table.shape[1] * P)
    valid = pos[None, :] < pages.lengths[:, None]  # [R, S]
    slots = mx.where(valid, pages.page_table[:, pos // P] * P + pos % P, 0)  # [R, S]
    k = mx.swapaxes(k_pool[slots].astype(mx.float32), 1, 2)  # [R, n_kv, S, D]
    v = mx.swapaxes(mx.where(valid[..., None, None], v_pool[slots].astype(mx.float32), 0), 1, 2)
    q = queries[0].astype(mx.float32) * scale  # [H, R, D]
    q = q.reshape(n_kv, H // n_kv, R, D).transpose(2, 0, 1, 3)  # [R, n_kv, G, D]
    dots = (q[:, :, :, None, :] * k[:, :, None]).sum(-1)  # [R, n_kv, G, S]
    p = mx.softmax(mx.where(valid[:, None, None, :], dots, -mx.inf), axis=-1, precise=True)
    o = (p[..., None] * v[:, :, None]).sum(-2)  # [R, n_kv, G, D]
    return mx.swapaxes(o.reshape(R, H, D), 0, 1)[None].astype(queries.dtype)


def packed_attention(
    queries: mx.array, k_pool: mx.array, v_pool: mx.array, pages: DecodePages, rest: Groups, scale: float
) -> mx.array:
    """Attention of queries ``[1, H, T, D]``: the first ``R`` by :func:`paged_decode_attention`,
    the rest by groups (``rest``). Returns ``[1, H, T, D]``."""
    R = pages.n_rows
    out = paged_decode_attention(queries[:, :, :R], k_pool, v_pool, pages, scale)
    if not rest.chunks:
        return out
    others = grouped_attention(queries[:, :, R:], k_pool, v_pool, rest, scale)
    return mx.concatenate([out, others], axis=2)
