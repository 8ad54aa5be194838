"""What a projection's launch costs the host by row count (issue 39's B = 1 on CUDA): a chain of
the 1B-shaped llama's seven projections x 16 layers (113 matmuls with the read-out), bf16,
``x [M, K] @ W.T`` for ``M`` = 1, 2, 8, 32; per M the median over ``--steps`` of the wall time
inside ``mx.async_eval`` (the launch), the whole step (launch, then wait), and, for ``M = 2``,
the same chain with the input padded from one row by a concatenate and the output sliced back
(what the batch-invariant mode runs for a lone row). JSON lines.

    python scripts/lab/gpu_matmul_launch.py --device gpu
"""

import argparse
import json
import statistics
import time

import workbench  # noqa: F401

import mlx.core as mx

SHAPES = [(2048, 2048), (512, 2048), (512, 2048), (2048, 2048), (8192, 2048), (8192, 2048), (2048, 8192)]


def chain(weights, head, x, pad):
    outs = []
    for layer in weights:
        for w in layer:
            K = w.shape[1]
            xi = x[:, :K] if K <= x.shape[1] else mx.concatenate([x] * (K // x.shape[1]), axis=1)
            if pad:
                xi = mx.concatenate([xi, mx.zeros_like(xi)])
            y = xi @ w.T
            outs.append(y[:1] if pad else y)
    outs.append(x @ head.T)
    return outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=16)
    args = ap.parse_args()
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    weights = [[mx.random.normal(s).astype(mx.bfloat16) for s in SHAPES] for _ in range(args.layers)]
    head = mx.random.normal((128256 if args.device == "gpu" else 4096, 2048)).astype(mx.bfloat16)
    mx.eval(weights, head)
    for M, pad in ((1, False), (2, False), (1, True), (8, False), (32, False)):
        x = mx.random.normal((M, 2048)).astype(mx.bfloat16)
        mx.eval(x)
        launch, total = [], []
        for _ in range(args.steps + 3):
            t0 = time.perf_counter()
            outs = chain(weights, head, x, pad)
            t1 = time.perf_counter()
            mx.async_eval(outs)
            t2 = time.perf_counter()
            mx.eval(outs)
            t3 = time.perf_counter()
            launch.append(t2 - t1)
            total.append(t3 - t0)
        line = {
            "M": M,
            "padded_from_one_row": pad,
            "matmuls": 7 * args.layers + 1,
            "launch_ms": round(1e3 * statistics.median(launch[3:]), 3),
            "step_ms": round(1e3 * statistics.median(total[3:]), 3),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
