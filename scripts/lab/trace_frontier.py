"""Pacing against mlx-lm's ``BatchGenerator`` on a window of Azure's conversation trace,
measured on the wall clock (issue 17): the window of ``docs/policies.md`` (12 s from minute
10, lengths / 4, prompts <= 512 and outputs <= 128 tokens, time compressed to 0.3) on the
bundled tiny-llama, ``max_batch`` 8, chunks of 512; mlx-lm, the workbench with fixed chunks,
and paced at 4 and 8 x the decode step (shortest prompt first, 30-step age bound), two
alternating rounds after a warm-up each, with the TTFT and ITL floors. Prints each engine /
mlx-lm and the floors' verdicts; writes ``OUT/{requests,gaps,summary}.csv``.

Usage: ``python scripts/lab/trace_frontier.py OUT [--rounds N]`` (reads the trace from
``../shared/data`` or ``$WORKBENCH_TRACE_DIR``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import workbench as wb  # noqa: E402
from workbench.bench.engines import Arrival  # noqa: E402
from workbench.bench.pacing import (  # noqa: E402
    LATENCY_COLUMNS,
    floor_verdicts,
    frontier_runs,
    frontier_summary,
    versus,
)
from workbench.observe.metrics import SLO  # noqa: E402
from workbench.workloads.traces import conv_window  # noqa: E402

COLUMNS = ["engine", *LATENCY_COLUMNS, "goodput_req_per_s", "throughput_tok_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="folder for requests.csv, gaps.csv, summary.csv")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds after the warm-up (default 2)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = wb.load("tiny-llama")
    work = conv_window(tokenizer, name="conv 10:00+12 s")
    arrivals = [Arrival(tuple(r.prompt), r.max_tokens, at_s=t) for t, r in work.arrivals]
    cost = wb.CostModel.load(wb.BUNDLED_MODEL.parent.parent / "costmodels" / "tiny-llama-linux-x86_64.json")
    step = cost.decode_s(8, 200)
    print(
        f"{work.name}: {len(arrivals)} requests over {arrivals[-1].at_s:.1f} s; cost-model step {step * 1e3:.1f} ms",
        flush=True,
    )
    requests, gaps = frontier_runs(
        model,
        tokenizer,
        arrivals,
        8,
        512,
        (4, 8),
        a.rounds,
        mode="measured",
        cost_model=cost,
        max_wait_s=30 * step,
        echo=lambda line: print(line, flush=True),
    )
    summary = frontier_summary(requests, gaps, SLO(ttft_s=20 * step, tpot_s=3 * step))
    requests.to_csv(a.out / "requests.csv", index=False)
    gaps.to_csv(a.out / "gaps.csv", index=False)
    summary.to_csv(a.out / "summary.csv", index=False)
    print(summary[COLUMNS].round(3).to_string(index=False))
    print("\neach engine / mlx-lm:")
    print(versus(summary)[COLUMNS].round(2).to_string(index=False))
    print("\nfloors:")
    print(floor_verdicts(summary).to_string(index=False))


if __name__ == "__main__":
    main()
