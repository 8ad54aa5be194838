"""Mask view: per layer group and per row (labelled by uid), the attention mask the next
decode step uses, drawn from a :class:`~workbench.observe.snapshot.Snapshot`.

Knows: snapshots and their layer groups. Must not know: the scheduler, MLX.

Text form: each group's :meth:`LayerGroup.text` (geometry line and ASCII grid; ``#``
attended, ``.`` masked, ``@`` the fed token's slot)::

    masks at step 3: 2 row(s)
    [full] layers 0,1, 1,048,576 bytes; KV width 4 tokens
      mask ('#' attended, '.' padding, '@' fed token):
    uid 0 | # # # # @
    uid 1 | . . # # @

Rich form: one heatmap per group. Columns are key positions *relative to the fed token*
(0 = the fed token, -1 the token before it, ...), in temporal order, so the band of a
sliding-window group lines up under the same positions of a full-attention group (positions
a window group does not hold are hatched). A
window group is drawn from ``mask_temporal`` (the ring rolled to oldest-first order); an
``ssm`` group is one column (does the fed token enter the row's state).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..observe.snapshot import LayerGroup, Snapshot
from . import style

MASKED, ATTENDED, FED = 0, 1, 2  # cell codes of :func:`mask_cells`
FINISHED = 3  # drawn for a finished row's unmasked cells: it waits for filter()
CMAP = ListedColormap([style.PADDING, style.ATTENDED, style.FED, style.WAITING])
FINISHED_LABEL = "finished, waiting for filter()"
OUTSIDE_EDGE = style.EXPIRED  # hatch of positions a window group does not hold
GRID_MAX_COLUMNS = 64  # draw cell borders up to this many key positions


def mask_text(snap: Snapshot) -> str:
    """Deterministic text form: a header line and each group's geometry and mask grid
    (:meth:`LayerGroup.text`, its layer list shortened by :func:`style.layer_list`: a
    30-layer group reads ``layers 0-29``)."""
    head = f"masks at step {snap.step}: {snap.batch_size} row(s)"
    if not snap.uids:
        return f"{head}\n(no rows)"
    return "\n".join(
        [head]
        + [
            g.text(snap.uids).replace(
                f"layers {','.join(g.layers)}", f"layers {style.layer_list(g.layers)}", 1
            )
            for g in snap.groups
        ]
    )


def temporal_mask(group: LayerGroup) -> np.ndarray:
    """``[B, S]`` bool mask of ``group`` in temporal order, the fed token's slot last."""
    if group.window_tokens is not None and group.mask_temporal is not None:
        return np.asarray(group.mask_temporal, bool)
    return np.asarray(group.mask, bool)


def mask_cells(mask: np.ndarray) -> np.ndarray:
    """``[B, S]`` int cell codes of a temporal-order mask: ``MASKED`` (0), ``ATTENDED``
    (1), and ``FED`` (2) for the last column where attended.

    >>> mask_cells(np.array([[True, True], [False, True]])).tolist()
    [[1, 2], [0, 2]]
    """
    cells = np.asarray(mask, bool).astype(np.int64)
    if cells.shape[1]:
        cells[:, -1] = np.where(cells[:, -1] == 1, FED, MASKED)
    return cells


def row_labels(snap: Snapshot) -> list[str]:
    """``uid N`` per row, with ``(finished)`` for rows waiting for ``filter()`` and, when the
    scheduler loaded LoRA adapters, the row's adapter (``uid 2 · prose``, ``· none``), and a
    constrained row's constraint (``uid 3 · regex=[0-9]+``)."""
    adapters = snap.adapters if snap.adapters_loaded else (None,) * len(snap.uids)
    constraints = snap.constraints or ("",) * len(snap.uids)
    return [
        f"uid {u}"
        + (f" · {a or 'none'}" if snap.adapters_loaded else "")
        + (f" · {c}" if c else "")
        + (" (finished)" if f else "")
        for u, f, a, c in zip(snap.uids, snap.finished, adapters, constraints)
    ]


def _group_title(g: LayerGroup) -> str:
    layers = f"{g.name} · layers {style.layer_list(g.layers)}"
    if g.name == "ssm":
        return f"{layers} · recurrent state: does the fed token enter it"
    if g.window_tokens is not None:
        ring = f"ring wrapped, write slot {g.write_index}" if g.wrapped else "ring not wrapped yet"
        return f"{layers} · window {g.window_tokens} tokens, {ring} (temporal order)"
    return f"{layers} · KV width {g.kv_width_tokens} + fed column"


def _draw_group(ax, g: LayerGroup, snap: Snapshot, s_max: int) -> None:
    """One group's mask on ``ax``: rows by uid, columns right-aligned at the fed token (0),
    ``s_max`` positions wide; positions the group does not hold hatched; a finished row's
    unmasked cells in ``style.WAITING`` (``FINISHED``)."""
    cells = mask_cells(temporal_mask(g))
    cells[np.asarray(snap.finished, bool)[:, None] & (cells != MASKED)] = FINISHED
    B, S = cells.shape
    ax.imshow(
        cells,
        cmap=CMAP,
        vmin=0,
        vmax=FINISHED,
        aspect="auto",
        interpolation="nearest",
        extent=(-S + 0.5, 0.5, B - 0.5, -0.5),
    )
    if s_max <= GRID_MAX_COLUMNS:
        style.cell_borders(ax, S, B, x0=-S + 0.5, color="white", linewidth=1.0)
    ax.set_yticks(range(B), row_labels(snap))
    ax.set_xlim(-s_max + 0.5, 0.5)
    if S < s_max:  # positions this group's cache does not hold (outside its window)
        ax.axvspan(-s_max + 0.5, -S + 0.5, facecolor="white", edgecolor=OUTSIDE_EDGE, hatch="//")


