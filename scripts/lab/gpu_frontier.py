"""The pacing frontier measured on a GPU (issue 17): mlx-lm's BatchGenerator, the workbench
with fixed chunks, and the workbench paced at several targets, on the same staggered
arrivals, alternating, on the wall clock.

Usage: ``python scripts/lab/gpu_frontier.py OUT_DIR [ROUNDS] [ARRIVAL_STEPS ...]`` (defaults 3;
8 and 3). The 1B-shaped bf16 llama of ``workbench bench --device gpu``, 24 requests of the
staggered benchmark's prompt lengths (8-300 tokens) and max_tokens (16-56), ``max_batch`` 8,
``prefill_step_size`` 512; the arrival interval is ARRIVAL_STEPS x the measured decode step at
B = 8. Writes ``frontier_<steps>_requests.csv`` / ``_gaps.csv`` / ``_summary.csv`` and
``frontier.png`` into OUT_DIR and prints each summary against mlx-lm.
"""

import sys
import time
from pathlib import Path

from workbench.bench.engines import Arrival, WorkbenchEngine, drive
from workbench.bench.figures import render_frontier
from workbench.bench.gpu import LLAMA_1B
from workbench.bench.model import make_model
from workbench.bench.pacing import LATENCY_COLUMNS, frontier_runs, frontier_summary, versus
from workbench.bench.scenarios import staggered_arrivals
from workbench.observe.metrics import SLO
from workbench.runtime import precision
from workbench.runtime.device import device_report
from workbench.runtime.loading import load
from workbench.workloads.workload import prompt_of_length

import mlx.core as mx

out = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
intervals = [float(x) for x in sys.argv[3:]] or [8.0, 3.0]
out.mkdir(parents=True, exist_ok=True)
print(f"device: {device_report().text()}; {precision.describe()}")
model = make_model(LLAMA_1B, dtype=mx.bfloat16)
_, tokenizer = load()
engine = WorkbenchEngine(model, tokenizer, 8, 512, history_size=0)  # the decode step at B = 8
iterations = drive(engine, [Arrival(tuple(prompt_of_length(tokenizer, 64, 97 * b)), 40) for b in range(8)])
step_s = float(iterations.time_s.diff().iloc[5:].median())
print(f"decode step at B = 8: {step_s * 1e3:.2f} ms")
panels = {}
for steps in intervals:
    arrivals = staggered_arrivals(tokenizer, 24, steps * step_s)
    started = time.perf_counter()
    requests, gaps = frontier_runs(
        model, tokenizer, arrivals, 8, 512, (2, 4, 8), rounds, max_wait_s=30 * step_s, echo=print
    )
    summary = frontier_summary(requests, gaps, SLO(ttft_s=20 * step_s, tpot_s=3 * step_s))
    for name, frame in (("requests", requests), ("gaps", gaps), ("summary", summary)):
        frame.to_csv(out / f"frontier_{steps:g}_{name}.csv", index=False)
    panels[f"H200, one arrival every {steps:g} steps"] = (requests, gaps)
    print(
        f"\narrivals every {steps:g} steps ({steps * step_s * 1e3:.1f} ms), {rounds} rounds, "
        f"{time.perf_counter() - started:.0f} s:"
    )
    print((summary.set_index("engine")[LATENCY_COLUMNS] * 1e3).round(2).to_string())
    print(versus(summary).round(3).to_string(index=False))
render_frontier(panels).savefig(out / "frontier.png", dpi=110)
