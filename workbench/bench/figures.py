"""Benchmark figures: pure functions from the benchmark's frames (as written to
``docs/benchmarks/*.csv`` and read back by :mod:`workbench.bench.files`) to matplotlib
Figures.

Knows: the columns of :class:`workbench.bench.run.BenchResult`'s frames, matplotlib. Must
not know: the engines; these never run anything, so the notebook draws them from the
stored CSV files. They live in the benchmark package, not in :mod:`workbench.views`, because
they read benchmark frames, not snapshots or reports.

===========================  ==========================================  ===================
figure                       frames                                      file
===========================  ==========================================  ===================
:func:`render_throughput`    ``runs.csv``, ``roofline.csv``              ``throughput.png``
:func:`render_ttft_itl`      ``requests.csv``, ``gaps.csv``              ``latency.png``
:func:`render_join`          ``join.csv`` (+ two ``meta.csv`` values)    ``join.png``
:func:`render_head_of_line`  ``head_of_line.csv``                        ``head_of_line.png``
:func:`render_frontier`      ``requests.csv``, ``gaps.csv`` (+ loaded)   ``frontier.png``
===========================  ==========================================  ===================
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .axes import plain_log_axis

# The views' palette (workbench.views.style): the workbench is its decode blue, a prefill
# chunk its prefill yellow, mlx-lm its one brown (style.MLX_LM); the other engines take
# colours the palette gives no cache meaning
# (its series colours), so orange is never both mlx-lm and a prefill or a fed token.
# tests/bench/test_figures.py checks they agree: the benchmark sits below the views in the
# import order, so it cannot import them.
WORKBENCH_COLOUR = "#3b7dd8"
PREFILL_COLOUR = "#e6c229"
MLX_LM_COLOUR = "#8c564b"
PACED_COLOUR = "#9467bd"
OTHER_COLOUR = "#4d4d4d"
ENGINE_COLOURS = {
    "workbench": WORKBENCH_COLOUR,
    "workbench, instrumentation off": "#9cc0ef",
    "mlx-lm": MLX_LM_COLOUR,
    "workbench, prefill-first": OTHER_COLOUR,
    "workbench, paced": PACED_COLOUR,
    "workbench, paced 4x step": PACED_COLOUR,
}


def render_throughput(runs: pd.DataFrame, roofline: pd.DataFrame) -> Figure:
    """Decode tok/s per batch size: one bar per engine (median of its runs, whiskers to
    the slowest and fastest run) and the roofline's attainable bound as a black tick.

    Args:
        runs: one row per decode run, columns ``engine``, ``B``, ``tok_per_s``.
        roofline: one row per case, columns ``case`` (``"decode ..."`` rows are drawn),
            ``B``, ``attainable_tok_per_s``.
    """
    fig = Figure(figsize=(9, 4.2))
    ax = fig.subplots()
    sizes = sorted(runs.B.unique())
    engines = [e for e in ENGINE_COLOURS if e in set(runs.engine)]
    width = 0.8 / len(engines)
    for i, engine in enumerate(engines):
        g = runs[runs.engine == engine].groupby("B").tok_per_s
        med, lo, hi = g.median().reindex(sizes), g.min().reindex(sizes), g.max().reindex(sizes)
        x = np.arange(len(sizes)) + (i - (len(engines) - 1) / 2) * width
        ax.bar(
            x,
            med,
            width,
            color=ENGINE_COLOURS[engine],
            label=engine,
            yerr=[med - lo, hi - med],
            capsize=3,
            error_kw={"lw": 0.8},
        )
    bound = (
        roofline[roofline.case.str.startswith("decode")].set_index("B").attainable_tok_per_s.reindex(sizes)
    )
    ax.scatter(np.arange(len(sizes)), bound, marker="_", s=900, color="black", label="attainable (roofline)")
    plain_log_axis(ax.yaxis, [runs.tok_per_s.to_numpy(), bound.to_numpy()])
    ax.set_xticks(np.arange(len(sizes)), [f"B = {b}" for b in sizes])
    ax.set_ylabel("decode tokens / s (log)")
    ax.set_title("Decode throughput (median of alternating runs; whiskers: min..max)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def _cdf(ax, values_s: pd.Series, colour: str, label: str) -> None:
    v = np.sort(values_s.dropna().to_numpy() * 1e3)
    ax.step(v, np.arange(1, len(v) + 1) / max(len(v), 1), where="post", color=colour, label=label)


def render_ttft_itl(requests: pd.DataFrame, gaps: pd.DataFrame) -> Figure:
    """Cumulative distributions of TTFT (per request) and ITL (per token gap), in ms,
    one line per engine, with the p50 and p95 levels marked. (Not
    :func:`workbench.views.render_latency`, which draws one run's report.)

    Args:
        requests: one row per request, columns ``engine``, ``ttft_s`` (seconds; NaN rows
            are skipped).
        gaps: one row per inter-token gap, columns ``engine``, ``gap_s`` (seconds).
    """
    fig = Figure(figsize=(9, 3.6))
    axes = fig.subplots(1, 2)
    for ax, frame, col, title in ((axes[0], requests, "ttft_s", "TTFT"), (axes[1], gaps, "gap_s", "ITL")):
        for engine in [e for e in ENGINE_COLOURS if e in set(frame.engine)]:
            _cdf(ax, frame[frame.engine == engine][col], ENGINE_COLOURS[engine], engine)
        for q in (0.5, 0.95):
            ax.axhline(q, color="grey", lw=0.5, ls=":")
        plain_log_axis(ax.xaxis, [frame[col].to_numpy(float) * 1e3])
        ax.set_xlabel(f"{title} (ms, log)")
        ax.set_ylabel("fraction")
        ax.set_title(f"{title}, staggered arrivals")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def render_join(join: pd.DataFrame, rows: int, context_tokens: int) -> Figure:
    """Median seconds of one decode step and of a join into a free slot, by ``extend``
    and by re-merging, each measurement as a dot (methods absent from ``join`` are
    skipped).

    Args:
        join: one row per measurement, columns ``method`` (``"step"``, ``"free slot"``,
            ``"extend"``, ``"extend, fresh pages"``, ``"re-merge"``) and ``seconds``.
        rows, context_tokens: the running batch the row joined (for the title).
    """
    fig = Figure(figsize=(5.5, 3.4))
    ax = fig.subplots()
    spec = [
        ("step", "one decode step", OTHER_COLOUR),
        ("free slot", "join into a free slot", ENGINE_COLOURS["workbench"]),
        ("extend", "join by extend", "#9ecae1"),
        ("extend, fresh pages", "by extend, fresh pages", "#c6dbef"),
        ("re-merge", "join by re-merge", ENGINE_COLOURS["mlx-lm"]),
    ]
    spec = [s for s in spec if (join.method == s[0]).any()]
    for i, (m, _, c) in enumerate(spec):
        s = join[join.method == m].seconds * 1e3
        ax.barh(i, s.median(), color=c)
        ax.plot(s, [i] * len(s), "k.", ms=4)
    ax.set_yticks(range(len(spec)), [label for _, label, _ in spec])
    ax.set_xlabel("ms")
    ax.set_title(f"Joining 1 row into B={rows} rows of {context_tokens} tokens")
    fig.tight_layout()
    return fig


def render_head_of_line(hol: pd.DataFrame) -> Figure:
    """Per engine, the tokens of running rows (dots, one line per row) over time since
    the joiner's submit, the joiner's prefill chunks (yellow ticks) and its first token
    (dashed line): the widest white gap is the head-of-line stall.

    Args:
        hol: one row per event, columns ``engine``, ``role`` (``"running"`` or
            ``"joiner"``), ``kind`` (``"submit"``, ``"prefill"``, ``"token"``), ``uid``,
            ``time_s`` (seconds); every engine needs the joiner's submit and first token.
    """
    engines = [e for e in ENGINE_COLOURS if e in set(hol.engine)]
    fig = Figure(figsize=(9, 1.0 + 1.3 * len(engines)))
    axes = np.atleast_1d(fig.subplots(len(engines), 1, sharex=True))
    for ax, engine in zip(axes, engines):
        ev = hol[hol.engine == engine]
        joiner = ev[ev.role == "joiner"]
        t0 = joiner[joiner.kind == "submit"].time_s.min()
        run = ev[(ev.role == "running") & (ev.kind == "token")]
        ax.plot(run.time_s - t0, run.uid, "|", color=ENGINE_COLOURS[engine], ms=8)
        for t in joiner[joiner.kind == "prefill"].time_s:
            ax.axvline(t - t0, color=PREFILL_COLOUR, lw=0.8)
        ax.axvline(joiner[joiner.kind == "token"].time_s.min() - t0, color="black", lw=1.5, ls="--")
        ax.set_yticks(sorted(run.uid.unique()))
        ax.set_ylabel("row uid")
        ax.set_title(engine, fontsize=9, loc="left")
    axes[-1].set_xlabel(
        "seconds since the long prompt arrived (yellow: its prefill chunks; dashed: its first token)"
    )
    fig.tight_layout()
    return fig


def target_of(engine: str) -> float:
    """The pacing target (decode steps) in an engine name such as ``"workbench, paced 4x
    step"`` (:func:`workbench.bench.pacing.paced_name`), NaN for an engine that is not paced."""
    return float(engine.split("paced ")[1].split("x")[0]) if "paced " in engine else np.nan


def frontier_points(requests: pd.DataFrame, gaps: pd.DataFrame) -> pd.DataFrame:
    """Per engine: ``engine, target`` (the pacing target in decode steps, NaN when not
    paced), ``ttft_p95_s`` and ``itl_p95_s`` (seconds), every round pooled."""
    rows = []
    for engine, r in requests.groupby("engine", sort=False):
        rows.append(
            {
                "engine": engine,
                "target": target_of(engine),
                "ttft_p95_s": r.ttft_s.quantile(0.95),
                "itl_p95_s": gaps[gaps.engine == engine].gap_s.quantile(0.95),
            }
        )
    return pd.DataFrame(rows)


def _label_paced(ax, paced: pd.DataFrame) -> None:
    """``t = target`` beside each paced point, joined to its own marker by a thin line: the
    labels sit one above the other right of the points (the lowest target highest), so two
    points a few pixels apart still get one label each."""
    for i, r in enumerate(paced.itertuples()):
        ax.annotate(
            f"t = {r.target:g}",
            (r.itl_p95_s * 1e3, r.ttft_p95_s * 1e3),
            textcoords="offset points",
            xytext=(14, 14 - 14 * i),
            fontsize=9,
            color=PACED_COLOUR,
            va="center",
            arrowprops={"arrowstyle": "-", "color": PACED_COLOUR, "lw": 0.8, "shrinkB": 4},
        )


def _goal_region(ax, ref: pd.DataFrame) -> None:
    """The goal box (ITL p95 <= mlx-lm's, TTFT p95 <= 0.6 x mlx-lm's): shaded, outlined and
    named inside, so it reads at 100 % zoom."""
    x, y = float(ref.itl_p95_s.iloc[0]) * 1e3, 0.6 * float(ref.ttft_p95_s.iloc[0]) * 1e3
    ax.fill_between([0, x], 0, y, color=PACED_COLOUR, alpha=0.22, lw=0, label="goal region")
    ax.plot([0, x, x], [y, y, 0], color=PACED_COLOUR, lw=1.4, ls="--")
    ax.annotate("goal", (x / 2, y / 2), ha="center", va="center", color=PACED_COLOUR, fontsize=10)


def render_frontier(workloads: dict) -> Figure:
    """TTFT p95 against ITL p95, one panel per workload: the paced runs as a line in
    target order (each labelled ``t = target`` at its own marker, ``t`` the gap target in
    decode steps), the workbench as shipped and mlx-lm as points, and the goal region (ITL
    p95 <= mlx-lm's, TTFT p95 <= 0.6 x mlx-lm's) shaded and outlined.

    Args:
        workloads: panel title -> ``(requests, gaps)`` frames (columns ``engine``, ``ttft_s`` /
            ``gap_s``, seconds), as :func:`workbench.bench.pacing.frontier_runs` returns.
    """
    fig = Figure(figsize=(4.6 * len(workloads), 4.6))
    axes = np.atleast_1d(fig.subplots(1, len(workloads)))
    for ax, (name, (requests, gaps)) in zip(axes, workloads.items()):
        pts = frontier_points(requests, gaps)
        ms = lambda v: v * 1e3  # noqa: E731
        paced = pts[pts.target.notna()].sort_values("target")
        label = "workbench, paced (t: gap target in decode steps)"
        ax.plot(ms(paced.itl_p95_s), ms(paced.ttft_p95_s), "o-", color=PACED_COLOUR, label=label)
        _label_paced(ax, paced)
        for engine, marker in (("workbench", "s"), ("mlx-lm", "D")):
            row = pts[pts.engine == engine]
            if len(row):
                ax.plot(
                    ms(row.itl_p95_s),
                    ms(row.ttft_p95_s),
                    marker,
                    color=ENGINE_COLOURS[engine],
                    ms=8,
                    label=engine if engine == "mlx-lm" else "workbench, fixed chunks",
                )
        ref = pts[pts.engine == "mlx-lm"]
        if len(ref):
            _goal_region(ax, ref)
        ax.set_xlim(0, 1.25 * ms(np.nanmax(pts.itl_p95_s)))  # room right of the points for the labels
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.08)
        ax.set_xlabel("ITL p95 (ms)")
        ax.set_ylabel("TTFT p95 (ms)")
        ax.set_title(name)
        ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False)
    fig.tight_layout()
    return fig
