"""Accepted and rejected draft tokens per row per step (speculative decoding), drawn from
the event log (``draft`` events; :func:`workbench.observe.speculation.draft_grid`).

Knows: events, :mod:`workbench.observe.speculation`, matplotlib. Must not know: the
scheduler, MLX.

Text form (:func:`drafts_text`): one line per uid, a cell per decode step, ``+`` per
accepted draft token and ``-`` per rejected one (``.`` where the row drafted nothing),
then its acceptance rate and tokens per verify forward::

    4 steps, 8/15 draft tokens accepted (53%), 4.50 tokens per forward over the batch
    uid 0 | ++++ ++-  +--- .    | 7/11 accepted (64%), 2.75 tokens/forward
    uid 1 | .    .    ---  +    | 1/4 accepted (25%), 1.25 tokens/forward

With ``last_steps=N`` both forms show the latest ``N`` steps instead (the live Panel's
window, which moves as the user steps); the headline then says which steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..observe.events import Event
from ..observe.speculation import acceptance, batch_tokens_per_forward, draft_grid
from . import style

ACCEPTED, REJECTED = style.GOOD, style.BAD


def _cell(drafted: int, accepted: int, width: int) -> str:
    return ("+" * accepted + "-" * (drafted - accepted) if drafted else ".").ljust(width)


def _window(T: int, max_steps: int, last_steps: int | None) -> slice:
    """The decode steps (columns of :func:`draft_grid`, ``T`` of them) a view shows: the
    first ``max_steps``, or the latest ``last_steps``.

    Raises:
        ValueError: ``max_steps < 1`` or ``last_steps < 1``.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if last_steps is None:
        return slice(0, min(T, max_steps))
    if last_steps < 1:
        raise ValueError(f"last_steps must be >= 1 or None, got {last_steps}")
    return slice(max(0, T - last_steps), T)


def drafts_text(
    events: Sequence[Event] | pd.DataFrame, max_steps: int = 40, last_steps: int | None = None
) -> str:
    """Deterministic text form (see the module docstring): the first ``max_steps`` steps
    with drafts (with ``last_steps``: the latest ``last_steps`` steps up to the last one
    with drafts), a headline with the batch's totals over every step.

    Raises:
        ValueError: ``max_steps < 1`` or ``last_steps < 1``.
    """
    uids, drafted, accepted = draft_grid(events)
    cols = _window(drafted.shape[1], max_steps, last_steps)
    table = acceptance(events).set_index("uid")
    if not uids:
        return "no draft tokens (speculation off, or no row could draft)"
    width = max(1, int(drafted.max()))
    total_d, total_a = int(drafted.sum()), int(accepted.sum())
    shown = "" if last_steps is None else f" (steps {cols.start}-{drafted.shape[1] - 1} shown)"
    lines = [
        f"{drafted.shape[1]} steps{shown}, {total_a}/{total_d} draft tokens accepted "
        f"({total_a / total_d:.0%}), {batch_tokens_per_forward(events):.2f} tokens per forward over the batch"
    ]
    for i, u in enumerate(uids):
        cells = " ".join(_cell(int(d), int(a), width) for d, a in zip(drafted[i, cols], accepted[i, cols]))
        r = table.loc[u]
        lines.append(
            f"uid {u} | {cells} | {int(r.accepted_tokens)}/{int(r.drafted_tokens)} accepted "
            f"({r.acceptance_rate:.0%}), {r.tokens_per_forward:.2f} tokens/forward"
        )
    return "\n".join(lines)


RATE_XLIM = 1.9  # the rate axis runs past 1 to hold each bar's "tokens per forward" label
LANE = 0.8  # a lane's bar height: a step's full capacity of ``num_draft_tokens`` drafts


