"""Divergence by layer: the per-layer Δ table of :func:`workbench.verify.layers.localize`
as text and as a figure.

Knows: the table's columns (:data:`workbench.verify.layers.COLUMNS`), matplotlib. Must not
know: the engine, models; both forms are pure functions of the table.

Text form (what nbval compares: verdicts only, no float noise)::

    layer  over  first position  positions
        0    no               -  -
        1    no               -  -
        2   YES              13  13
        3   YES              13  13

Rich form: ``max |Δ|`` per layer on a log scale, for the layer's output at the fed
position (dots) and for its KV cache over the row's real positions (squares), each with
its tolerance (dashed, dotted); a marker over its tolerance in red, the first layer over
tolerance annotated with its positions; a zero Δ drawn on the bottom line (said in the
axis label), an infinite one (caches of different lengths) a decade over the largest; the
legend below the axes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from . import style

OVER = style.BAD  # a layer over tolerance
WITHIN = style.GOOD


def divergence_text(table: pd.DataFrame) -> str:
    """One line per layer: whether it is over tolerance, its first position over it and
    all of them (``3-5, 9``; ``-`` for none)."""
    from ..verify.layers import ranges  # lazily: verify imports MLX, importing the views must not

    lines = ["layer  over  first position  positions"]
    for _, r in table.iterrows():
        first = "-" if pd.isna(r["first_position"]) else str(int(r["first_position"]))
        lines.append(
            f"{int(r['layer']):5d}  {'YES' if r['over'] else 'no':>4}  {first:>14}  {ranges(list(r['positions']))}"
        )
    return "\n".join(lines)


def _deltas(
    ax, layers, deltas, over, tolerance, label: str, short: str, line: dict, hollow: bool = False
) -> None:
    """One marker per layer at its ``deltas`` (coloured :data:`OVER` where ``over``, else
    :data:`WITHIN`; circles, or hollow squares when ``hollow``; an over-tolerance layer a
    cross, so the verdict does not rest on colour) and ``tolerance`` as a step
    line drawn with ``line`` (matplotlib's ``ls`` and ``color``)."""
    over = np.asarray(over, bool)
    layers, deltas = np.asarray(layers), np.asarray(deltas)
    within = ~over
    labelled = within if within.any() else over
    for part, colour, marker in ((within, WITHIN, "s" if hollow else "o"), (over, OVER, style.BAD_MARKER)):
        if hollow:
            marks = dict(edgecolors=colour, facecolors="none", linewidths=1.5, s=45, marker=marker, zorder=2)
        else:
            marks = dict(c=colour, s=60, marker=marker, zorder=3)
        ax.scatter(layers[part], deltas[part], label=label if part is labelled else None, **marks)
    ax.step(layers, tolerance, where="mid", lw=1, label=f"tolerance ({short})", **line)


def render_divergence(table: pd.DataFrame, title: str = "") -> Figure:
    """The figure of the module docstring: ``max |Δ|`` and tolerance per layer (log scale),
    over-tolerance layers as crosses, the first one annotated with its positions.

    Args:
        table: :func:`workbench.verify.layers.layer_table` (``LayerDivergence.table``).
        title: shown above the axes (e.g. ``LayerDivergence.text()``'s head).

    Raises:
        ValueError: for an empty table.
    """
    if table.empty:
        raise ValueError("empty table: no layers to draw")
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.add_subplot()
    layers = table["layer"].to_numpy()
    floor = _floor(table)
    out = np.maximum(table["max_abs_delta"].to_numpy(float), floor)
    kv = np.maximum(table["kv_max_abs_delta"].to_numpy(float), floor)
    kv[np.isposinf(kv)] = 10 * np.nanmax(
        np.r_[out, kv[np.isfinite(kv)]]
    )  # caches of different lengths: on top
    out_over = table["max_abs_delta"].to_numpy(float) > table["tolerance"].to_numpy(float)
    kv_over = table["kv_max_abs_delta"].to_numpy(float) > table["kv_tolerance"].to_numpy(float)
    ax.plot(layers, out, color="#555555", lw=1, zorder=1)
    output_line, kv_line = dict(ls="--", color="#555555"), dict(ls=":", color="#888888")
    _deltas(
        ax, layers, out, out_over, table["tolerance"], "output at the fed position", "output", output_line
    )
    if np.isfinite(kv).any():  # KV markers hollow, under the output's
        _deltas(
            ax,
            layers,
            kv,
            kv_over,
            table["kv_tolerance"],
            "KV cache, real positions",
            "KV",
            kv_line,
            hollow=True,
        )
    _mark_first(ax, table, out)
    ax.set_yscale("log")
    zero = (table[["max_abs_delta", "kv_max_abs_delta"]].to_numpy(float) == 0).any()
    ax.set_xlabel("layer" + ("   (|Δ| = 0 is drawn on the bottom line)" if zero else ""), fontsize=11)
    ax.set_ylabel("max |Δ| batched vs alone", fontsize=11)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=10)
    verdicts = {bool(v) for v in out_over} | (
        {bool(v) for v in kv_over[np.isfinite(kv)]} if len(kv) else set()
    )
    _legend(fig, has_kv=bool(np.isfinite(kv).any()), verdicts=verdicts)
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    return fig


