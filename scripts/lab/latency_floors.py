"""Are issue 17's latency goals reachable at all on this machine? The TTFT and ITL floors of
``workbench bench``'s staggered arrivals against mlx-lm's BatchGenerator, measured in one run.

Usage: ``python scripts/lab/latency_floors.py [OUT_DIR] [--rounds N] [--arrival-steps S ...]
[--targets T ...]`` (defaults: no files, 2 rounds, arrivals every 8 and every 3 decode steps,
no paced engine). The model, arrivals and sizes of ``workbench bench``: the llama-155m
float32 shape, 16 requests (prompts 8-300 tokens, 16-56 new tokens), ``max_batch`` 8,
``prefill_step_size`` 512; the arrival interval is S x the decode step at B = 8 measured
first. For each interval :func:`workbench.bench.pacing.frontier_runs` runs mlx-lm and the
fixed-chunk workbench (and the workbench paced at each target) after a warm-up, measuring
the floors first (:mod:`workbench.bench.floors`: each prompt length alone, lowest of 4
runs; 8 prompts decoding together), and this prints the summary in ms, each engine against
mlx-lm (the floor columns against mlx-lm's *measured* p95), the verdicts (is the floor's
p95 within the goal: TTFT <= 0.6 x, ITL <= 1.0 x mlx-lm's p95?) and mlx-lm's TTFT p95 of each
round with the floor's ratio to it (the load of a shared machine moves it), and the longest prompt's
TTFT floor against a solo forward of that prompt timed directly (the whole prompt in one forward,
no engine; lowest of 3): the floor is that forward plus the first step and the engines' Python, so
the ratio should be about 1 (a timing comparison, kept out of the unit tests: it moves with the
load). With OUT_DIR it writes
``floors_<S>_requests.csv`` / ``_gaps.csv`` / ``_summary.csv`` there.
"""

import argparse
import os
import time
from pathlib import Path

from workbench.bench.engines import Arrival, WorkbenchEngine, drive
from workbench.bench.model import FULL, make_model
from workbench.bench.pacing import floor_verdicts, frontier_runs, frontier_summary, versus
from workbench.bench.scenarios import MLX_LM, staggered_arrivals
from workbench.observe.metrics import SLO
from workbench.runtime.loading import load
from workbench.workloads.workload import prompt_of_length

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("out", nargs="?", type=Path, help="folder for the CSV files (default: none written)")
parser.add_argument(
    "--rounds", type=int, default=2, help="alternating rounds per arrival interval (default 2)"
)
parser.add_argument(
    "--arrival-steps",
    type=float,
    nargs="+",
    default=[8.0, 3.0],
    help="arrival intervals, in decode steps at B = 8 (default 8 3)",
)
parser.add_argument(
    "--targets",
    type=float,
    nargs="*",
    default=[],
    help="paced engines to add, at these multiples of the decode step (default none)",
)
args = parser.parse_args()
if args.out:
    args.out.mkdir(parents=True, exist_ok=True)


def solo_forward_s(prompt) -> float:
    """The whole prompt in one forward, nothing else (no engine, no sampling): lowest of 3 (s)."""
    times = []
    for _ in range(4):  # the first is a warm-up
        cache = make_prompt_cache(model)
        start = time.perf_counter()
        mx.eval(model(mx.array([list(prompt)]), cache=cache))
        times.append(time.perf_counter() - start)
    return min(times[1:])


model = make_model(FULL)
_, tokenizer = load()
print(f"model {FULL.describe()}, float32; load average {os.getloadavg()[0]:.2f}")
engine = WorkbenchEngine(model, tokenizer, 8, 512, history_size=0)  # the decode step at B = 8
iterations = drive(engine, [Arrival(tuple(prompt_of_length(tokenizer, 64, 97 * b)), 24) for b in range(8)])
step_s = float(iterations.time_s.diff().iloc[5:].median())
print(f"decode step at B = 8: {step_s * 1e3:.1f} ms")
for steps in args.arrival_steps:
    started = time.perf_counter()
    arrivals = staggered_arrivals(tokenizer, 16, steps * step_s)
    requests, gaps = frontier_runs(
        model,
        tokenizer,
        arrivals,
        8,
        512,
        tuple(args.targets),
        args.rounds,
        max_wait_s=30 * step_s,
        echo=print,
    )
    summary = frontier_summary(requests, gaps, SLO(ttft_s=10 * step_s, tpot_s=2 * step_s))
    if args.out:
        for name, frame in (("requests", requests), ("gaps", gaps), ("summary", summary)):
            frame.to_csv(args.out / f"floors_{steps:g}_{name}.csv", index=False)
    print(
        f"\narrivals every {steps:g} steps ({steps * step_s * 1e3:.0f} ms), {args.rounds} rounds, "
        f"{time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f}; ms:"
    )
    cols = ["ttft_p50_s", "ttft_p95_s", "ttft_floor_p95_s", "itl_p50_s", "itl_p95_s", "itl_floor_p95_s"]
    print((summary.set_index("engine")[cols] * 1e3).round(1).to_string())
    print("each / mlx-lm's (a floor / mlx-lm's measured p95):")
    print(versus(summary)[["engine", *cols]].round(3).to_string(index=False))
    print(floor_verdicts(summary).round(3).to_string(index=False))
    mlx = requests[requests.engine == MLX_LM]
    per_round = mlx.groupby("round").ttft_s.quantile(0.95)
    floor_s = mlx.ttft_floor_s.quantile(0.95)
    print(
        "mlx-lm's TTFT p95 per round: "
        + ", ".join(f"{p95:.3f} s (floor / it {floor_s / p95:.2f})" for p95 in per_round)
    )
    longest = max(arrivals, key=lambda a: len(a.prompt)).prompt
    print(
        f"longest prompt ({len(longest)} tokens): TTFT floor / a solo forward timed directly "
        f"{mlx[mlx.prompt_tokens == len(longest)].ttft_floor_s.min() / solo_forward_s(longest):.2f}"
    )
