"""Sarathi-Serve's lever, swept: the packed layout's hybrid (stall-free) schedule on the
Azure window at several token budgets (vLLM's ``max_num_batched_tokens``), beside
decode-first at the bench's budget, on the wall clock.

``python -m workbench.bench.packed_sweep [budget ...]`` prints one markdown table (TTFT and
ITL p50 / p95 / p99, tokens per second) and the machine's load during the run.

Knows: :mod:`workbench.bench.packed` (its engines, the Azure arrivals, the latency runs).
Must not know: the engine's internals.

Sarathi-Serve sizes a hybrid batch's prefill chunk so that the batch stays near a decode
step's time; ``docs/packed.md`` found the hybrid's tail ITL above decode-first's at a budget
of 512 tokens, where a mixed forward carries up to 500 prefill tokens.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from ..runtime.loading import load
from .packed import CHUNK_TOKENS, MAX_BATCH, PAGE_TOKENS, TrackedWorkbench, azure_arrivals, latency

BUDGETS = (64, 128, 256, 512)  # tokens per packed forward


def sweep_factories(model: Any, tokenizer: Any, budgets: Sequence[int]) -> dict[str, Callable[[], Any]]:
    """Fresh-engine factories: the hybrid schedule at each budget (``"hybrid, 64"``), then
    decode-first at :data:`CHUNK_TOKENS`; ``MAX_BATCH`` rows, pages of ``PAGE_TOKENS``."""

    def packed(budget: int, schedule: str) -> Callable[[], Any]:
        return lambda: TrackedWorkbench(
            model,
            tokenizer,
            MAX_BATCH,
            budget,  # prefill_step_size: a packed forward's tokens are its budget
            history_size=64,
            layout="packed",
            page_size=PAGE_TOKENS,
            max_num_batched_tokens=budget,
            packed_schedule=schedule,
        )

    out = {f"hybrid, {b}": packed(b, "hybrid") for b in budgets}
    out[f"decode-first, {CHUNK_TOKENS}"] = packed(CHUNK_TOKENS, "decode-first")
    return out


def run_sweep(
    budgets: Sequence[int] = BUDGETS, rounds: int = 1, echo: Callable[[str], None] = print
) -> tuple[pd.DataFrame, dict]:
    """One warm-up run, then every engine of :func:`sweep_factories` ``rounds`` times
    (alternating) through the Azure window. Returns ``(summary, meta)``: the summary of
    :func:`workbench.bench.packed.latency` and the 1-minute load average's range, cores."""
    loads = [os.getloadavg()[0]]
    model, tokenizer = load("tiny-llama")
    arrivals = azure_arrivals(tokenizer)
    fac = sweep_factories(model, tokenizer, budgets)
    first = next(iter(fac))
    latency({first: fac[first]}, arrivals, 0, "warm-up", echo)  # one warm-up run, discarded
    summary, _ = latency(fac, arrivals, rounds, "sarathi-sweep", echo, warm_up=False)
    loads.append(os.getloadavg()[0])
    return summary, dict(load_1min_min=min(loads), load_1min_max=max(loads), cores=os.cpu_count())


def sweep_table(summary: pd.DataFrame) -> str:
    """The summary as a markdown table: per engine the medians over rounds, TTFT in
    seconds, ITL in milliseconds."""
    g = summary.groupby("engine", sort=False).median(numeric_only=True)
    lines = [
        "| schedule, budget | TTFT p50 (s) | TTFT p95 (s) | ITL p50 (ms) | ITL p95 (ms) | ITL p99 (ms) | tok/s |"
    ]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in g.iterrows():
        lines.append(
            f"| {name} | {r.ttft_p50_s:.1f} | {r.ttft_p95_s:.1f} | {r.itl_p50_s * 1e3:.1f} | "
            f"{r.itl_p95_s * 1e3:.0f} | {r.itl_p99_s * 1e3:.0f} | {r.throughput_tok_per_s:.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> None:
    """Run the sweep (budgets from ``argv``, else :data:`BUDGETS`) and print its table."""
    summary, meta = run_sweep(tuple(int(a) for a in argv) or BUDGETS)
    print(sweep_table(summary))
    print(
        f"load average (1 min) {meta['load_1min_min']:.1f}-{meta['load_1min_max']:.1f} on {meta['cores']} cores"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