def masked_label(groups: Sequence[LayerGroup]) -> str | None:
    """The legend's name for the masked cells of ``groups``' masks: ``masked (padding)``,
    or ``masked (padding / expired)`` when a sliding-window group masks a cell (its
    expired slots); ``None`` when no cell is masked (the legend then lists no such kind)."""
    masked = [g for g in groups if (mask_cells(temporal_mask(g)) == MASKED).any()]
    if not masked:
        return None
    return (
        "masked (padding / expired)"
        if any(g.window_tokens is not None for g in masked)
        else "masked (padding)"
    )


def _legend(
    fig: Figure,
    groups: Sequence[LayerGroup],
    wide: bool,
    not_held: bool,
    hatch_label: str = "not held (outside the window)",
    finished: bool = False,
) -> None:
    """The masks' legend below the axes: only the kinds of cell ``groups`` show (masked,
    :func:`masked_label`; attended; the fed token; a finished row when ``finished``), and
    the hatch when ``not_held``."""
    masked = masked_label(groups)
    entries = [(masked, style.PADDING)] if masked else []
    entries += [("attended cached token" if wide else "attended", style.ATTENDED)]
    entries += [(FED_LABEL if wide else "fed token", style.FED)]
    entries += [(FINISHED_LABEL, style.WAITING)] if finished else []
    entries += [(hatch_label, "white", "//")] if not_held else []
    style.legend(fig, entries, ncol=3 if len(entries) > 3 else None)  # fits 9 inches


FED_LABEL = "fed token (the query: its own key)"
X_LABEL = "key position relative to the fed token (0 = fed token)"


def render_masks(
    snap: Snapshot, title: str | None = None, width_in: float = 9.0, empty: str = "no rows in the batch"
) -> Figure:
    """Heatmap of every layer group's next-step mask, one axes per group, rows by uid,
    ``width_in`` inches wide; ``empty`` is the message of a batch with no rows (the Panel adds
    what to press; a notebook's figure and the HTML replay have no buttons).

    The x axis is ``key position relative to the fed token`` (shared by all groups), labelled
    at whole positions only; every cell has a border up to ``GRID_MAX_COLUMNS`` positions.
    """
    groups = list(snap.groups) if snap.uids else []
    B = snap.batch_size
    heights = [max(B, 1) * 0.32 + 0.7 for _ in groups] or [1.0]
    fig = Figure(figsize=(width_in, sum(heights) + (1.3 if width_in >= 6 else 1.0)), layout="constrained")
    fig.suptitle(
        title or f"attention masks for the next step (step {snap.step}, {B} row(s))",
        fontsize="medium" if width_in < 6 else "large",
    )
    if not groups:
        style.empty(fig.add_subplot(), empty)
        return fig
    axes = fig.subplots(len(groups), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
    widths = [temporal_mask(g).shape[1] for g in groups]
    for ax, g in zip(axes, groups):
        _draw_group(ax, g, snap, max(widths))
        ax.set_title(_group_title(g), fontsize="small", loc="left")
    style.integer_ticks(axes[-1].xaxis, -max(widths) + 1, 0, max_labels=16 if width_in >= 6 else 8)
    axes[-1].set_xlabel(X_LABEL)
    _legend(fig, groups, width_in >= 6, max(widths) > min(widths), finished=any(snap.finished))
    return fig


def render_mask_steps(
    snaps: Sequence[Snapshot],
    titles: Sequence[str] | None = None,
    title: str | None = None,
    group: str = "full",
) -> Figure:
    """The ``group`` mask of several snapshots side by side (before | after an engine call),
    on one shared x axis, ``key position relative to the fed token``: a wider cache reaches
    further left, so a step's growth and ``filter``'s compaction read as a change of width.

    Each panel is titled by ``titles`` (default ``step N``) and the group's KV width; rows by
    uid (:func:`row_labels`), a finished row's cells in ``style.WAITING`` (why ``filter``
    acts). Raises ``ValueError`` for no snapshots, ``KeyError`` when a
    snapshot with rows has no ``group``.

    >>> fig = render_mask_steps([before, after], ["before filter()", "after filter()"])  # doctest: +SKIP
    """
    if not snaps:
        raise ValueError("render_mask_steps needs at least one snapshot")
    titles = list(titles) if titles is not None else [f"step {s.step}" for s in snaps]
    widths = [temporal_mask(s.group(group)).shape[1] if s.uids else 1 for s in snaps]
    rows = max(max(s.batch_size for s in snaps), 1)
    fig = Figure(figsize=(min(4.5 * len(snaps), 9.0), rows * 0.32 + 1.9), layout="constrained")
    fig.suptitle(title or f"the next step's {group} mask", fontsize="medium")
    axes = fig.subplots(1, len(snaps), sharex=True, squeeze=False)[0]
    for ax, snap, name in zip(axes, snaps, titles):
        if not snap.uids:
            style.empty(ax, f"{name}: no rows in the batch")
            continue
        g = snap.group(group)
        _draw_group(ax, g, snap, max(widths))
        ax.set_title(f"{name}\nKV width {g.kv_width_tokens} + fed column", fontsize="small", loc="left")
        style.integer_ticks(ax.xaxis, -max(widths) + 1, 0, max_labels=12)
        ax.set_xlabel("key position (0 = fed token)", fontsize="small")
    finished = any(f for s in snaps for f in s.finished)
    shown = [s.group(group) for s in snaps if s.uids]
    _legend(fig, shown, True, max(widths) > min(widths), "no column (the cache is narrower here)", finished)
    return fig
