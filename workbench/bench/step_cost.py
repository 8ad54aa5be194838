"""Why decode batches well: what one decode step costs as the batch grows, from the
benchmark's stored frames (``runs.csv``: measured step times; ``roofline.csv``: bytes a step
reads). Every row of the batch reuses the same weight read, so the step time grows far more
slowly than the rows it serves.

Knows: the columns of ``runs.csv`` (``engine``, ``B``, ``step_s``, ``tok_per_s``) and
``roofline.csv`` (``case``, ``B``, ``bytes_per_step``, ``context_tokens``), matplotlib.
Must not know: the engines (nothing here runs a model).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .figures import OTHER_COLOUR, WORKBENCH_COLOUR

MIB = 2**20
KV_COLOUR = WORKBENCH_COLOUR  # the views' live-KV blue (style.ATTENDED), as in every render_kv


def step_cost_table(runs: pd.DataFrame, roofline: pd.DataFrame, engine: str = "workbench") -> pd.DataFrame:
    """Per batch size ``B``: the median measured decode step (ms), tok/s, and the bytes one
    step reads (MiB), split into the weights (the same for every ``B``) and the KV cache.

    The weight bytes are the intercept of the roofline's ``bytes_per_step`` over ``B``
    (``bytes = weights + B * context * KV bytes per token``, exact for its decode rows).

    Returns:
        Columns ``B``, ``step_ms``, ``tok_per_s``, ``bound_tok_per_s`` (the roofline's
        memory bound: ``B`` tokens per read of a step's bytes at the machine's bandwidth,
        its ``memory_tok_per_s``; NaN when ``roofline`` lacks it), ``step_ms_per_row``,
        ``read_mib``, ``weights_mib``, ``kv_mib``, ``step_vs_B1`` (step time / the ``B = 1``
        step).

    Raises:
        ValueError: when ``runs`` has no rows of ``engine`` or ``roofline`` fewer than two
            decode rows.
    """
    mine = runs[runs.engine == engine]
    decode = roofline[roofline.case.str.startswith("decode")].sort_values("B")
    if mine.empty or len(decode) < 2:
        raise ValueError(
            f"need runs of {engine!r} and two roofline decode rows; got {len(mine)} and {len(decode)}"
        )
    slope, weights = np.polyfit(decode.B.to_numpy(float), decode.bytes_per_step.to_numpy(float), 1)
    g = mine.groupby("B")
    out = pd.DataFrame({"step_ms": g.step_s.median() * 1e3, "tok_per_s": g.tok_per_s.median()}).reset_index()
    bound = decode.set_index("B").get("memory_tok_per_s", pd.Series(dtype=float))
    out["bound_tok_per_s"] = bound.reindex(out.B).to_numpy(float)
    out["step_ms_per_row"] = out.step_ms / out.B
    out["weights_mib"] = weights / MIB
    out["kv_mib"] = slope * out.B / MIB
    out["read_mib"] = out.weights_mib + out.kv_mib
    out["step_vs_B1"] = out.step_ms / out.step_ms[out.B == out.B.min()].iloc[0]
    columns = ["B", "step_ms", "tok_per_s", "bound_tok_per_s", "step_ms_per_row", "read_mib"]
    return out[columns + ["weights_mib", "kv_mib", "step_vs_B1"]]


HEADER = ("B", "step (ms)", "per row (ms)", "tok/s", "bound tok/s", "read (MiB)", "KV (MiB)", "step / B=1")


def step_cost_text(table: pd.DataFrame) -> str:
    """The table as aligned text, one unit per header in brackets, columns two spaces
    apart: ms and MiB with one decimal, no e-notation."""
    rows = [
        [
            f"{int(r.B)}",
            f"{r.step_ms:.1f}",
            f"{r.step_ms_per_row:.1f}",
            f"{r.tok_per_s:.1f}",
            f"{r.bound_tok_per_s:.1f}",
            f"{r.read_mib:.1f}",
            f"{r.kv_mib:.1f}",
            f"{r.step_vs_B1:.2f}",
        ]
        for r in table.itertuples()
    ]
    lines = [list(HEADER)] + rows
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    return "\n".join("  ".join(f"{c:>{w}}" for c, w in zip(line, widths)) for line in lines)


def _step_panel(ax, table: pd.DataFrame, x: np.ndarray, labels: list[str]) -> None:
    ax.bar(x, table.step_ms, 0.6, color=WORKBENCH_COLOUR, label="one step (all rows)")
    ax.plot(x, table.step_ms_per_row, "--o", color=OTHER_COLOUR, label="per row")
    for i, r in enumerate(table.itertuples()):
        ax.annotate(
            f"{r.step_ms:.0f}",
            (i, r.step_ms / 2),  # mid-bar: the B=1 bar's top is its per-row marker
            ha="center",
            va="center",
            fontsize="small",
            color="white",
            fontweight="bold",
        )
        ax.annotate(
            f"{r.step_ms_per_row:.0f} ms/row",
            (i, r.step_ms_per_row),
            (6, 4),
            textcoords="offset points",
            fontsize="small",
            color=OTHER_COLOUR,
        )
    ax.set_xticks(x, labels)
    ax.set_ylabel("ms")
    ax.set_ylim(0, table.step_ms.max() * 1.25)
    ax.set_title("measured decode step", fontsize="small", loc="left")


def _rate_panel(ax, table: pd.DataFrame, x: np.ndarray, labels: list[str]) -> None:
    ax.bar(x, table.tok_per_s, 0.6, color=WORKBENCH_COLOUR, label="measured")
    ax.plot(x, table.bound_tok_per_s, "_", color="black", markersize=28, mew=2.5, label="memory bound")
    for i, r in enumerate(table.itertuples()):
        # beside the bar, right of the bound's tick, so the tick never crosses the number
        ax.annotate(
            f"{r.tok_per_s:.0f}",
            (i + 0.3, r.tok_per_s),
            (8, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize="small",
        )
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.5, len(x) - 0.1)  # room right of the last bar for its number
    ax.set_ylabel("tokens / s")
    top = np.nanmax(np.r_[table.tok_per_s.to_numpy(float), table.bound_tok_per_s.to_numpy(float)])
    ax.set_ylim(0, top * 1.15)
    ax.set_title("tok/s beside the memory bound", fontsize="small", loc="left")


def _bytes_panel(ax, table: pd.DataFrame, x: np.ndarray, labels: list[str]) -> None:
    ax.bar(x, table.weights_mib, 0.6, color=OTHER_COLOUR, label="weights (once per step)")
    ax.bar(x, table.kv_mib, 0.6, bottom=table.weights_mib, color=KV_COLOUR, label="KV cache (grows with B)")
    for i, r in enumerate(table.itertuples()):
        ax.annotate(f"KV {r.kv_mib:.1f}", (i, r.read_mib), ha="center", va="bottom", fontsize="small")
    ax.set_xticks(x, labels)
    ax.set_ylabel("MiB read per step")
    ax.set_ylim(0, table.read_mib.max() * 1.2)
    ax.set_title("bytes one step reads (roofline)", fontsize="small", loc="left")


def render_step_cost(table: pd.DataFrame, title: str | None = None) -> Figure:
    """Three panels over ``B``: the measured decode step (ms, its time per row dashed, both
    labelled), tokens/s beside the memory bound (``bound_tok_per_s``: a black tick), and
    the bytes a step reads (MiB, weights and KV stacked, the KV MiB written on top)."""
    fig = Figure(figsize=(9.4, 3.9), layout="constrained")
    if title:
        fig.suptitle(title)
    axes = fig.subplots(1, 3)
    x = np.arange(len(table))
    labels = [f"B={b}" for b in table.B]
    for ax, panel in zip(axes, (_step_panel, _rate_panel, _bytes_panel)):
        panel(ax, table, x, labels)
        ax.legend(
            fontsize="small",
            loc="upper center",
            bbox_to_anchor=(0.5, -0.12),
            ncol=1,
            frameon=False,
            handlelength=3.6,  # room for the bound's 28 pt tick before its words
        )
    return fig