def _lane(ax, i: int, steps: np.ndarray, drafted: np.ndarray, accepted: np.ndarray, k: int) -> None:
    """Lane ``i`` (y grows downward): per step an outlined empty box of the full bar height
    (``k`` draft slots, divided by thin lines up to 8 slots), filled from its bottom by the
    accepted, then the rejected draft tokens, so a partly filled box reads as a fraction."""
    floor = i + LANE / 2
    acc, rej = accepted / k * LANE, (drafted - accepted) / k * LANE
    ax.bar(steps, acc, bottom=floor - acc, width=LANE, color=ACCEPTED)
    ax.bar(
        steps,
        rej,
        bottom=floor - acc - rej,
        width=LANE,
        color=REJECTED,
        hatch=style.BAD_HATCH,
        edgecolor="white",
    )
    ax.bar(steps, LANE, bottom=floor - LANE, width=LANE, fill=False, edgecolor=style.EDGE, linewidth=1)
    if 1 < k <= 8:
        y = floor - LANE * np.arange(1, k)[:, None] / k
        x = np.asarray(steps, float)
        ax.hlines(
            np.broadcast_to(y, (k - 1, len(x))).ravel(),
            np.tile(x - LANE / 2, k - 1),
            np.tile(x + LANE / 2, k - 1),
            colors=style.BORDER,
            linewidth=0.5,
        )


def _rates(ax, uids: list[int], table: pd.DataFrame) -> None:
    """Each uid's acceptance rate as a 0-1 bar, its tokens per verify forward written after
    the bar (``table``: :func:`acceptance` indexed by uid)."""
    rate = [table.loc[u].acceptance_rate for u in uids]
    ax.barh(range(len(uids)), rate, color=ACCEPTED)
    for i, u in enumerate(uids):  # after the bar, not inside it: another unit than the bar's
        tpf = table.loc[u].tokens_per_forward
        ax.text(rate[i] + 0.04, i, f"{tpf:.2f} tok/fwd", va="center", fontsize="small")
    ax.set_xlim(0, RATE_XLIM)
    ax.set_xticks([0, 0.5, 1])
    ax.tick_params(left=False)  # no tick mark before the label (it read as a minus sign)
    ax.set_xlabel("acceptance rate (0-1)")


def render_drafts(
    events: Sequence[Event] | pd.DataFrame,
    title: str | None = None,
    width_in: float = 9.2,
    height_in: float | None = None,
    last_steps: int | None = None,
    num_draft_tokens: int | None = None,
) -> Figure:
    """Rich form: one lane per uid over the decode steps; at each step an outlined box of
    ``num_draft_tokens`` draft slots, filled from its bottom by the accepted, then the
    rejected draft tokens (an empty box: the row drafted nothing); beside it,
    each uid's acceptance rate (a 0-1 bar) with its tokens per verify forward written after
    the bar, outside it.

    Args:
        width_in, height_in: the figure's size in inches (height default: 0.5 per uid + 1.8);
            the default width fits a JupyterLab output area (968 px) at 100 dpi, unscaled.
        last_steps: draw only the latest ``last_steps`` decode steps (default: all).
        num_draft_tokens: the scheduler's drafts per step, the height of a box
            (default: the most drafts any step fed).

    Raises:
        ValueError: ``last_steps < 1``.
    """
    uids, drafted, accepted = draft_grid(events)
    table = acceptance(events).set_index("uid")
    U, T = drafted.shape
    cols = _window(T, max(T, 1), last_steps)
    fig = Figure(figsize=(width_in, height_in or 0.5 * max(U, 1) + 1.8), layout="constrained")
    if title:
        fig.suptitle(title)
    lanes, rates = fig.subplots(1, 2, width_ratios=[3.4, 1.6], sharey=True)
    k = num_draft_tokens or max(1, int(drafted.max()) if drafted.size else 1)
    steps = np.arange(T)[cols]
    drafted, accepted = drafted[:, cols], accepted[:, cols]
    for i in range(U):
        _lane(lanes, i, steps, drafted[i], accepted[i], k)
    lanes.set_yticks(range(U), [f"uid {u}" for u in uids])
    lanes.set_ylim(U - 0.5, -0.5) if U else None
    if len(steps):
        style.integer_ticks(lanes.xaxis, int(steps[0]), int(steps[-1]))
    narrow = width_in < 6  # the live Panel's image: short labels, the legend in two columns
    lanes.set_xlabel("decode step" if narrow else "decode step (one verify forward over the batch)")
    lanes.set_title(
        f"draft tokens per step (a box holds {k} drafts, filled from its bottom)",
        fontsize="small",
        loc="left",
    )
    _rates(rates, uids, table)
    rates.set_xlabel("acceptance rate" if width_in < 6 else "acceptance rate (0-1)")
    style.legend(
        fig,
        [
            ("accepted draft token", ACCEPTED),
            ("rejected draft token", REJECTED, style.BAD_HATCH),
            (f"no draft fed (of {k} per step)", style.LATER),
        ],
        ncol=2 if narrow else 3,
    )
    return fig
