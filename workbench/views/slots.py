"""Slot x step view: which request holds each of the batch's ``max_batch`` slots at every
decode step, and which slots sit idle. Drawn from the event log, so static and continuous
batching of the same requests on the same engine can be put side by side.

Knows: events (``join``, ``token``, ``evict``, ``preempt``), matplotlib. Must not know: the
scheduler, MLX.

A *slot* is one of the batch's places; rows are renumbered at every ``filter`` but a
request keeps its slot from its ``join`` to its ``evict`` (the lowest slot free at its join).
Text form (:func:`slots_text`): one line per slot, a column per decode step, the uid (``0-9``,
then ``a-z``; ``*`` beyond) where the slot's request produced a token, ``.`` where it sat idle::

    slot 0 | 0 0 0 2 2 2 2
    slot 1 | 1 1 . . . . .
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..observe.events import Event
from . import style

IDLE = -1
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def slot_grid(events: Sequence[Event], slots: int) -> np.ndarray:
    """``[slots, steps]`` int: the uid whose token that slot produced at each decode step,
    ``IDLE`` (-1) where the slot produced none; ``steps`` = last token step + 1.

    Raises:
        ValueError: when more than ``slots`` requests hold slots at once.
    """
    holder: dict[int, int] = {}  # uid -> slot
    busy: set[int] = set()
    cells: list[tuple[int, int, int]] = []  # (slot, step, uid)
    for e in events:
        if e.kind == "join":
            free = [s for s in range(slots) if s not in busy]
            if not free:
                raise ValueError(f"uid {e.uid} joins at step {e.step} but all {slots} slots are held")
            holder[e.uid] = free[0]
            busy.add(free[0])
        elif e.kind in ("evict", "preempt") and e.uid in holder:
            busy.discard(holder.pop(e.uid))
        elif e.kind == "token" and e.uid in holder:
            cells.append((holder[e.uid], e.step, e.uid))
    steps = max((c[1] for c in cells), default=-1) + 1
    grid = np.full((slots, steps), IDLE, np.int64)
    for slot, step, uid in cells:
        grid[slot, step] = uid
    return grid


def utilisation(grid: np.ndarray) -> float:
    """Share of slot-steps that produced a token (0..1; 0.0 for an empty grid)."""
    return float((grid != IDLE).mean()) if grid.size else 0.0


def slots_text(grid: np.ndarray) -> str:
    """Deterministic text form of a :func:`slot_grid` (see the module docstring)."""
    head = (
        f"{grid.shape[1]} decode steps, {int((grid != IDLE).sum())} tokens in "
        f"{grid.size} slot-steps: {utilisation(grid):.0%} busy"
    )
    return "\n".join(
        [head]
        + [
            f"slot {s} | "
            + " ".join("." if u == IDLE else (DIGITS[u] if u < len(DIGITS) else "*") for u in row)
            for s, row in enumerate(grid)
        ]
    )


def render_slots(runs: Sequence[tuple[str, np.ndarray]], title: str | None = None) -> Figure:
    """One slot x step strip per run (a label and a :func:`slot_grid`), on a shared step
    axis: a blue cell where the slot's request produced a token, white where it sat idle,
    a black line where the slot changes hands, the uid written where its turn starts,
    hatched after a shorter run's last step.

    Raises:
        ValueError: for no runs.
    """
    if not runs:
        raise ValueError("render_slots needs at least one run")
    steps = max(g.shape[1] for _, g in runs)
    heights = [g.shape[0] * 0.42 + 0.6 for _, g in runs]
    fig = Figure(figsize=(9, sum(heights) + 1.2), layout="constrained")
    if title:
        fig.suptitle(title)
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
    cmap = ListedColormap([style.LATER, style.ATTENDED])
    for ax, (label, grid) in zip(axes, runs):
        S, T = grid.shape
        ax.imshow(
            (grid != IDLE).astype(int),
            cmap=cmap,
            vmin=0,
            vmax=1,
            aspect="auto",
            interpolation="nearest",
            extent=(-0.5, T - 0.5, S - 0.5, -0.5),
        )
        for s in range(S):
            for t in range(T):
                if grid[s, t] != IDLE and (t == 0 or grid[s, t - 1] != grid[s, t]):
                    ax.axvline(t - 0.5, ymin=1 - (s + 1) / S, ymax=1 - s / S, color="black", linewidth=1.5)
                    ax.text(
                        t + 0.1, s, str(grid[s, t]), va="center", ha="left", fontsize="small", color="white"
                    )
        ax.set_yticks(range(S), [f"slot {s}" for s in range(S)])
        ax.set_yticks(np.arange(-0.5, S), minor=True)
        ax.grid(which="minor", axis="y", color=style.BORDER, linewidth=0.6)
        ax.tick_params(which="minor", length=0)
        ax.set_xlim(-0.5, steps - 0.5)
        if T < steps:  # this run was over
            ax.axvspan(T - 0.5, steps - 0.5, facecolor="white", edgecolor=style.EXPIRED, hatch="//")
        ax.set_title(
            f"{label}: {T} decode steps, {utilisation(grid):.0%} of slot-steps busy",
            fontsize="small",
            loc="left",
        )
    axes[-1].set_xlabel("decode step")
    style.legend(
        fig,
        [
            ("a token (number: the uid; black line: a new request takes the slot)", style.ATTENDED),
            ("slot idle", style.LATER),
            ("this run already finished", "white", "//"),
        ],
    )
    return fig
