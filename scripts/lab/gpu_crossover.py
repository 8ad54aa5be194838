"""Where the padded-rows attention kernel starts to pay inside the engine (issue 28: B = 8 ran
slower with it than without). The GPU benchmark's runs (:func:`workbench.bench.gpu.gpu_runs`:
B requests of 64-512 tokens, all submitted at once, alternating engines, median decode step of
the full batch) at several B, for four engines on one model:

- ``kernel``: the workbench as shipped with the kernel at every B (``kernel_min_rows=1``);
- ``no kernel``: the same engine with the kernel off (no-mask path kept: mlx-lm's masked
  attention over padded rows);
- ``fast decode off``: ``Scheduler(fast_decode=False)``;
- ``mlx-lm``: ``BatchGenerator``.

Prints one JSON line per run and a table of medians; the crossover is the smallest B from which
``kernel`` is faster than ``no kernel`` at every larger B measured.

Usage (on a CUDA machine): ``python scripts/lab/gpu_crossover.py [--batch 2 4 8 16 32 64]
[--pairs 2] [--decode 128] [--quick] [--out FILE]`` (``--quick``: the tiny shape, a CPU check of
the script itself; the kernel then never runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workbench.bench.engines import Arrival  # noqa: E402
from workbench.bench.gpu import GPU_CONFIG, GPU_QUICK_CONFIG, gpu_runs, prompt_lengths  # noqa: E402
from workbench.bench.model import make_model  # noqa: E402
from workbench.bench.scenarios import FAST_OFF, MLX_LM, WORKBENCH, engine_factories  # noqa: E402
from workbench.runtime.loading import load  # noqa: E402
from workbench.workloads.workload import prompt_of_length  # noqa: E402

import mlx.core as mx  # noqa: E402

KERNEL, NO_KERNEL = "kernel", "no kernel"


def with_kernel_rows(factory, min_rows: int):
    """A factory of the same engine whose padded-rows kernel serves steps of ``min_rows`` or more."""

    def make():
        engine = factory()
        runner = engine.sched.runner
        object.__setattr__(
            runner, "fast_decode", replace(runner.fast_decode, kernel_min_rows=min_rows)
        )  # frozen
        return engine

    return make


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cfg = replace(GPU_QUICK_CONFIG if args.quick else GPU_CONFIG, decode_tokens=args.decode)
    model = make_model(cfg.shape, dtype=getattr(mx, cfg.dtype))
    _, tokenizer = load()
    frames = []
    for B in args.batch:
        arrivals = [
            Arrival(tuple(prompt_of_length(tokenizer, n, start=97 * b)), cfg.decode_tokens)
            for b, n in enumerate(prompt_lengths(cfg, B))
        ]
        base = engine_factories(model, tokenizer, B, cfg.prefill_step_size, (WORKBENCH, FAST_OFF, MLX_LM))
        factories = {
            KERNEL: with_kernel_rows(base[WORKBENCH], 1),
            NO_KERNEL: with_kernel_rows(base[WORKBENCH], 10**9),
            FAST_OFF: base[FAST_OFF],
            MLX_LM: base[MLX_LM],
        }
        runs = gpu_runs(factories, arrivals, args.pairs, print)
        frames.append(runs)
        for row in runs.to_dict("records"):
            line = json.dumps({k: (None if v != v else v) for k, v in row.items()})
            print(line)
            if args.out:
                with args.out.open("a") as f:
                    f.write(line + "\n")
    import pandas as pd

    table = (pd.concat(frames).groupby(["B", "engine"]).step_s.median().unstack() * 1e3).round(2)
    print("median decode step, ms:")
    print(table.to_string())
    faster = table[KERNEL] < table[NO_KERNEL]
    cross = next((B for B in table.index if faster.loc[B:].all()), None)
    print(f"crossover (kernel faster at this B and every larger one measured): {cross}")


if __name__ == "__main__":
    main()
