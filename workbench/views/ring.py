"""Ring-buffer view: a sliding-window layer group's cache drawn as the ring it is, one ring
per row and snapshot: ``W`` slots around a circle, the slot the next token is written to
(and the fed token attends from) in orange, the slots the row attends in blue, masked
slots (padding, or not written yet) grey; an arrow points at the write slot.

Knows: snapshots' window groups (``mask`` in storage order, ``write_index``, ``wrapped``),
matplotlib. Must not know: the scheduler, MLX.

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


def _draw_ring(ax, cells: list[str], title: str) -> None:
    W = len(cells)
    for j, cell in enumerate(cells):  # slot 0 at the top, clockwise
        start = 90 - (j + 1) * 360 / W
        ax.add_patch(
            Wedge(
                (0, 0),
                1.0,
                start,
                start + 360 / W,
                width=0.45,
                facecolor=COLOURS[cell],
                edgecolor="white",
                linewidth=1.5,
            )
        )
        angle = np.deg2rad(start + 180 / W)
        ax.text(
            0.775 * np.cos(angle),
            0.775 * np.sin(angle),
            str(j),
            ha="center",
            va="center",
            fontsize="small",
            color="white" if cell != "masked" else "black",
        )
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
    ax.set_xlim(-1.1, 1.1)
    ax.set_ylim(-1.1, 1.1)
    ax.set_aspect("equal")
    ax.set_axis_off()
    ax.set_title(title, fontsize="small")


def render_ring(snapshots: Sequence[Snapshot], group: str) -> Figure:
    """The window group ``group`` of each snapshot as rings: one column per snapshot, one
    line per row (labelled by uid; a row absent from a snapshot is left blank).

    Raises:
        ValueError: for no snapshots, or a group that is not a sliding window.
        KeyError: when a snapshot has no ``group``.
    """
    if not snapshots:
        raise ValueError("render_ring needs at least one snapshot")
    uids = sorted({u for s in snapshots for u in s.uids})
    fig = Figure(figsize=(min(9, 1.9 * len(snapshots) + 0.6), 1.9 * len(uids) + 0.9), layout="constrained")
    W = snapshots[0].group(group).window_tokens
    if W is None:
        raise ValueError(f"group {group!r} is not a sliding window")
    fig.suptitle(
        f"{group}: the ring of {W} slots per row (arrow: the slot the next token is written to)",
        fontsize="medium",
    )
    axes = fig.subplots(len(uids), len(snapshots), squeeze=False)
    for c, snap in enumerate(snapshots):
        g = snap.group(group)
        labels = dict(zip(snap.uids, row_labels(snap)))
        for r, uid in enumerate(uids):
            ax = axes[r, c]
            if uid not in snap.uids:
                ax.set_axis_off()
                continue
            b = snap.uids.index(uid)
            _draw_ring(
                ax, ring_cells(g.mask[b], g.write_index, g.wrapped), f"step {snap.step} · {labels[uid]}"
            )
    style.legend(
        fig,
        [
            ("the slot written next (the fed token)", style.FED),
            ("attended", style.ATTENDED),
            ("masked (padding)", style.PADDING),
        ],
    )
    return fig
