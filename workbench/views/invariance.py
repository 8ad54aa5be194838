"""Batch invariance: rows of a batched run against their runs alone, token by token, and
the operations that change a row's bits (:mod:`workbench.verify.invariance`).

Knows: :class:`~workbench.verify.invariance.StepGrid` (and its cell values), ``OpFinding``,
``ChunkFinding``, matplotlib. Must not know: the engine, models; every form is a pure function of them.

Text forms (what nbval compares: counts and verdicts, no float noise)::

    default   B =  8: 8/8 rows bit-equal to alone at every token
    invariant B = 32: 32/32 rows bit-equal to alone at every token

    operation                          default     in the mode  mode's choice
    lm_head Linear 128->4096 float32   bit-equal   bit-equal    blocks of 1 rows (padded to 1)

Rich form: one panel per grid, rows (up) by generated tokens (across), a cell in the
verdict's "equal" colour where the row's token and log-prob are bit-equal to alone, a light
"differs" colour where the token is the same and only its log-prob differs (last bits), the
full "differs" colour hatched where the token itself changed, blank where neither run has
that token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from ..verify.invariance import DIFFERS, EQUAL, NO_TOKEN, TOKEN_DIFFERS
from . import style

# (StepGrid value, legend label, colour, hatch): a changed token is the verdict's colour, hatched;
# a same token whose log-prob differs in its last bits is the same colour, lighter
CATEGORIES = (
    (EQUAL, "bit-equal to alone", style.GOOD, None),
    (DIFFERS, "same token, log-prob differs (last bits)", to_rgba(style.BAD, 0.35), None),
    (TOKEN_DIFFERS, "another token", style.BAD, style.BAD_HATCH),
    (NO_TOKEN, "no token (both stopped)", style.LATER, None),
)


def grids_text(grids: Sequence) -> str:
    """One line per grid: rows bit-equal to alone at every token, and, on an indented
    second line, where the others first differ (``first differing token: token 0 for 4
    rows, token 1 for 3``)."""
    lines = []
    for g in grids:
        firsts = [t for t in g.first_differences() if t is not None]
        line = f"{g.mode:9s} B = {g.batch_size:2d}: {g.n_equal_rows}/{g.batch_size} rows bit-equal to alone"
        line += " at every token"
        if firsts:
            counts = [(t, firsts.count(t)) for t in sorted(set(firsts))]
            where = ", ".join(
                f"token {t} for {n}" + (f" row{'s' if n > 1 else ''}" if i == 0 else "")
                for i, (t, n) in enumerate(counts)
            )
            line += ";\n" + " " * len("default   B = 32: ") + f"first differing token: {where}"
        lines.append(line)
    return "\n".join(lines)


def _cell_colours(equal: np.ndarray) -> np.ndarray:
    """``[B, T, 4]`` RGBA of a grid's cells (see :data:`CATEGORIES`)."""
    out = np.zeros((*equal.shape, 4))
    for value, _, colour, _ in CATEGORIES:
        out[equal == value] = to_rgba(colour)
    return out


def render_grids(grids: Sequence, title: str = "") -> Figure:
    """Rows x tokens panels, one per grid (see the module docstring), at most 9.4 in wide
    (shown unscaled in a JupyterLab output area). A changed token (hatched) and a token whose
    log-prob alone differs in its last bits (light) are told apart; the legend lists only the
    categories drawn."""
    fig = Figure(figsize=(min(9.4, 3.2 * len(grids)), 4.2), layout="constrained")  # unscaled at 100 dpi
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    for ax, g in zip(axes, grids):
        equal = np.asarray(g.equal)
        ax.imshow(_cell_colours(equal), aspect="auto", interpolation="nearest", origin="lower")
        for row, t in zip(*np.nonzero(equal == TOKEN_DIFFERS)):
            ax.add_patch(
                Rectangle((t - 0.5, row - 0.5), 1, 1, fill=False, hatch=style.BAD_HATCH, linewidth=0)
            )
        ax.set_title(f"{g.mode}, B = {g.batch_size}\n{g.n_equal_rows}/{g.batch_size} rows equal", fontsize=10)
        ax.set_xlabel("generated token")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("row (request)")
    if title:
        fig.suptitle(title, fontsize=11)
    drawn = set(np.unique(np.concatenate([np.asarray(g.equal).ravel() for g in grids]))) if grids else set()
    style.legend(
        fig, [(label, colour, hatch) for value, label, colour, hatch in CATEGORIES if value in drawn]
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


def ops_summary(ops: Sequence) -> str:
    """What :func:`ops_text`'s table says, counted, for prose that must hold on any BLAS:
    how many projections (``Linear`` / ``Embedding`` findings) give a row other bits among
    others (and the largest |diff|), attention behind left padding, the row-wise operations,
    and the mode's choices with how many projections took each. Example::

        projections: 6 of 6 differ among others (largest |diff| 2.9×10⁻⁶)
        attention behind left padding: 1.5×10⁻⁷
        row-wise operations: 3 of 3 bit-equal
        the mode's choice: one row per call for 6 projection(s)
    """
    projections = [o for o in ops if o.mode_diff is not None and not o.op.startswith("attention")]
    differ = [o.max_abs_diff for o in projections if o.max_abs_diff > 0]
    rowwise = [o for o in ops if o.mode_diff is None]
    largest = f" (largest |diff| {style.scientific(max(differ))})" if differ else ""
    lines = [f"projections: {len(differ)} of {len(projections)} differ among others{largest}"]
    lines += [
        f"attention behind left padding: {_verdict(o.max_abs_diff, True)}"
        for o in ops
        if o.op.startswith("attention")
    ]
    lines.append(
        f"row-wise operations: {sum(o.max_abs_diff == 0 for o in rowwise)} of {len(rowwise)} bit-equal"
    )
    choices = Counter(o.mode_choice for o in projections)
    lines.append("the mode's choice: " + ", ".join(f"{c} for {n} projection(s)" for c, n in choices.items()))
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
