"""Why SmolLM2-135M's decode barely batches on the CPU (notebook 07, the ``real_decode`` rows):
its decode step at B = 1, 8, 32 with the 4-bit weights the benchmark uses, and what bounds it.

Per batch size: the step's seconds (median of ``REPS`` steps after a warm-up), the weight bytes
it reads (every parameter's ``nbytes``, read once per step whatever B is) as GB/s, and the
multiply-adds of its matmuls (``2 x parameters x B``, the tied head included) as GFLOP/s. A
memory-bound step costs about the same at any B (the weights are read once); a compute-bound
one grows with B. Then one layer's MLP matmul alone, 4-bit against float32, at B = 1 and 32: MLX's
quantized CPU matmul does not use the BLAS.

Usage: ``python scripts/lab/real_model_batching.py [--batch-sizes 1 8 32]`` (the optimized BLAS
``import workbench`` loads) or ``WORKBENCH_BLAS=off python scripts/lab/real_model_batching.py``
(MLX's reference BLAS, as nbval runs). Needs ``workbench models fetch smollm2-135m``. A run:
``docs/lab/real-model-batching-2026-12-06.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import workbench as wb
from workbench.bench.model import parameter_count
from workbench.runtime import blas

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

REPS = 3
CONTEXT = 28  # prompt tokens per row, as the benchmark's decode rows
BATCH_SIZES = (1, 8, 32)


def timed(fn, reps: int = REPS) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    args = ap.parse_args()
    model, _ = wb.load("smollm2-135m", dequantize=False)  # as converted: 4-bit, as the benchmark
    params = tree_flatten(model.parameters())
    weight_bytes = sum(v.nbytes for _, v in params)
    n_params = parameter_count(model)  # packed 4-bit weights counted unpacked
    print(
        f"BLAS: {blas.STATUS.library or 'MLX reference'} (WORKBENCH_BLAS={os.environ.get('WORKBENCH_BLAS', 'unset')})"
    )
    print(
        f"weights {weight_bytes / 2**20:.1f} MiB, {n_params / 1e6:.1f} M parameters (tied head counted once)"
    )
    mlp = model.layers[0].mlp.up_proj
    w = mx.dequantize(mlp.weight, mlp.scales, mlp.biases, mlp.group_size, mlp.bits).astype(mx.float32)
    mx.eval(w)
    print(f"one MLP up projection {tuple(w.shape)}: ms per call, 4-bit vs float32")
    for B in (1, 32):
        x = mx.random.normal((B, w.shape[1]))
        mx.eval(x)
        q = timed(lambda x=x: mx.eval(mlp(x)), 20)
        f = timed(lambda x=x: mx.eval(x @ w.T), 20)
        print(f"  B={B:>2}: 4-bit {q * 1e3:7.3f}  float32 {f * 1e3:7.3f}")

    print(" B  step (ms)  per row (ms)  tok/s  weights GB/s  GFLOP/s")
    for B in args.batch_sizes:
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([[5] * CONTEXT] * B), cache=cache))
        token = mx.array([[5]] * B)

        def step(cache=cache, token=token):
            mx.eval(model(token, cache=cache))

        s = timed(step)
        flops = 2 * n_params * B
        print(
            f"{B:>2}  {s * 1e3:9.1f}  {s * 1e3 / B:12.1f}  {B / s:5.1f}  {weight_bytes / s / 1e9:12.2f}  "
            f"{flops / s / 1e9:7.2f}"
        )


if __name__ == "__main__":
    main()
