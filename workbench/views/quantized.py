"""Quantized KV view: what ``Scheduler(kv_bits=...)`` saves and costs against the float
cache, from the tables of :mod:`workbench.bench.quantized`.

Knows: those tables' columns, matplotlib. Must not know: the engine.

Text form: :func:`quantized_text` (the three tables, aligned). Rich form:
:func:`render_quantized`, three panels with one bar per setting (float first):

1. KV bytes per token (all layers, keys + values), with each bar's ratio to float;
2. decode step time (ms) at ``B`` rows x ``S`` tokens of context, one group per context,
   each quantized bar labelled (vertically, so neighbouring bars' labels never overlap)
   with its ratio to the float bar;
3. the most rows running at once under the same byte budget, and generated tokens per
   decode step.

The figure is ``WIDTH_IN`` (9.4 in) wide: 940 px at the inline backend's 100 dpi, so a
JupyterLab output area (about 968 px at a 1400 px window) shows it at its own size and its
smallest text (the legend, 8.3 pt) stays 11.6 px.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from . import style

__all__ = ["quantized_text", "render_quantized"]

WIDTH_IN = 9.4  # at 100 dpi narrower than a JupyterLab output area: shown unscaled

BITS_COLOURS = {
    "float": style.SERIES[0],
    "q8": style.SERIES[3],
    "q4": style.SERIES[2],
}  # by a setting's bits (no cache meaning)


def _colour(setting: str) -> str:
    """A setting's colour by its bits (``q4/g32`` and ``q4/g64`` alike)."""
    return BITS_COLOURS.get(setting.split("/")[0], style.SERIES[4])


def quantized_text(
    bytes_table: pd.DataFrame, steps: pd.DataFrame | None = None, admission: pd.DataFrame | None = None
) -> str:
    """The tables as aligned text: bytes per token, step times (when given, ms), and
    admission under the budget (when given)."""
    parts = [
        "KV bytes per token\n"
        + bytes_table[["setting", "bytes_per_token", "vs_float"]].to_string(
            index=False, float_format=lambda x: f"{x:.4g}"
        )
    ]
    if steps is not None:
        ms = steps.assign(step_ms=steps.step_s * 1e3)[
            ["setting", "rows", "context_tokens", "kv_bytes", "step_ms", "vs_float"]
        ]
        parts.append("decode step\n" + ms.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    if admission is not None:
        parts.append(
            "under one byte budget\n" + admission.to_string(index=False, float_format=lambda x: f"{x:.3g}")
        )
    return "\n\n".join(parts)


def _note(ax, text: str, xy: tuple[float, float], **extra) -> None:
    """``text`` just above point ``xy`` (data coordinates), centred, 9 pt."""
    ax.annotate(
        text, xy, ha="center", va="bottom", fontsize=9, xytext=(0, 2), textcoords="offset points", **extra
    )


def _bars(ax, table: pd.DataFrame, column: str, notes: list[str]) -> None:
    """One bar per row of ``table``: its ``setting`` in that setting's colour, as high as
    its ``column``, with its note above."""
    names = list(table.setting)
    bars = ax.bar(names, list(table[column]), color=[_colour(s) for s in names], edgecolor=style.EDGE)
    for bar, note in zip(bars, notes):
        _note(ax, note, (bar.get_x() + bar.get_width() / 2, bar.get_height()))
    ax.margins(y=0.18)


def render_quantized(
    bytes_table: pd.DataFrame,
    steps: pd.DataFrame,
    admission: pd.DataFrame,
    model_name: str = "",
    step_model_name: str = "",
) -> Figure:
    """Three panels (see the module docstring) of the tables of
    :mod:`workbench.bench.quantized`; ``steps`` may hold several context lengths.
    ``model_name`` / ``step_model_name`` label the model of the bytes and budget panels /
    of the step-time panel."""
    fig = Figure(figsize=(WIDTH_IN, 4.2), layout="constrained")
    ax_bytes, ax_step, ax_rows = fig.subplots(1, 3, width_ratios=[1, 1.45, 1])
    _bars(ax_bytes, bytes_table, "bytes_per_token", [f"x{r:.3g}" for r in bytes_table.vs_float])
    ax_bytes.set_ylabel("KV bytes per token (all layers)")
    ax_bytes.set_title(f"bytes{f' ({model_name})' if model_name else ''}", fontsize="medium")
    contexts = sorted(steps.context_tokens.unique())
    step_settings = list(dict.fromkeys(steps.setting))
    width = 0.8 / max(len(step_settings), 1)
    for i, s in enumerate(step_settings):
        rows = steps[steps.setting == s].set_index("context_tokens").reindex(contexts)
        xs = [k + (i - (len(step_settings) - 1) / 2) * width for k in range(len(contexts))]
        ax_step.bar(xs, rows.step_s * 1e3, width=width, color=_colour(s), edgecolor=style.EDGE, label=s)
        for x, v, r in zip(xs, rows.step_s * 1e3, rows.vs_float):
            if s != "float":  # the float bar is x1 by definition
                _note(ax_step, f"x{r:.2f}", (x, v), rotation=90)
    ax_step.set_xticks(range(len(contexts)), [f"S = {c}" for c in contexts])
    ax_step.set_ylabel("decode step (ms)")
    on = f" ({step_model_name})" if step_model_name else ""
    ax_step.set_title(f"step time{on}, B = {int(steps.rows.iloc[0])} rows", fontsize="medium")
    ax_step.margins(y=0.3)
    _bars(ax_rows, admission, "max_rows", [f"{t:.3g} tok/step" for t in admission.tokens_per_step])
    ax_rows.set_ylabel("most rows running at once")
    ax_rows.set_title(
        f"rows under a budget of\n{int(admission.kv_budget_bytes.iloc[0]):,} B", fontsize="medium"
    )
    style.legend(
        fig, [(name if name == "float" else f"{name[1:]}-bit", c) for name, c in BITS_COLOURS.items()]
    )
    return fig
