"""What a row block costs on this CPU's BLAS: per projection shape, each run of one kernel group
that the mode's sweep finds (:func:`workbench.engine.levers.invariant_blocks.sweep`) against a
plain call, at B = 1, 8 and 32 rows (issue 39; ``docs/batch-invariance.md``, "The row blocks'
call cost"). Behind ``block_from``'s rule that a call costs ``CALL_ROWS`` rows for every weight
size: a call re-reads its weight, from memory or from cache alike.

Per shape ``(N, K)``, ``L`` random float32 weights (as ``L`` layers hold, so the cache holds what
a step's does), and per B the median over 15 evaluations of the ``L`` projections, printed in
microseconds per layer: ``plain`` (one call of B rows, the default path) and each run
``(lo, hi)`` (:func:`workbench.engine.levers.invariant.blocked` with ``RowBlocks(lo, hi)``);
first the runs of the product as ``x @ W.T`` and as ``(W @ x.T).T`` (whether the other
orientation escapes the ``M = 1`` kernel group: it does not, on OpenBLAS 0.3.21).

    python scripts/lab/invariant_call_cost.py
"""

import statistics
import time

import workbench  # noqa: F401  (loads the optimized BLAS before mlx)
from workbench.engine.levers.invariant import RowBlocks, blocked
from workbench.engine.levers.invariant_blocks import sweep

import mlx.core as mx

# (N, K, layers): the bundled model's down projection and attention projection, llama-155m's
# KV projection, SmolLM2-135M's o_proj (30 layers), and the bundled model's smallest
SHAPES = [(128, 344, 4), (256, 1024, 8), (576, 576, 30), (64, 128, 4), (128, 128, 4)]


def median_ms(fn, n=15):
    for _ in range(3):
        mx.eval(fn())
    times = []
    for _ in range(n):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def layer_us(ws, x, blocks=None):
    """Median microseconds per layer of ``x @ w.T`` over the weights ``ws`` (``blocks``:
    through :func:`blocked` in those row blocks; ``None``: one plain call)."""
    if blocks is None:
        return median_ms(lambda: [x @ w.T for w in ws]) * 1e3 / len(ws)
    return median_ms(lambda: [blocked(lambda r, w=w: r @ w.T, x, blocks) for w in ws]) * 1e3 / len(ws)


def main():
    for N, K, layers in SHAPES:
        ws = [mx.random.normal((N, K)) * 0.02 for _ in range(layers)]
        mx.eval(ws)
        runs = sweep(lambda x, w=ws[0]: x @ w.T, K, mx.float32).runs()
        # the same product the other way round, (W @ x.T).T: another orientation for the BLAS
        turned = sweep(lambda x, w=ws[0]: (w @ x.T).T, K, mx.float32).runs()
        line = f"({N},{K}) x{layers}: runs {runs}, as (W @ x.T).T {turned}"
        for B in (1, 8, 32):
            x = mx.random.normal((B, K))
            mx.eval(x)
            parts = [f"plain {layer_us(ws, x):.0f}"]
            parts += [f"{(lo, hi)} {layer_us(ws, x, RowBlocks(lo, hi)):.0f}" for lo, hi in runs]
            line += f" | B={B}: " + ", ".join(parts)
        print(line, "us/layer", flush=True)


if __name__ == "__main__":
    main()
