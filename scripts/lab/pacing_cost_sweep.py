"""Pacing under load on the cost clock (issue 17): the bench's staggered arrivals at one
arrival every 3 and every 1.5 decode steps, 16 and 24 requests, FCFS and shortest prompt
first (30-step age bound), mlx-lm against the fixed-chunk workbench and paced targets
1.5 / 2 / 4 / 8 x the step. Every forward advances a virtual clock by the bundled
tiny-llama cost model, so the table is deterministic (the same on every machine) and
compares scheduling alone. Prints each engine / mlx-lm and writes ``OUT/summary.csv``.

Usage: ``python scripts/lab/pacing_cost_sweep.py OUT`` (about 9 minutes on 2 cores).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import workbench as wb  # noqa: E402
from workbench.bench.model import QUICK, make_model  # noqa: E402
from workbench.bench.pacing import LATENCY_COLUMNS, frontier_runs, frontier_summary, versus  # noqa: E402
from workbench.bench.scenarios import staggered_arrivals  # noqa: E402
from workbench.observe.metrics import SLO  # noqa: E402

COLUMNS = ["engine", *LATENCY_COLUMNS, "throughput_tok_per_s"]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cost = wb.CostModel.load(wb.BUNDLED_MODEL.parent.parent / "costmodels" / "tiny-llama-linux-x86_64.json")
    model, (_, tokenizer) = make_model(QUICK), wb.load("tiny-llama")
    step = cost.decode_s(8, 200)
    frames = []
    for every in (3, 1.5):
        for n in (16, 24):
            arrivals = staggered_arrivals(tokenizer, n, every * step)
            for policy, wait in (("fcfs", None), ("shortest prompt first", 30 * step)):
                requests, gaps = frontier_runs(
                    model,
                    tokenizer,
                    arrivals,
                    8,
                    512,
                    (1.5, 2, 4, 8),
                    1,
                    mode="cost",
                    cost_model=cost,
                    max_wait_s=wait,
                    echo=lambda line: None,
                    floor_repeats=0,
                )
                ratios = versus(frontier_summary(requests, gaps, SLO(ttft_s=20 * step, tpot_s=3 * step)))[
                    COLUMNS
                ]
                print(
                    f"one arrival every {every} steps, {n} requests, {policy}: each engine / mlx-lm",
                    flush=True,
                )
                print(ratios.round(2).to_string(index=False), flush=True)
                frames.append(ratios.assign(arrival_steps=every, requests=n, policy=policy))
    summary = pd.concat(frames, ignore_index=True)
    summary["both_goals"] = (summary.ttft_p95_s <= 0.6) & (summary.itl_p95_s <= 1.0)
    summary.to_csv(out / "summary.csv", index=False)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "out",
        nargs="?",
        type=Path,
        default=Path("workbench-out/pacing_cost_sweep"),
        help="folder for summary.csv (default workbench-out/pacing_cost_sweep)",
    )
    main(ap.parse_args().out)
