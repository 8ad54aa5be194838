"""Batch invariance: rows of a batched run against their runs alone, token by token, and
the operations that change a row's bits (:mod:`workbench.verify.invariance`).

Knows: :class:`~workbench.verify.invariance.StepGrid`, ``OpFinding``, ``ChunkFinding``,
matplotlib. Must not know: the engine, models; every form is a pure function of them.

Text forms (what nbval compares: counts and verdicts, no float noise)::

    default   B =  8: 8/8 rows bit-equal to alone at every token
    invariant B = 32: 32/32 rows bit-equal to alone at every token

    operation                          default     in the mode  mode's choice
    lm_head Linear 128->4096 float32   bit-equal   bit-equal    blocks of 1 rows (padded to 1)

Rich form: one panel per grid, rows (up) by generated tokens (across), a cell green where
the row's token and log-prob are bit-equal to alone, red where they differ, white where
neither run has that token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from . import style

EQUAL_COLOR, DIFFERS_COLOR, NONE_COLOR = style.GOOD, style.BAD, style.LATER


def grids_text(grids: Sequence) -> str:
    """One line per grid: rows bit-equal to alone at every token, and, on an indented
    second line, where the others first differ (``token t: n`` rows)."""
    lines = []
    for g in grids:
        firsts = [t for t in g.first_differences() if t is not None]
        line = f"{g.mode:9s} B = {g.batch_size:2d}: {g.n_equal_rows}/{g.batch_size} rows bit-equal to alone"
        line += " at every token"
        if firsts:
            where = ", ".join(f"token {t}: {firsts.count(t)}" for t in sorted(set(firsts)))
            line += ";\n" + " " * len("default   B = 32: ") + f"the others first differ at {where}"
        lines.append(line)
    return "\n".join(lines)


def render_grids(grids: Sequence, title: str = "") -> Figure:
    """Rows x tokens panels, one per grid (see the module docstring), at most 9.4 in wide
    (shown unscaled in a JupyterLab output area)."""
    fig = Figure(figsize=(min(9.4, 3.2 * len(grids)), 4.2), layout="constrained")  # unscaled at 100 dpi
    cmap = ListedColormap([NONE_COLOR, DIFFERS_COLOR, EQUAL_COLOR])  # -1, 0, 1
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    for ax, g in zip(axes, grids):
        ax.imshow(
            np.asarray(g.equal) + 1,
            cmap=cmap,
            vmin=0,
            vmax=2,
            aspect="auto",
            interpolation="nearest",
            origin="lower",
        )
        rows, tokens = np.nonzero(np.asarray(g.equal) == 0)  # a cross on each differing cell
        ax.scatter(tokens, rows, marker="x", s=10, c="white", linewidths=0.7)
        ax.set_title(f"{g.mode}, B = {g.batch_size}\n{g.n_equal_rows}/{g.batch_size} rows equal", fontsize=10)
        ax.set_xlabel("generated token")
    axes[0].set_ylabel("row (request)")
    if title:
        fig.suptitle(title, fontsize=11)
    style.legend(
        fig,
        [
            ("bit-equal to alone", EQUAL_COLOR),
            ("differs (token or log-prob)", DIFFERS_COLOR, style.BAD_HATCH),
        ]
        + ([("no token", NONE_COLOR)] if any((np.asarray(g.equal) < 0).any() for g in grids) else []),
    )
    return fig


def _verdict(diff: float | None, magnitudes: bool) -> str:
    if diff is None:
        return "unchanged"
    if diff == 0.0:
        return "bit-equal"
    return style.scientific(diff) if magnitudes else "differs"


def ops_text(ops: Sequence, magnitudes: bool = False) -> str:
    """One line per operation: a row among others vs alone, by default and in the mode
    (``bit-equal`` / ``differs``, or the largest |diff| with ``magnitudes``)."""
    names = [o.op.replace("mlx.core.", "") for o in ops]
    w = max(len(n) for n in names) if names else 9
    lines = [f"{'operation':{w}s}  {'default':10s}  {'in the mode':11s}  mode's choice"]
    for name, o in zip(names, ops):
        lines.append(
            f"{name:{w}s}  {_verdict(o.max_abs_diff, magnitudes):10s}  "
            f"{_verdict(o.mode_diff, magnitudes):11s}  {o.mode_choice}"
        )
    return "\n".join(lines)


def chunks_text(chunks: Sequence, magnitudes: bool = False) -> str:
    """One line per chunk size: tokens equal to the reference chunk size's, and the
    log-probs (``bit-equal`` / ``differ``, or the largest |diff| in nats)."""
    lines = []
    for c in chunks:
        lp = (
            "bit-equal"
            if c.max_abs_logprob_diff == 0.0
            else f"differ by up to {style.scientific(c.max_abs_logprob_diff)} nats"
            if magnitudes
            else "differ"
        )
        lines.append(
            f"prefill_step_size {c.prefill_step_size:5d} vs {c.reference_step_size}: tokens "
            f"{'equal' if c.tokens_equal else 'DIFFER'}, log-probs {lp}"
        )
    return "\n".join(lines)
