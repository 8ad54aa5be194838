"""Checks and times ``workbench.engine.levers.padded_attention`` on CUDA against MLX's attention with
mlx-lm's padding mask (issue 15). For each batch size, dtype and head dim: the largest
|difference| from ``mx.fast.scaled_dot_product_attention(..., mask=BatchKVCache-style mask)``
and the time of ``layers`` attentions in one eval, kernel vs masked vs unmasked (no padding
honoured: the fused kernel's speed, the floor).

Usage (on a CUDA machine): ``python scripts/lab/gpu_padded_attention.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workbench.engine.levers.padded_attention import padded_decode_attention  # noqa: E402

import mlx.core as mx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_step_profile import emit_jsonl  # noqa: E402


def timed(fn, n=20):
    mx.eval(fn())
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        mx.eval(fn())
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def case(B, dtype, D, n_q=32, n_kv=8, S=640, columns=400, layers=16):
    mx.random.seed(B + D)
    q = mx.random.normal((B, n_q, 1, D)).astype(dtype)
    ks = [mx.random.normal((B, n_kv, S, D)).astype(dtype) for _ in range(layers)]
    vs = [mx.random.normal((B, n_kv, S, D)).astype(dtype) for _ in range(layers)]
    lp = mx.array([0] if B == 1 else [(37 * i) % 300 for i in range(B)])
    cols = mx.arange(columns)
    mask = (cols[None, :] >= lp[:, None])[:, None, None, :]  # [B, 1, 1, columns]
    scale = D**-0.5
    ref = mx.fast.scaled_dot_product_attention(
        q, ks[0][..., :columns, :], vs[0][..., :columns, :], scale=scale, mask=mask
    )
    got = padded_decode_attention(q, ks[0], vs[0], lp, columns, scale)
    err = mx.abs(got.astype(mx.float32) - ref.astype(mx.float32)).max().item()
    return {
        "B": B,
        "dtype": str(dtype),
        "head_dim": D,
        "columns": columns,
        "max_abs_diff": err,
        "kernel_ms": timed(
            lambda: [padded_decode_attention(q, k, v, lp, columns, scale) for k, v in zip(ks, vs)]
        ),
        "masked_ms": timed(
            lambda: [
                mx.fast.scaled_dot_product_attention(
                    q, k[..., :columns, :], v[..., :columns, :], scale=scale, mask=mask
                )
                for k, v in zip(ks, vs)
            ]
        ),
        "unmasked_ms": timed(
            lambda: [
                mx.fast.scaled_dot_product_attention(q, k[..., :columns, :], v[..., :columns, :], scale=scale)
                for k, v in zip(ks, vs)
            ]
        ),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="also write the rows as JSON lines to this file")
    a = ap.parse_args()
    emit_jsonl(
        (
            case(B, dtype, D)
            for D in (64, 128)
            for dtype in (mx.bfloat16, mx.float32)
            for B in (1, 8, 32, 128)
        ),
        a.out,
    )


if __name__ == "__main__":
    main()
