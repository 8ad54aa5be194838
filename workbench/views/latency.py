"""Latency and throughput view: TTFT and TPOT distributions with p50/p95, decode tokens
per second over time, batch size per step, from a :class:`~workbench.observe.report.Report`.

Knows: the report's ``requests`` and ``events`` frames and :mod:`workbench.observe.metrics`
(every number here is computed there, from events only). Must not know: the engine.

Text form (deterministic under an injected fake clock)::

    2 requests, 5 generated tokens over 3 decode steps
    TTFT (ms): p50 1500.0, p95 1950.0 (2 requests)
    TPOT (ms): p50 1000.0, p95 1000.0 (2 requests)
    throughput: 1.2 tok/s over the run; decode tok/s per step: min 1.0, max 2.0
    batch size by step: 2×2 1        (value×steps, in step order)

Rich form: a 2×2 Figure: TTFT histogram, TPOT histogram (p50/p95 as vertical lines, in
ms), decode tok/s over time (s since the first submit) and batch size over decode steps.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..observe.metrics import percentiles, step_metrics
from ..observe.report import Report
from . import style

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"))


def latency_text(report: Report) -> str:
    """Deterministic text form (see the module docstring); times in milliseconds."""
    r, steps = report.requests, step_metrics(report.events)
    lines = [
        f"{len(r)} requests, {int(r.generated_tokens.sum())} generated tokens over {len(steps)} decode steps"
    ]
    for col, name in LATENCIES:
        p, n = percentiles(r[col]), int(np.isfinite(r[col].to_numpy(float)).sum())
        lines.append(f"{name} (ms): p50 {p['p50'] * 1e3:.1f}, p95 {p['p95'] * 1e3:.1f} ({n} requests)")
    rate = steps.tok_per_s.to_numpy(float)
    rate = rate[np.isfinite(rate)]
    per_step = f"min {rate.min():.1f}, max {rate.max():.1f}" if rate.size else "n/a"
    lines.append(
        f"throughput: {report.throughput_tok_per_s:.1f} tok/s over the run; decode tok/s per step: {per_step}"
    )
    lines.append("batch size by step: " + run_lengths(steps.batch_size.astype(int).tolist()))
    return "\n".join(lines)


def run_lengths(values: list[int]) -> str:
    """Run-length text of a sequence: ``value×count`` per run (``×1`` left out).

    >>> run_lengths([1, 1, 2, 3, 3, 3])
    '1×2 2 3×3'
    """
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return " ".join(f"{v}×{n}" if n > 1 else str(v) for v, n in runs) or "(no steps)"


def _histogram(ax, values_s: pd.Series, name: str) -> None:
    ms = values_s.to_numpy(float) * 1e3
    ms = ms[np.isfinite(ms)]
    ax.set_title(f"{name} per request", fontsize="small", loc="left")
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel("requests")
    if not ms.size:
        ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
        return
    ax.hist(ms, bins=min(20, max(5, ms.size)), color=style.ATTENDED, alpha=0.8)
    p = percentiles(values_s)
    for q, ls in (("p50", "-"), ("p95", "--")):
        ax.axvline(p[q] * 1e3, color="black", linestyle=ls, label=f"{q} {p[q] * 1e3:.1f} ms")
    ax.legend(fontsize="x-small")


def render_latency(report: Report, title: str = "latency and throughput") -> Figure:
    """2×2 Figure of the report's latency distributions and per-step throughput."""
    fig = Figure(figsize=(10, 6.5), layout="constrained")
    fig.suptitle(f"{title}: {report.summary()}" if len(report.requests) else title, fontsize="small")
    (ttft_ax, tpot_ax), (rate_ax, batch_ax) = fig.subplots(2, 2)
    for ax, (col, name) in zip((ttft_ax, tpot_ax), LATENCIES):
        _histogram(ax, report.requests[col], name)
    steps = step_metrics(report.events)
    t0 = report.events[report.events.kind == "submit"].time_s.min()
    rate_ax.plot(steps.time_s - t0, steps.tok_per_s, ".", color=style.ATTENDED, label="one step")
    rate_ax.plot(
        steps.time_s - t0,
        steps.tok_per_s.rolling(8, min_periods=1).mean(),
        "-",
        color=style.SERIES[0],
        label="mean of 8 steps",
    )
    rate_ax.legend(fontsize="x-small")
    rate_ax.set_title("decode throughput per step", fontsize="small", loc="left")
    rate_ax.set_xlabel("time since first submit (s)")
    rate_ax.set_ylabel("tok/s")
    batch_ax.step(steps.step, steps.batch_size, where="mid", color=style.ATTENDED)
    batch_ax.set_title("batch size per step", fontsize="small", loc="left")
    batch_ax.set_xlabel("decode step")
    batch_ax.set_ylabel("rows")
    batch_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (rate_ax, batch_ax):
        ax.grid(alpha=0.3)
    return fig
