"""The real-model section of `workbench bench` alone: decode tok/s of the workbench and
mlx-lm's BatchGenerator on SmolLM2-135M (4-bit), alternating, with the full run's sizes
(``FULL_CONFIG.real``) or the quick run's, through the same functions the benchmark uses
(:func:`workbench.bench.realmodel.real_decode_runs`, :func:`workbench.bench.report.real_table`).

Usage: ``python scripts/lab/real_model_decode.py [--quick] [--out FOLDER]``; prints the rows as
text and as Markdown (the table of docs/benchmarks.md) and, with ``--out``, writes
``FOLDER/real_runs.csv``. Needs ``workbench models fetch smollm2-135m`` (else it says so).
"""

import argparse
import datetime
import os
import time
from pathlib import Path

from workbench.bench.realmodel import real_decode_runs
from workbench.bench.report import real_model_line, real_table, table_markdown, table_text
from workbench.bench.run import FULL_CONFIG, QUICK_CONFIG

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--quick", action="store_true", help="the quick run's sizes")
parser.add_argument("--out", default=None, help="folder for real_runs.csv (not written without it)")
args = parser.parse_args()
cfg = QUICK_CONFIG if args.quick else FULL_CONFIG
started_s, load_before = time.perf_counter(), os.getloadavg()[0]
runs, meta = real_decode_runs(
    cfg.real.batch_sizes,
    cfg.real.prompt_tokens,
    cfg.real.max_tokens,
    cfg.real.pairs,
    cfg.prefill_step_size,
    echo=lambda line: print(line, flush=True),
)
same = runs.same_tokens.dropna()
meta["real_same_tokens_runs"] = f"{int(same.sum())}/{len(same)}"
table = real_table(runs)
print(
    f"{datetime.date.today().isoformat()}, {cfg.name} sizes, {(time.perf_counter() - started_s) / 60:.1f} min, "
    f"load average (1 min) {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
)
print(real_model_line(cfg, meta))
if len(table):
    print(table_text(table))
    print(table_markdown(table))
if args.out:
    Path(args.out).mkdir(parents=True, exist_ok=True)
    runs.to_csv(Path(args.out) / "real_runs.csv", index=False)
    print(f"wrote {Path(args.out) / 'real_runs.csv'}")
