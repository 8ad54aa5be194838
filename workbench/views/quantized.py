"""Quantized KV view: what ``Scheduler(kv_bits=...)`` saves and costs against the float
cache, from the tables of :mod:`workbench.bench.quantized`.

Knows: those tables' columns, matplotlib. Must not know: the engine.

What quantizing does, first (:func:`render_quantized_effect`, text form
:func:`quantized_tokens_text`): the KV bytes per token beside each row's generated tokens
compared position by position with the float cache's run of the same requests::

    q4/g32  uid 0 | = = x x x x x x x x x x   2/12 equal
    q4/g32  uid 1 | = = = = = = = = =         9/9 equal

Text form of the tables: :func:`quantized_text` (the three tables, aligned). Rich form:
:func:`render_quantized`, one bar per setting (float first), one colour per bits, a legend
naming each setting drawn with its group size:

1. (when given the bytes table) KV bytes per token (all layers, keys + values), with each
   bar's ratio to float;
2. decode step time (ms, the median) at ``B`` rows x ``S`` tokens of context, one group per
   context, whiskers over the middle half of the repeats, each quantized bar labelled
   (vertically, so neighbouring bars' labels never overlap) with its ratio to the float
   bar, the measurement's load average in the title;
3. the most rows running at once under the same byte budget (MiB), each bar labelled with
   its mean generated tokens per decode step.

The figure is ``WIDTH_IN`` (9.4 in) wide: 940 px at the inline backend's 100 dpi, so a
JupyterLab output area (about 968 px at a 1400 px window) shows it at its own size and its
smallest text (the legend, 8.3 pt) stays 11.6 px.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from . import style

__all__ = [
    "quantized_text",
    "quantized_tokens_text",
    "render_quantized",
    "render_quantized_effect",
    "token_agreement",
]

Tokens = Mapping[str, Mapping[int, Sequence[int]]]  # setting -> uid -> generated token ids

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


def _bytes_panel(ax, bytes_table: pd.DataFrame, model_name: str) -> None:
    """KV bytes per token per setting, each bar's ratio to float above it."""
    _bars(ax, bytes_table, "bytes_per_token", [f"x{r:.3g}" for r in bytes_table.vs_float])
    ax.set_ylabel("KV bytes per token (all layers)")
    ax.set_title(f"bytes{f' ({model_name})' if model_name else ''}", fontsize="medium")


def _load_range(steps: pd.DataFrame) -> str:
    """``1-min load average 1.5-2.1`` (the range of ``steps``' ``load_1min``), or ``""``
    when unknown."""
    if "load_1min" not in steps or steps.load_1min.isna().all():
        return ""
    lo, hi = steps.load_1min.min(), steps.load_1min.max()
    span = f"{lo:.1f}" if round(lo, 1) == round(hi, 1) else f"{lo:.1f}-{hi:.1f}"
    return f"1-min load average {span}"


def _step_panel(ax, steps: pd.DataFrame, step_model_name: str) -> None:
    """Median decode step time per setting, one group of bars per context, whiskers over
    the middle half of the repeats (when ``steps`` has their quartiles), ratios to float
    above the whiskers."""
    contexts = sorted(steps.context_tokens.unique())
    step_settings = list(dict.fromkeys(steps.setting))
    width = 0.8 / max(len(step_settings), 1)
    spread = {"step_s_p25", "step_s_p75"} <= set(steps.columns)
    for i, s in enumerate(step_settings):
        rows = steps[steps.setting == s].set_index("context_tokens").reindex(contexts)
        xs = [k + (i - (len(step_settings) - 1) / 2) * width for k in range(len(contexts))]
        ms = rows.step_s * 1e3
        ax.bar(xs, ms, width=width, color=_colour(s), edgecolor=style.EDGE)
        top = rows.step_s_p75 * 1e3 if spread else ms
        if spread:
            low, high = ms - rows.step_s_p25 * 1e3, top - ms
            ax.errorbar(xs, ms, yerr=[low, high], fmt="none", ecolor="black", elinewidth=1, capsize=2.5)
        for x, v, r in zip(xs, top, rows.vs_float):
            if s != "float":  # the float bar is x1 by definition
                _note(ax, f"x{r:.2f}", (x, v), rotation=90)
    ax.set_xticks(range(len(contexts)), [f"S = {c}" for c in contexts])
    ax.set_xlabel("tokens of context per row")
    ax.set_ylabel("decode step (ms)")
    on = f", {step_model_name}" if step_model_name else ""
    spread_note = "median, whiskers: middle half of the repeats" if spread else ""
    how = "\n".join(p for p in [spread_note, _load_range(steps)] if p)
    ax.set_title(f"decode step{on}, B = {int(steps.rows.iloc[0])} rows\n{how}".rstrip(), fontsize="medium")
    ax.margins(y=0.3)


def _rows_panel(ax, admission: pd.DataFrame, model_name: str) -> None:
    """The most rows running at once under one byte budget (MiB in the title), each
    bar's mean generated tokens per decode step above it."""
    _bars(ax, admission, "max_rows", [f"mean {t:.3g} tok/step" for t in admission.tokens_per_step])
    ax.set_ylabel("most rows running at once")
    budget_mib = admission.kv_budget_bytes.iloc[0] / 2**20
    on = f" ({model_name})" if model_name else ""
    ax.set_title(f"rows under a KV budget\nof {budget_mib:.3g} MiB{on}", fontsize="medium")


