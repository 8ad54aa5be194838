"""Quantized KV cache against the float cache: bytes per token, decode step time, rows admitted
under one byte budget (workbench.bench.quantized). The numbers in docs/quantized-kv.md come
from this script; it writes docs/benchmarks/quantized_kv_{bytes,steps,admission}.csv and
docs/quantized-kv.png.

Bytes and admission use the bundled trained model (tiny-code: head dim 32, so group 32); step
times use the benchmark's 155M-parameter llama shape (workbench.bench.model.FULL: head dim 64)
at B rows over random keys and values, medians of interleaved repeats with their range and the
load average, at group 32 by default (as tiny-code's head dim 32 forces, so every table has the
same settings).

Usage: ``python scripts/lab/quantized_kv.py [--rows 8] [--contexts 256 1024] [--repeats 5] [--group 32] [--no-files]``
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

import workbench as wb
from workbench.bench.model import FULL, make_model
from workbench.bench.quantized import admission_under_budget, bytes_per_token, step_cost
from workbench.views.quantized import quantized_text, render_quantized
from workbench.views.style import figure_png

import mlx.core as mx
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--group", type=int, default=32, help="kv_group_size of the step-time settings")
    parser.add_argument("--no-files", action="store_true", help="print only")
    args = parser.parse_args()
    model, tokenizer = wb.load("tiny-code")
    small = [(None, 32), (8, 32), (4, 32)]
    sizes = bytes_per_token(model, small)
    admission = admission_under_budget(model, tokenizer, small)
    big = make_model(FULL)
    grouped = [(None, args.group), (8, args.group), (4, args.group)]
    steps = [step_cost(big, args.rows, s, grouped, repeats=args.repeats) for s in args.contexts]
    steps = pd.concat(steps, ignore_index=True)
    big_sizes = bytes_per_token(big, grouped)
    print(f"mlx {mx.__version__}, {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print("tiny-code (trained, head dim 32):")
    print(quantized_text(sizes, None, admission))
    print(f"\n{FULL.describe()} (random weights, head dim 64):")
    print(quantized_text(big_sizes, steps))
    if args.no_files:
        return
    out = ROOT / "docs" / "benchmarks"
    sizes.to_csv(out / "quantized_kv_bytes.csv", index=False)
    steps.to_csv(out / "quantized_kv_steps.csv", index=False)
    admission.to_csv(out / "quantized_kv_admission.csv", index=False)
    fig = render_quantized(
        steps, admission, bytes_table=sizes, model_name="tiny-code", step_model_name=FULL.name
    )
    (ROOT / "docs" / "quantized-kv.png").write_bytes(figure_png(fig, dpi=100))
    print(f"wrote {out}/quantized_kv_*.csv and docs/quantized-kv.png")


if __name__ == "__main__":
    main()
