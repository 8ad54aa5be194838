"""The padding a mid-decode join adds to the batch cache, against the joiner's prompt length,
one line per batch size: drawn from :func:`workbench.workloads.join_padding.join_padding_table`
(measured on the engine) with the formula beside it.

Knows: that table's columns, matplotlib. Must not know: the scheduler, MLX.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from . import style


def render_join_padding(table: pd.DataFrame, title: str | None = None, width_in: float = 9.0) -> Figure:
    """Padded positions added by one join (y, tokens) against the joiner's prompt tokens
    ``n`` (x), a line per batch size ``B`` (the formula) with the engine's measured points on
    it, and a dashed line at the running rows' KV width ``w``: left of it the joiner is padded
    (``w - n``, whatever ``B``), right of it every running row is (``(B - 1)(n - w)``).

    Args:
        table: :func:`~workbench.workloads.join_padding.join_padding_table`'s frame.
        width_in: the figure's width in inches (9.0: 900 px at the notebooks' 100 dpi).

    Raises:
        ValueError: an empty table.
    """
    if table.empty:
        raise ValueError("render_join_padding needs at least one measured join")
    fig = Figure(figsize=(width_in, 3.6), layout="constrained")
    ax = fig.add_subplot()
    for (B, part), colour in zip(table.groupby("batch_size"), style.SERIES):
        ax.plot(part.prompt_tokens, part.formula, "-", color=colour, label=f"B = {B} rows")
        ax.plot(
            part.prompt_tokens,
            part.added_padding,
            "o",
            color=colour,
            markeredgecolor=style.EDGE,
        )
    width = int(table.kv_width_tokens.iloc[0])
    ax.axvline(width, color="black", linestyle="--", linewidth=1)
    ax.set_ylim(
        0, 1.15 * max(int(table.added_padding.max()), int(table.formula.max()), 1)
    )  # room for the label
    ax.text(
        width,
        0.97,
        f" running rows' KV width w = {width}",
        transform=ax.get_xaxis_transform(),
        va="top",
        fontsize="small",
    )
    ax.set_xlabel("joiner's prompt tokens n")
    ax.set_ylabel("padded positions added")
    ax.grid(alpha=0.3)
    ax.legend(
        fontsize="small",
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        frameon=False,
        title="line: formula\ndot: measured",
    )
    ax.set_title(
        "a short joiner is padded itself (w - n); a long one pads every running row ((B - 1)(n - w))",
        fontsize="small",
        loc="left",
    )
    if title:
        fig.suptitle(title)
    return fig
