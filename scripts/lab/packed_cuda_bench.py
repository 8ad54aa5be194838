"""Times the packed layout's decode attention on CUDA: the paged-attention kernel
(``workbench.engine.packed.cuda_attention.paged_decode_attention``, reading the pools through the
page tables) against the gather path it replaces (``grouped_attention``'s decode group: every
row's pages gathered into ``[R, n_kv_heads, L_max, head_dim]``, then MLX's attention with the
length mask), on the 1B shape (32 query heads, 8 KV heads, head dim 64, bf16), ``R`` = 1, 32,
128 rows of 512-2048 tokens (uniform) in pages of 16 handed out in turn (scattered, as in a
running engine), one pool pair per layer, ``--layers`` layers in one eval (median of 20).

Per row count and kernel layout (``--layouts``: warps per block and bytes a lane loads,
``cuda_attention.Layout``; the first is the engine's default) it prints the largest |kernel -
gather path| and |kernel - float32 reference|, both times, gather / kernel, the kernel's
splits, and the host time to build each path's index arrays for a step (``groups_of`` vs
``decode_pages``, once for all layers); then every row as a JSON line.

Usage (on a CUDA machine): ``python scripts/lab/packed_cuda_bench.py [--batch 1 32 128]
[--page-size 16] [--layers 16] [--dtype bfloat16] [--layouts 4:16 8:16 4:8] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from workbench.engine.packed import cuda_attention as ca  # noqa: E402
from workbench.engine.packed.grouped import grouped_attention, groups_of  # noqa: E402
from workbench.engine.packed.pages import PageTable  # noqa: E402
from workbench.observe.packed import Chunk  # noqa: E402

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from gpu_padded_attention import timed  # noqa: E402
from gpu_step_profile import emit_jsonl  # noqa: E402

N_HEADS, N_KV, HEAD_DIM = 32, 8, 64  # workbench.bench.gpu.LLAMA_1B's attention


def running_table(page_size: int, lengths: list[int]) -> PageTable:
    """Rows ``0 .. R-1`` holding ``lengths`` tokens, grown one page at a time in turn."""
    table = PageTable(page_size)
    for step in range(1, table.pages_for(max(lengths)) + 1):
        for uid, n in enumerate(lengths):
            table.reserve(uid, min(n, step * page_size))
    return table


def host_ms(fn, n=20) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def case(R: int, page_size: int, layers: int, dtype, layouts: list[ca.Layout]) -> list[dict]:
    """One row per kernel layout for ``R`` decode rows (the gather path timed once)."""
    rng = np.random.default_rng(R)
    lengths = [int(n) for n in rng.integers(512, 2049, R)]
    table = running_table(page_size, lengths)
    chunks = [Chunk(u, n - 1, 1, "decode") for u, n in enumerate(lengths)]
    N = table.capacity * page_size
    pools = [
        (
            mx.random.normal((N, N_KV, HEAD_DIM)).astype(dtype),
            mx.random.normal((N, N_KV, HEAD_DIM)).astype(dtype),
        )
        for _ in range(layers)
    ]
    q = mx.random.normal((1, N_HEADS, R, HEAD_DIM)).astype(dtype)
    mx.eval(pools, q)
    groups, pages = groups_of(table, chunks), ca.decode_pages(table, chunks)
    scale = HEAD_DIM**-0.5
    k0, v0 = pools[0]
    gathered = grouped_attention(q, k0, v0, groups, scale).astype(mx.float32)
    ref = ca.paged_decode_reference(
        q.astype(mx.float32), k0.astype(mx.float32), v0.astype(mx.float32), pages, scale
    )
    base = {
        "rows": R,
        "dtype": str(dtype),
        "page_size": page_size,
        "layers": layers,
        "length_min": min(lengths),
        "length_mean": round(statistics.mean(lengths), 1),
        "length_max": max(lengths),
        "gather_ms": timed(lambda: [grouped_attention(q, k, v, groups, scale) for k, v in pools]),
        "host_groups_ms": host_ms(lambda: groups_of(table, chunks)),
        "host_pages_ms": host_ms(lambda: ca.decode_pages(table, chunks)),
    }
    out = []
    for lay in layouts:
        got = ca.paged_decode_attention(q, k0, v0, pages, scale, layout=lay).astype(mx.float32)
        kernel_ms = timed(
            lambda lay=lay: [ca.paged_decode_attention(q, k, v, pages, scale, layout=lay) for k, v in pools]
        )
        out.append(
            base
            | {
                "warps": lay.warps,
                "lane_bytes": lay.lane_bytes,
                "splits": ca.split_plan(R, N_KV, pages.page_table.shape[1], min_pages=lay.warps)[0],
                "max_abs_vs_gather": mx.abs(got - gathered).max().item(),
                "max_abs_vs_reference": mx.abs(got - ref).max().item(),
                "kernel_ms": kernel_ms,
                "gather_over_kernel": base["gather_ms"] / kernel_ms,
            }
        )
    return out


def line(row: dict) -> str:
    return (
        f"R={row['rows']:>3} {row['dtype']} L {row['length_min']}-{row['length_max']} "
        f"(mean {row['length_mean']}), {row['layers']} layers, kernel {row['warps']} warps x "
        f"{row['lane_bytes']} B/lane: gather {row['gather_ms']:.3f} ms, kernel {row['kernel_ms']:.3f} ms "
        f"({row['splits']} split(s)), gather/kernel {row['gather_over_kernel']:.2f}x; |kernel - gather| "
        f"{row['max_abs_vs_gather']:.2g}, |kernel - ref| {row['max_abs_vs_reference']:.2g}; host index "
        f"arrays {row['host_groups_ms']:.2f} ms (groups) vs {row['host_pages_ms']:.2f} ms (pages)"
    )


def layout_of(text: str) -> ca.Layout:
    """``"warps:lane_bytes"`` -> a :class:`~workbench.engine.packed.cuda_attention.Layout`."""
    warps, lane_bytes = (int(x) for x in text.split(":"))
    return ca.Layout(warps, lane_bytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128], help="decode rows R")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument(
        "--layouts",
        nargs="+",
        default=["4:16", "8:16", "4:8"],
        help="kernel layouts, warps:lane_bytes (first: default)",
    )
    ap.add_argument("--out", type=Path, help="also write the rows as JSON lines to this file")
    a = ap.parse_args()
    dtype, layouts = getattr(mx, a.dtype), [layout_of(t) for t in a.layouts]
    rows = []
    for R in a.batch:
        for row in case(R, a.page_size, a.layers, dtype, layouts):
            rows.append(row)
            print(line(row), flush=True)
    emit_jsonl(rows, a.out)


if __name__ == "__main__":
    main()