def _legend(fig: Figure, has_kv: bool, verdicts: set[bool] = frozenset({False, True})) -> None:
    """Below the axes: the marker shapes (grey: their colour is the verdict), the
    tolerance lines, and the verdicts drawn (``verdicts``: ``True`` for over tolerance,
    ``False`` for within)."""
    grey = "#555555"
    entries = [
        Line2D([], [], ls="", marker="o", color=grey, markersize=7, label="output at the fed position"),
        Line2D([], [], ls="--", color=grey, lw=1, label="tolerance (output)"),
    ]
    if has_kv:
        entries += [
            Line2D(
                [],
                [],
                ls="",
                marker="s",
                markerfacecolor="none",
                markeredgecolor=grey,
                markersize=7,
                label="KV cache, real positions",
            ),
            Line2D([], [], ls=":", color="#888888", lw=1, label="tolerance (KV)"),
        ]
    if False in verdicts:
        entries.append(Patch(color=WITHIN, label="within tolerance"))
    if True in verdicts:
        entries.append(
            Line2D([], [], ls="", marker=style.BAD_MARKER, color=OVER, markersize=8, label="over tolerance")
        )
    fig.legend(handles=entries, loc="outside lower center", ncol=3, fontsize=9, frameon=False)


def _floor(table: pd.DataFrame) -> float:
    """Where a zero Δ is drawn on the log axis: a decade under the smallest positive value."""
    values = table[["max_abs_delta", "kv_max_abs_delta", "tolerance"]].to_numpy(float).ravel()
    positive = values[np.isfinite(values) & (values > 0)]
    return float(positive.min()) / 10 if positive.size else 1e-12


def _mark_first(ax, table: pd.DataFrame, out: np.ndarray) -> None:
    """Annotate the first over-tolerance layer with its positions (or say none is)."""
    from ..verify.layers import ranges

    over = table.index[table["over"]]
    if not len(over):
        ax.text(0.99, 0.03, "every layer within tolerance", transform=ax.transAxes, ha="right", fontsize=10)
        return
    i = over[0]
    where = list(table.loc[i, "positions"])
    positions = f"position{'s' if len(where) > 1 else ''} {ranges(where)}"
    right_half = table.loc[i, "layer"] > table["layer"].max() / 2
    ax.annotate(
        f"first over tolerance: layer {int(table.loc[i, 'layer'])}\n{positions}",
        xy=(table.loc[i, "layer"], out[i]),
        xytext=(0.45 if right_half else 0.55, 0.5),
        textcoords="axes fraction",
        ha="right" if right_half else "left",
        fontsize=10,
        color=OVER,
        arrowprops={"arrowstyle": "->", "color": OVER},
    )
