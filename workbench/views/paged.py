"""Paged-KV counterfactual view: the padded batch's bytes beside a paged layout's, over a
run, drawn from a :func:`workbench.observe.paged.paged_table` (or a replay's
``Replay.layouts`` passed through :func:`~workbench.observe.paged.with_budget`).

Knows: the table's columns, matplotlib. Must not know: snapshots' internals, the engine.

Text form: :func:`workbench.observe.paged.paged_text` (re-exported here). Rich form:
:func:`render_paged`, three panels sharing the x axis (step, or ``time_s`` when the table
has it and ``x="time_s"``):

1. bytes (MiB): the padded batch stacked as data, left padding, growth step and free
   slots (they add up to the cache arrays' ``nbytes``), and the paged layout's bytes as one
   line per block size;
2. waste (% of each layout's bytes not holding a token): padded, and paged per block size;
3. the largest batch each layout admits under the table's byte budget (rows like the
   current ones), beside the rows really running.

One step's layouts (:func:`workbench.observe.paged.step_layout`'s dict): :func:`render_step_layout`,
one bar per layout, the padded batch's parts and each block size's tokens + last-block waste.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..observe.paged import PADDED_PARTS, block_sizes, paged_text
from . import style

__all__ = ["PART_COLOURS", "paged_text", "render_paged", "render_step_layout"]

MIB = 1024 * 1024
KIB = 1024
PART_COLOURS = {"data": style.ATTENDED, "padding": style.PADDING, "growth": style.UNUSED, "free": style.LATER}
PART_LABELS = {
    "data": "padded: tokens",
    "padding": "padded: left padding",
    "growth": "padded: growth step (unused)",
    "free": "padded: free slots",
}
STEP_LABELS = {
    "padding": "padded: left padding",
    "growth": "padded: growth step",
    "free": "padded: free slots",
}
PAGED_STYLES = ("-", "--", ":", "-.")
PAGED_COLOUR = style.PAGED_LAYOUT
PADDED_COLOUR = style.PADDED_LAYOUT  # the padded cache as shipped (17's padded layout too)
# three panels + title and legend: 6.6 in, about 660 px at 100 dpi, so the whole figure and its
# legend fit a JupyterLab output area of a 1400 x 900 window (2.3 in a panel was 819 px)
PANEL_HEIGHT_IN = 1.8


def _share(waste: pd.Series, total: pd.Series) -> np.ndarray:
    """``100 * waste / total`` where ``total > 0``, else NaN."""
    t = total.to_numpy(float)
    return np.where(t > 0, 100 * waste.to_numpy(float) / np.where(t > 0, t, 1), np.nan)


def render_paged(table: pd.DataFrame, title: str = "", x: str = "step", width_in: float = 9.4) -> Figure:
    """The padded and paged layouts over a run (see the module docstring).

    Args:
        table: a :func:`~workbench.observe.paged.paged_table` (``budget_bytes`` and the
            ``*_max_batch*`` columns are drawn when present).
        title: the figure's title. x: ``"step"`` or another column (e.g. ``"time_s"``).
        width_in: figure width (inches; at the inline backend's 100 dpi, 9.4 in is
            about 950 px with the tight bounding box, so a JupyterLab output area of
            968 px, at a 1400 px window, shows it unscaled; 9.6 in was 971 px, shrunk).

    Raises:
        KeyError: if ``x`` is not a column of ``table``.
    """
    if x not in table:
        raise KeyError(f"no column {x!r} in the table; columns: {list(table.columns)}")
    blocks = block_sizes(table)
    budget = "padded_max_batch" in table
    n_panels = 3 if budget else 2
    fig = Figure(figsize=(width_in, PANEL_HEIGHT_IN * n_panels + 1.2), layout="constrained")
    axes = fig.subplots(n_panels, 1, sharex=True)
    xs = table[x].to_numpy(float)

    bytes_ax = axes[0]
    parts = [table[f"padded_{p}_bytes"].to_numpy(float) / MIB for p in PADDED_PARTS]
    bytes_ax.stackplot(
        xs,
        *parts,
        colors=[PART_COLOURS[p] for p in PADDED_PARTS],
        step="post",
        edgecolor=style.EDGE,
        linewidth=0.3,
    )
    for b, ls in zip(blocks, PAGED_STYLES):
        bytes_ax.step(
            xs,
            table[f"paged_bytes_b{b}"] / MIB,
            where="post",
            color=PAGED_COLOUR,
            linestyle=ls,
            linewidth=1.4,
        )
    bytes_ax.set_ylabel("KV bytes (MiB)")
    bytes_ax.set_title(
        "bytes held: the padded batch (stacked) and a paged cache (lines)", fontsize="medium", loc="left"
    )

    waste_ax = axes[1]
    data = table.padded_data_bytes
    waste_ax.step(
        xs,
        _share(table.padded_bytes - data, table.padded_bytes),
        where="post",
        color=PADDED_COLOUR,
        linewidth=1.6,
    )
    for b, ls in zip(blocks, PAGED_STYLES):
        paged = table[f"paged_bytes_b{b}"]
        waste_ax.step(
            xs, _share(paged - data, paged), where="post", color=PAGED_COLOUR, linestyle=ls, linewidth=1.4
        )
    waste_ax.set_ylabel("waste (% of bytes)")
    waste_ax.set_ylim(0, 100)
    waste_ax.set_title("share of each layout's bytes holding no token", fontsize="medium", loc="left")

    handles = [
        Patch(facecolor=PART_COLOURS[p], edgecolor=style.EDGE, label=PART_LABELS[p]) for p in PADDED_PARTS
    ]
    handles.append(Line2D([], [], color=PADDED_COLOUR, linewidth=1.6, label="padded (waste, max batch)"))
    handles += [
        Line2D([], [], color=PAGED_COLOUR, linestyle=ls, linewidth=1.4, label=f"paged, {b}-token blocks")
        for b, ls in zip(blocks, PAGED_STYLES)
    ]
    if budget:
        batch_ax = axes[2]
        batch_ax.step(
            xs, table.padded_max_batch.astype(float), where="post", color=PADDED_COLOUR, linewidth=1.6
        )
        for b, ls in zip(blocks, PAGED_STYLES):
            batch_ax.step(
                xs,
                table[f"paged_max_batch_b{b}"].astype(float),
                where="post",
                color=PAGED_COLOUR,
                linestyle=ls,
                linewidth=1.4,
            )
        batch_ax.step(
            xs, table.rows.where(table.rows > 0), where="post", color=style.ATTENDED, linewidth=1.2, alpha=0.8
        )
        handles.append(Line2D([], [], color=style.ATTENDED, linewidth=1.2, label="rows running"))
        batch_ax.set_ylim(bottom=0)
        batch_ax.set_ylabel("rows")
        budget_bytes = int(table.budget_bytes.iloc[0]) if len(table) else 0
        batch_ax.set_title(
            f"largest batch of rows like these under {budget_bytes / MIB:,.1f} MiB",
            fontsize="medium",
            loc="left",
        )
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("decode step" if x == "step" else ("virtual time (s)" if x == "time_s" else x))
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=9.5, frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def render_step_layout(layout: dict, title: str = "") -> Figure:
    """One step's bytes in both layouts (KiB), one horizontal bar per layout: the padded
    batch stacked as tokens, left padding, growth step and free slots (the cache arrays'
    ``nbytes``), then one bar per block size ``b``: the same tokens and the unused part of
    each row's last block (hatched). Each bar is outlined in its layout's colour
    (``style.PADDED_LAYOUT`` / ``style.PAGED_LAYOUT``) and ends in its total.

    Args:
        layout: :func:`~workbench.observe.paged.step_layout`'s dict (``padded_*_bytes``,
            ``paged_bytes_b<b>``, ``paged_waste_bytes_b<b>``).

    Raises:
        KeyError: when ``layout`` has no ``padded_bytes`` or no ``paged_bytes_b<b>``.
    """
    blocks = sorted(int(k.rsplit("_b", 1)[1]) for k in layout if k.startswith("paged_bytes_b"))
    if "padded_bytes" not in layout or not blocks:
        raise KeyError(f"a step_layout dict needs padded_bytes and paged_bytes_b<b>; got {sorted(layout)}")
    names = ["padded (mlx-lm)"] + [f"paged, b={b}" for b in blocks]
    data = layout["padded_data_bytes"] / KIB
    segments = [[(layout[f"padded_{p}_bytes"] / KIB, PART_COLOURS[p], None) for p in PADDED_PARTS]]
    segments += [
        [(data, style.ATTENDED, None), (layout[f"paged_waste_bytes_b{b}"] / KIB, style.UNUSED, "//")]
        for b in blocks
    ]
    fig = Figure(figsize=(9.4, 0.45 * len(names) + 1.5), layout="constrained")
    ax = fig.subplots()
    for y, parts in enumerate(segments):
        left = 0.0
        for width, colour, hatch in parts:
            ax.barh(
                y,
                width,
                left=left,
                height=0.6,
                color=colour,
                hatch=hatch,
                edgecolor=style.EDGE,
                linewidth=0.5,
            )
            left += width
        outline = PADDED_COLOUR if y == 0 else PAGED_COLOUR
        ax.barh(y, left, height=0.6, fill=False, edgecolor=outline, linewidth=1.8)
        ax.annotate(f"{left:,.0f} KiB", (left, y), (4, 0), textcoords="offset points", va="center")
    ax.set_yticks(range(len(names)), names)
    for label, colour in zip(ax.get_yticklabels(), [PADDED_COLOUR] + [PAGED_COLOUR] * len(blocks)):
        label.set_color(colour)
    ax.invert_yaxis()
    ax.set_xlim(0, layout["padded_bytes"] / KIB * 1.12)
    ax.set_xlabel("KV bytes (KiB)")
    entries = [("tokens", style.ATTENDED)] + [
        (STEP_LABELS[p], PART_COLOURS[p]) for p in PADDED_PARTS[1:] if layout[f"padded_{p}_bytes"] > 0
    ]
    if any(layout[f"paged_waste_bytes_b{b}"] > 0 for b in blocks):
        entries.append(("paged: last block's unused part", style.UNUSED, "//"))
    style.legend(fig, entries, ncol=len(entries))
    if title:
        fig.suptitle(title)
    return fig
