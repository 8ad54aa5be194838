"""Side-by-side views of replays: latency CDFs, and batch size and queue length over time.

Knows: :class:`~workbench.sim.replay.Replay` (its report's events and requests),
:mod:`workbench.observe.metrics` (``occupancy`` from events), matplotlib. Must not know: the
engine. Each figure has a text form with the same content, deterministic for nbval.

Text forms::

    TTFT (ms)   p10   p25   p50   p75   p90   p95   p99       <- latency_cdf_text
    fcfs       12.0  15.3  ...
    spf         9.1  11.0  ...

    queued at t (s)   0.0  1.0  2.0 ...                       <- occupancy_text
    fcfs                0    3    5 ...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..observe.metrics import occupancy, occupancy_at, percentiles
from ..sim.replay import Replay
from . import style

CDF_QUANTILES = (10, 25, 50, 75, 90, 95, 99)
LATENCY_LABELS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E", "queue_s": "queue"}


def latency_cdf_text(
    runs: Mapping[str, Replay], column: str = "ttft_s", quantiles: Sequence[int] = CDF_QUANTILES
) -> str:
    """The latency ``column`` (``ttft_s``, ``tpot_s``, ``e2e_s``, ``queue_s``) in ms at
    ``quantiles``, one line per run: the CDF read at fixed heights."""
    rows = {
        name: {k: f"{v * 1e3:.1f}" for k, v in percentiles(run.report.requests[column], quantiles).items()}
        for name, run in runs.items()
    }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = f"{LATENCY_LABELS.get(column, column)} (ms)"
    return table.to_string()


def render_latency_cdfs(
    runs: Mapping[str, Replay], columns: Sequence[str] = ("ttft_s", "tpot_s", "e2e_s"), title: str = ""
) -> Figure:
    """One panel per latency column: each run's empirical CDF (x: ms, log scale, plain
    tick labels that do not overlap). 3.1 inches per panel, so three panels (930 px at
    the notebook's 100 dpi) fit a JupyterLab output area unscaled."""
    fig = Figure(figsize=(3.1 * len(columns), 3.4), layout="constrained")
    axes = fig.subplots(1, len(columns), squeeze=False)[0]
    for ax, col in zip(axes, columns):
        drawn = []
        for (name, run), colour in zip(runs.items(), run_colours(len(runs))):
            v = np.sort(run.report.requests[col].to_numpy(float))
            v = v[np.isfinite(v)]
            drawn.append(v * 1e3)
            if v.size:
                ax.step(v * 1e3, np.arange(1, v.size + 1) / v.size, where="post", label=name, color=colour)
        style.plain_log_axis(ax.xaxis, drawn)
        ax.set_xlabel(f"{LATENCY_LABELS.get(col, col)} (ms)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of requests")
    axes[0].legend(fontsize="small", loc="upper left")
    if title:
        fig.suptitle(title)
    return fig


def run_colours(n: int) -> list[str]:
    """One colour per compared run (policy), from the palette's series colours (no cache
    meaning: never the fed token's orange or the decode blue), repeating after five."""
    return [style.SERIES[i % len(style.SERIES)] for i in range(n)]


def _t0(run: Replay) -> float:
    ev = run.report.events
    return float(ev[ev.kind == "submit"].time_s.min()) if len(ev) else 0.0


def occupancy_text(runs: Mapping[str, Replay], n_times: int = 8) -> str:
    """Queued requests and running rows (batch size) of each run at ``n_times`` evenly
    spaced times from 0 to the longest run's last event (seconds since first submit)."""
    end_s = max((float(r.report.events.time_s.max()) - _t0(r) for r in runs.values()), default=0.0)
    times = np.linspace(0.0, end_s, n_times)
    blocks = []
    for col, label in (("queued", "queued"), ("running", "batch size")):
        rows = {
            name: occupancy_at(occupancy(r.report.events), times + _t0(r))[col].tolist()
            for name, r in runs.items()
        }
        table = pd.DataFrame.from_dict(rows, orient="index", columns=[f"{t:.2f}" for t in times])
        table.index.name = f"{label} at t (s)"
        blocks.append(table.to_string())
    return "\n\n".join(blocks)


def render_occupancy(runs: Mapping[str, Replay], title: str = "") -> Figure:
    """Batch size over time since first submit as small multiples, one lane per run (a
    step line, filled below, the run's name in the lane), then one panel of queued
    requests with every run's step line; the runs' legend right of the panels, where it
    covers no line. 9 inches wide (unscaled in a JupyterLab output area)."""
    n = max(len(runs), 1)
    fig = Figure(figsize=(9, 1.9 + 0.85 * n + 2.2), layout="constrained")
    axes = fig.subplots(n + 1, 1, sharex=True, height_ratios=[0.85] * n + [2.2])
    lanes, ax_q = axes[:-1], axes[-1]
    top = max(
        (int(occupancy(r.report.events).running.max()) for r in runs.values() if len(r.report.events)),
        default=1,
    )
    for ax, (name, run), colour in zip(lanes, runs.items(), run_colours(len(runs))):
        occ = occupancy(run.report.events)
        t = occ.time_s - _t0(run)
        ax.step(t, occ.running, where="post", label=name, color=colour, linewidth=1)
        ax.fill_between(t, occ.running, step="post", color=colour, alpha=0.25, linewidth=0)
        ax.set_ylim(0, max(top, 1) * 1.15)
        ax.set_yticks([0, top])
        ax.text(
            0.005, 0.92, name, transform=ax.transAxes, ha="left", va="top", fontsize="small", color=colour
        )
        ax.grid(alpha=0.3)
        ax_q.step(t, occ.queued, where="post", label=name, color=colour)
    lanes[len(lanes) // 2].set_ylabel("batch size (rows)")
    ax_q.set_ylabel("queued requests")
    ax_q.set_xlabel("time since first submit (s)")
    ax_q.grid(alpha=0.3)
    fig.legend(
        *ax_q.get_legend_handles_labels(), loc="outside right lower", fontsize="small"
    )  # by the queue panel, clear of the title
    if title:
        fig.suptitle(title)
    return fig


__all__ = ["latency_cdf_text", "render_latency_cdfs", "occupancy_text", "render_occupancy"]
