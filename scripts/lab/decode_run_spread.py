"""How much one engine's decode step moves from run to run on this machine (issue 40: the
packed bench's decode ratios at B = 8 on the bundled tiny-llama): the padded workbench and
mlx-lm alternating, ``--runs`` runs each of B equal prompts of 16 tokens decoding 24, each run's
median step (ms, :func:`workbench.bench.scenarios.decode_window`) printed in order.

    python scripts/lab/decode_run_spread.py
    OPENBLAS_NUM_THREADS=1 python scripts/lab/decode_run_spread.py
"""

import argparse
import os

import workbench  # noqa: F401  (loads the optimized BLAS before mlx)
from workbench.bench.engines import Arrival
from workbench.bench.packed import MLX_LM, PACKED, PADDED, factories
from workbench.bench.scenarios import decode_window, equal_prompts, run_once
from workbench.runtime.loading import load


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--runs", type=int, default=6)
    a = ap.parse_args()
    model, tok = load("tiny-llama")
    engines = factories(model, tok, (PADDED, PACKED, MLX_LM), max(a.batch, 8))
    arrivals = [Arrival(p, 24) for p in equal_prompts(tok, a.batch, 16)]
    steps = {name: [] for name in engines}
    for _ in range(a.runs):
        for name, make in engines.items():
            iterations, _ = run_once(make, arrivals)
            steps[name].append(round(decode_window(iterations)["step_s"] * 1e3, 2))
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    for name, ms in steps.items():
        print(f"B={a.batch} OPENBLAS_NUM_THREADS={threads} {name}: step ms per run {ms}")


if __name__ == "__main__":
    main()
