"""Ring-buffer view: a sliding-window layer group's cache drawn as the ring it is, one ring
per row and snapshot: ``W`` slots around a circle (storage slot 0 at the top, clockwise,
the slot numbers outside, a thick line where slot ``W-1`` wraps round to slot 0), each slot
labelled inside with the token position it holds; the slot the next token is written to
(overwriting the oldest token once the ring is full) in orange with an arrow, labelled with
that fed token (the title names the one it overwrites), the slots the
row attends in blue, masked slots (padding, or not written yet) grey. Each ring's title says
which position is written over which.

Knows: snapshots' window groups (``mask`` in storage order, ``write_index``, ``wrapped``),
rows' ``offset``, matplotlib. Must not know: the scheduler, MLX.

Text form: each group's :meth:`LayerGroup.text` (storage and temporal order grids).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrow, Wedge

from ..observe.snapshot import Snapshot
from . import style
from .mask import row_labels


def ring_cells(mask: np.ndarray, write_index: int | None, wrapped: bool | None) -> list[str]:
    """Per storage slot of one row: ``"write"`` (the slot the next token is written to),
    ``"attended"`` or ``"masked"``.

    >>> ring_cells(np.array([True, True, False, True]), 1, True)
    ['attended', 'write', 'masked', 'attended']
    """
    mask = np.asarray(mask, bool)
    write = write_index if wrapped else len(mask) - 1
    return ["write" if j == write else ("attended" if m else "masked") for j, m in enumerate(mask)]


COLOURS = {"write": style.FED, "attended": style.ATTENDED, "masked": style.PADDING}


def slot_positions(mask: np.ndarray, write_index: int | None, wrapped: bool | None, offset: int) -> list:
    """Per storage slot of one row, the token position it holds (``None`` for a masked
    slot), the write slot holding ``offset``, the position of the token fed next (the
    row's RoPE offset). Slot ``j`` is temporal index ``(j - write_index - 1) mod W`` of a
    wrapped ring (the write slot last), ``j`` of one not wrapped; temporal index ``t`` holds
    position ``offset - (W - 1 - t)``.

    >>> slot_positions(np.array([True, True, False, False, False, False, True, True]), 1, True, 3)
    [2, 3, None, None, None, None, 0, 1]
    """
    mask = np.asarray(mask, bool)
    W = len(mask)
    write = write_index if wrapped else W - 1
    temporal = [(j - write - 1) % W for j in range(W)]
    return [int(offset) - (W - 1 - t) if m else None for m, t in zip(mask, temporal)]


def write_note(positions: list, cells: list[str], offset: int) -> str:
    """What the write slot does at the next step: ``writes 11 over 3`` once the ring is
    full (the oldest token leaves the window), ``writes 3 over padding`` before."""
    W = len(cells)
    old = int(offset) - W
    full = all(c != "masked" for c in cells) and old >= 0
    return f"writes {int(offset)} over {old}" if full else f"writes {int(offset)} over padding"


def _label(ax, angle: float, r: float, text: str, **kw) -> None:
    ax.text(r * np.cos(angle), r * np.sin(angle), text, ha="center", va="center", **kw)


def _draw_ring(ax, cells: list[str], positions: list, title: str) -> None:
    W = len(cells)
    for j, cell in enumerate(cells):  # slot 0 at the top, clockwise
        start = 90 - (j + 1) * 360 / W
        ax.add_patch(
            Wedge((0, 0), 1.0, start, start + 360 / W, width=0.45, facecolor=COLOURS[cell], edgecolor="white")
        )
        angle = np.deg2rad(start + 180 / W)
        if positions[j] is not None:
            colour = "white" if cell != "masked" else "black"
            _label(ax, angle, 0.775, str(positions[j]), fontsize="small", color=colour, weight="bold")
        _label(ax, angle, 1.14, str(j), fontsize=8, color=style.EDGE)  # 8 pt: readable at 100 %
        if cell == "write":
            ax.add_patch(
                FancyArrow(
                    0,
                    0,
                    0.42 * np.cos(angle),
                    0.42 * np.sin(angle),
                    width=0.03,
                    head_width=0.12,
                    length_includes_head=True,
                    color="black",
                )
            )
    ax.plot([0, 0], [0.5, 1.05], color="black", linewidth=2.5)  # the wrap: slot W-1 | slot 0
    ax.set_xlim(-1.25, 1.25)
    ax.set_ylim(-1.25, 1.25)
    ax.set_aspect("equal")
    ax.set_axis_off()
    ax.set_title(title, fontsize="small")


def _ring_title(caption: str, label: str, positions: list, cells: list[str], offset: int) -> str:
    return f"{caption} · {label}\n{write_note(positions, cells, offset)}"


def render_ring(snapshots: Sequence[Snapshot], group: str, captions: Sequence[str] | None = None) -> Figure:
    """The window group ``group`` of each snapshot as rings, one per row (labelled by uid):
    a snapshot's rings side by side in one line, snapshots next to each other (``captions``,
    default ``step N``, head each ring), wrapping to a new line after about six rings.

    Raises:
        ValueError: for no snapshots, or a group that is not a sliding window.
        KeyError: when a snapshot has no ``group``.
    """
    if not snapshots:
        raise ValueError("render_ring needs at least one snapshot")
    W = snapshots[0].group(group).window_tokens
    if W is None:
        raise ValueError(f"group {group!r} is not a sliding window")
    captions = list(captions) if captions is not None else [f"step {s.step}" for s in snapshots]
    uids = sorted({u for s in snapshots for u in s.uids})
    per_line = max(1, 6 // max(len(uids), 1))
    n_lines = -(-len(snapshots) // per_line)
    n_cols = len(uids) * min(per_line, len(snapshots))
    fig = Figure(figsize=(max(1.48 * n_cols + 0.3, 5.6), 2.1 * n_lines + 1.1), layout="constrained")
    fig.suptitle(
        f"{group}: a ring of {W} slots per row (arrow: the slot written next)\n"
        "inside: the token position a slot holds; in orange, the fed token about to be written there\n"
        f"(over the token the ring's title names) · outside: the slot · thick line: slot {W - 1} wraps to 0",
        fontsize="small",
    )
    axes = fig.subplots(n_lines, n_cols, squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    for i, (snap, caption) in enumerate(zip(snapshots, captions)):
        g = snap.group(group)
        labels = dict(zip(snap.uids, row_labels(snap)))
        for r, uid in enumerate(uids):
            if uid not in snap.uids:
                continue
            b = snap.uids.index(uid)
            cells = ring_cells(g.mask[b], g.write_index, g.wrapped)
            positions = slot_positions(g.mask[b], g.write_index, g.wrapped, snap.offset[b])
            ax = axes[i // per_line, (i % per_line) * len(uids) + r]
            _draw_ring(
                ax, cells, positions, _ring_title(caption, labels[uid], positions, cells, snap.offset[b])
            )
    style.legend(
        fig,
        [
            ("the slot the fed token is written to (shows the fed token)", style.FED),
            ("attended", style.ATTENDED),
            ("masked (padding)", style.PADDING),
        ],
    )
    return fig