def _setting_name(setting: str) -> str:
    """A legend entry: ``q8/g32 = 8-bit, group 32``; ``float`` as it is."""
    if "/" not in setting:
        return setting
    bits, group = setting.split("/")
    return f"{setting} = {bits[1:]}-bit, group {group[1:]}"


def render_quantized(
    steps: pd.DataFrame,
    admission: pd.DataFrame,
    *,
    bytes_table: pd.DataFrame | None = None,
    model_name: str = "",
    step_model_name: str = "",
) -> Figure:
    """What a quantized cache buys and costs (see the module docstring): the decode step
    time of ``steps`` (:func:`workbench.bench.quantized.step_cost`'s frames, several
    context lengths allowed; whiskers where it has ``step_s_p25`` / ``step_s_p75``, its
    load average in the title where it has ``load_1min``) beside the rows under one
    budget of ``admission``; ``bytes_table`` given, the bytes per token first.
    ``model_name`` / ``step_model_name`` label the model of the bytes and budget panels /
    of the step-time panel. The legend names every setting drawn (``q8/g32 = 8-bit,
    group 32``), so panels of different group sizes say so."""
    panels = 2 if bytes_table is None else 3
    fig = Figure(figsize=(WIDTH_IN, 4.4), layout="constrained")
    axes = list(fig.subplots(1, panels, width_ratios=[0.85, 1.45, 1.1][-panels:]))
    if bytes_table is not None:
        _bytes_panel(axes.pop(0), bytes_table, model_name)
    _step_panel(axes[0], steps, step_model_name)
    _rows_panel(axes[1], admission, model_name)
    tables = [t for t in (bytes_table, steps, admission) if t is not None]
    names = dict.fromkeys(s for t in tables for s in t.setting)
    style.legend(fig, [(_setting_name(s), _colour(s)) for s in names])
    return fig


def token_agreement(tokens: Tokens, reference: str = "float") -> dict[str, dict[int, list[bool]]]:
    """Per setting of ``tokens`` other than ``reference``, per uid of the reference: one
    bool per position of the reference row's tokens, True where the setting's token at
    that position is the same (a shorter row counts as different past its end).

    >>> token_agreement({"float": {0: [5, 6, 7]}, "q4/g32": {0: [5, 9]}})
    {'q4/g32': {0: [True, False, False]}}

    Raises:
        KeyError: when ``reference`` or one of its uids is missing from a setting.
    """
    base = tokens[reference]
    return {
        name: {
            uid: [t < len(run[uid]) and run[uid][t] == tok for t, tok in enumerate(ref)]
            for uid, ref in base.items()
        }
        for name, run in tokens.items()
        if name != reference
    }


def quantized_tokens_text(tokens: Tokens, reference: str = "float") -> str:
    """One line per setting and uid: ``=`` a token equal to the ``reference`` run's at that
    position, ``x`` one that differs, then the count (the module docstring shows it)."""
    lines = []
    for name, rows in token_agreement(tokens, reference).items():
        for uid, same in rows.items():
            marks = " ".join("=" if s else "x" for s in same)
            lines.append(
                f"{name:<7} uid {uid:>2} | {marks:<{2 * max(map(len, rows.values()))}} {sum(same)}/{len(same)} equal"
            )
    return "\n".join(lines)


def render_quantized_effect(
    bytes_table: pd.DataFrame, tokens: Tokens, model_name: str = "", reference: str = "float"
) -> Figure:
    """What quantizing the KV cache does: KV bytes per token per setting (bars, ratio to
    float above each) beside a grid of every row's generated tokens, one line per setting
    and uid, one cell per position: equal to the ``reference`` run's token there
    (``style.GOOD``) or not (``style.BAD``); white past the row's end.

    Args:
        bytes_table: :func:`workbench.bench.quantized.bytes_per_token`'s table.
        tokens: setting -> uid -> generated ids of the same requests (e.g.
            ``{"float": {0: sched.tokens(0), ...}, "q8/g32": {...}}``), ``reference`` among them.

    Raises:
        KeyError: as :func:`token_agreement`.
    """
    agree = token_agreement(tokens, reference)
    labels = [f"{name} uid {uid}" for name, rows in agree.items() for uid in rows]
    same = [row for rows in agree.values() for row in rows.values()]
    width = max(map(len, same), default=1)
    grid = np.full((len(same), width), np.nan)  # [setting x uid, position]: 1 equal, 0 differs
    for i, row in enumerate(same):
        grid[i, : len(row)] = row
    fig = Figure(figsize=(WIDTH_IN, max(3.2, 0.9 + 0.24 * len(same))), layout="constrained")
    ax_bytes, ax_tok = fig.subplots(1, 2, width_ratios=[1, 2.2])
    _bytes_panel(ax_bytes, bytes_table, model_name)
    cmap = ListedColormap([style.BAD, style.GOOD]).with_extremes(bad=style.LATER)
    ax_tok.imshow(
        np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto", interpolation="nearest"
    )
    style.cell_borders(ax_tok, width, len(same))
    for edge in np.cumsum([len(rows) for rows in agree.values()])[:-1]:  # between two settings
        ax_tok.axhline(edge - 0.5, color=style.EDGE, linewidth=2.5)
    ax_tok.set_yticks(range(len(same)), labels, fontsize="small")
    style.integer_ticks(ax_tok.xaxis, 0, width - 1)
    ax_tok.set_xlabel("generated token position")
    ax_tok.set_title(f"each row's tokens against the {reference} cache's", fontsize="medium")
    style.legend(fig, [(f"same token as {reference}", style.GOOD), ("different token", style.BAD)])
    return fig
