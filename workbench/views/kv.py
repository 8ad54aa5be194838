"""KV geometry view: how each row uses the batch cache, and padding waste and KV bytes
over the scheduler's snapshot history.

Knows: snapshots (one, or a history: a list in the order they were taken). Must not
know: the scheduler, MLX.

Per attention group and row, the cache's in-use positions (the KV width) split into
``padding`` (left padding: ``clip(left_padding, 0, width)``), ``valid`` (cached tokens the
next step attends to: the group's mask minus the fed slot) and, for a sliding-window ring,
``expired`` (slots holding a token outside the window, e.g. the slot the fed token
overwrites); beyond the KV width lies ``unused`` capacity (allocated, not in use). For a
full-attention group ``padding + valid = width`` exactly. Text form (rows ``uid 7`` and
``uid 9`` with left padding 0 and 2, KV width 3, capacity 8)::

    KV geometry at step 3: 2 row(s), 4,096 KV bytes, padding waste 33.3%
    [full] layers 0,1: KV width 3 of 8 allocated tokens
      uid | padding    valid   unused
        7 |       0        3        5
        9 |       2        1        5

History text form: one line per snapshot (step, rows, KV width, padding waste, KV bytes).
Rich form: stacked bars per row and group (left), padding waste and KV bytes per step (right).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from ..observe.snapshot import LayerGroup, Snapshot
from . import style
from .mask import row_labels

BREAK_BOX = dict(facecolor="white", edgecolor="none", pad=1.0)  # behind the "//" break mark: a gap in the bar
SEGMENTS = (
    ("padding", style.PADDING),
    ("valid", style.ATTENDED),
    ("expired", style.EXPIRED),
    ("unused", style.UNUSED),
)


def row_geometry(group: LayerGroup) -> dict[str, np.ndarray]:
    """Per row of an attention ``group``, ``[B]`` int token counts: ``padding``, ``valid``,
    ``expired`` (``width - padding - valid``; 0 for full attention) and ``unused``
    (``capacity - width``)."""
    width = group.kv_width_tokens
    padding = np.clip(np.asarray(group.left_padding, np.int64), 0, width)
    valid = np.asarray(group.mask, bool).sum(axis=1) - 1
    return {
        "padding": padding,
        "valid": valid,
        "expired": width - padding - valid,
        "unused": np.full_like(padding, group.capacity_tokens - width),
    }


def attention_groups(snap: Snapshot) -> list[LayerGroup]:
    """The snapshot's groups with a sequence axis (all but ``ssm``), if it has rows."""
    return [g for g in snap.groups if g.name != "ssm"] if snap.uids else []


def kv_text(snap: Snapshot) -> str:
    """Deterministic text form of one snapshot's KV geometry (see the module docstring)."""
    lines = [
        f"KV geometry at step {snap.step}: {snap.batch_size} row(s), {snap.kv_bytes:,} KV bytes, "
        f"padding waste {snap.padding_waste:.1%}"
    ]
    width = max([3] + [len(str(u)) for u in snap.uids])
    for g in attention_groups(snap):
        geo = row_geometry(g)
        cols = [c for c, _ in SEGMENTS if c != "expired" or g.window_tokens is not None]
        lines.append(
            f"[{g.name}] layers {style.layer_list(g.layers)}: KV width {g.kv_width_tokens} "
            f"of {g.capacity_tokens} allocated tokens"
        )
        lines.append(f"  {'uid':>{width}} | " + "  ".join(f"{c:>7}" for c in cols))
        for r, uid in enumerate(snap.uids):
            lines.append(f"  {uid:>{width}} | " + "  ".join(f"{int(geo[c][r]):>7}" for c in cols))
    for g in snap.groups if snap.uids else []:
        if g.name == "ssm":
            lines.append(
                f"[ssm] layers {style.layer_list(g.layers)}: {g.kv_bytes:,} bytes of fixed-size "
                f"state per batch, no sequence axis; shapes {list(g.state_shapes)}"
            )
    return "\n".join(lines)


def kv_history_text(history: Sequence[Snapshot]) -> str:
    """One line per snapshot of ``history``: step, rows, KV width, padding waste, KV bytes."""
    lines = ["step  rows  KV width  padding waste      KV bytes"]
    for s in history:
        lines.append(
            f"{s.step:>4}  {s.batch_size:>4}  {s.kv_width_tokens:>8}  "
            f"{s.padding_waste:>13.1%}  {s.kv_bytes:>12,}"
        )
    return "\n".join(lines)


def segments_present(snap: Snapshot) -> list[str]:
    """The names of ``SEGMENTS`` some row of ``snap`` has (a non-zero count in an attention
    group): what the legend and the axis label list."""
    geos = [row_geometry(g) for g in attention_groups(snap)]
    return [n for n, _ in SEGMENTS if any(geo[n].any() for geo in geos)]


def _draw_rows(ax, snap: Snapshot, g: LayerGroup, narrow: bool = False) -> None:
    """One group's stacked bars per row; an axis shorter than the capacity ends in a
    break mark (``//``) on each bar, beside the row's count of unused tokens, and the
    title says where the axis is cut."""
    geo = row_geometry(g)
    B = snap.batch_size
    left = np.zeros(B)
    for name, color in SEGMENTS:
        ax.barh(range(B), geo[name], left=left, color=color, edgecolor=style.EDGE, linewidth=0.5)
        left = left + geo[name]
    shown = min(g.capacity_tokens, max(2 * g.kv_width_tokens, g.kv_width_tokens + 16))
    ax.set_xlim(0, max(shown, 1))
    cut = g.capacity_tokens > shown
    for r in range(B) if cut else ():  # the axis is cut: a break mark on each bar's end, the rest in words
        ax.text(shown, r, "//", ha="center", va="center", fontweight="bold", clip_on=False, bbox=BREAK_BOX)
        ax.text(
            shown * 0.97, r, f"+{int(geo['unused'][r])} unused", ha="right", va="center", fontsize="small"
        )
    ax.set_yticks(range(B), row_labels(snap))
    ax.invert_yaxis()
    cut_note = (f" · cut at {shown}" if narrow else f" (axis cut at {shown})") if cut else ""
    tokens = "" if narrow else " tokens"
    ax.set_title(
        f"{g.name} · KV width {g.kv_width_tokens} of {g.capacity_tokens}{tokens}{cut_note}",
        fontsize="small",
        loc="left",
    )


def bytes_unit(n_bytes: float) -> tuple[int, str]:
    """The divisor and name of the unit that writes ``n_bytes`` without e-notation: MiB
    from 1 MiB, else KiB.

    >>> bytes_unit(1_966_080), bytes_unit(65_536)
    ((1048576, 'MiB'), (1024, 'KiB'))
    """
    return (2**20, "MiB") if n_bytes >= 2**20 else (2**10, "KiB")


def bytes_text(n_bytes: int) -> str:
    """``n_bytes`` in the unit of :func:`bytes_unit`, two decimals; ``0 bytes`` for none.

    >>> bytes_text(11_796_480), bytes_text(65_536), bytes_text(0)
    ('11.25 MiB', '64.00 KiB', '0 bytes')
    """
    if not n_bytes:
        return "0 bytes"
    unit, name = bytes_unit(n_bytes)
    return f"{n_bytes / unit:,.2f} {name}"


def step_ticks(steps: Sequence[int], max_ticks: int = 10) -> tuple[list[int], list[str]]:
    """Tick positions and labels for a history drawn one point per snapshot: a tick at the
    first snapshot of each decode step, thinned to at most ``max_ticks`` (every k-th step),
    and none closer than ``len(steps) / max_ticks`` positions to the one before (where
    a step has many snapshots, two labels would overlap).

    >>> step_ticks([0, 0, 1, 2, 2, 3])
    ([0, 2, 3, 5], ['0', '1', '2', '3'])
    >>> step_ticks([0] + [1] * 11 + [2], max_ticks=3)  # step 1's tick would touch step 0's
    ([0, 12], ['0', '2'])
    """
    firsts = [i for i, st in enumerate(steps) if i == 0 or st != steps[i - 1]]
    every = -(-len(firsts) // max_ticks) if firsts else 1
    gap = len(steps) / max_ticks
    kept: list[int] = []
    for i in firsts[::every]:
        if not kept or i - kept[-1] >= gap:
            kept.append(i)
    return kept, [str(steps[i]) for i in kept]


def render_kv(snap: Snapshot, history: Sequence[Snapshot] = (), width_in: float = 9.4) -> Figure:
    """KV geometry figure, ``width_in`` inches wide (9.4: 940 px at the notebooks' 100 dpi,
    unscaled in a JupyterLab output area of a 1400 px window): per attention group a bar per row
    (padding, valid, expired, unused; x in tokens), and, when ``history`` is given,
    padding waste (%) and KV bytes (KiB or MiB, :func:`bytes_unit`) per snapshot, ticked by
    step (two snapshots of one step, before and after a join, stay two points), with
    ``snap`` marked. A history of one snapshot, or with no KV bytes yet, says so
    instead of drawing empty axes; bytes and waste never go below 0."""
    groups = attention_groups(snap)
    narrow = width_in < 6
    fig = Figure(
        figsize=(
            width_in,
            max(2.9 if narrow else 3.8, 0.9 + sum(0.3 * snap.batch_size + 0.8 for g in groups)),
        ),
        layout="constrained",
    )
    held = bytes_text(snap.kv_bytes) if snap.kv_bytes else "no KV bytes"
    fig.suptitle(
        f"KV cache, step {snap.step}: {held}, padding {snap.padding_waste:.0%}"
        if narrow
        else f"KV cache geometry at step {snap.step}: {snap.batch_size} row(s), {held}, padding waste "
        f"{snap.padding_waste:.1%}",
        fontsize="medium" if narrow else "large",
    )
    left, right = fig.subfigures(1, 2, width_ratios=[3, 2]) if history else (fig, None)
    if groups:
        axes = left.subplots(len(groups), 1, squeeze=False)[:, 0]
        for ax, g in zip(axes, groups):
            _draw_rows(ax, snap, g, narrow)
        present = segments_present(snap)
        axes[-1].set_xlabel("tokens per row" if narrow else f"tokens per row (stacked: {', '.join(present)})")
    else:
        style.empty(left.add_subplot(), "no attention cache" if snap.uids else "no rows in the batch")
    if right is not None:
        _draw_history(right, snap, history, narrow)
    if groups:
        style.legend(fig, [(n, c) for n, c in SEGMENTS if n in present])
    return fig


def _draw_history(fig, snap: Snapshot, history: Sequence[Snapshot], narrow: bool = False) -> None:
    """Padding waste and KV bytes per step of ``history`` on ``fig`` (a subfigure); short
    axis labels when ``narrow``."""
    if len(history) < 2 or not any(s.kv_bytes for s in history):
        style.empty(fig.add_subplot(), "history: drawn from\nthe first step on")
        return
    x = np.arange(len(history))  # one position per snapshot: a join's before and after stay apart
    unit, unit_name = bytes_unit(max(s.kv_bytes for s in history))
    waste_ax, bytes_ax = fig.subplots(2, 1, sharex=True)
    waste_ax.plot(
        x, [100 * s.padding_waste for s in history], "o-", color=style.PADDING, markeredgecolor=style.EDGE
    )
    waste_ax.set_ylabel("padding %" if narrow else "padding waste (%)")
    waste_ax.set_ylim(0, max(5.0, 1.1 * max(100 * s.padding_waste for s in history)))
    bytes_ax.plot(x, [s.kv_bytes / unit for s in history], "o-", color=style.ATTENDED)
    bytes_ax.set_ylabel(unit_name if narrow else f"KV bytes ({unit_name})")
    bytes_ax.set_ylim(0, 1.1 * max(s.kv_bytes for s in history) / unit)
    ticks, labels = step_ticks([s.step for s in history], 6 if narrow else 10)
    bytes_ax.set_xticks(ticks, labels)
    bytes_ax.set_xlabel("step" if narrow else "step (a point per snapshot)")
    bytes_ax.set_xlim(-0.5, len(history) - 0.5)
    shown = shown_index(snap, history)
    for ax in (waste_ax, bytes_ax):
        if shown is not None:
            ax.axvline(shown, color="black", linewidth=1)  # the shown snapshot
        ax.grid(alpha=0.3)


def batch_state(snap: Snapshot) -> tuple:
    """What a snapshot says about the batch (step, rows, per-row geometry, KV width and bytes,
    queue, prefill, free slots), without MLX's memory readings: two snapshots of one state, such as
    the engine's recorded one and a later ``sched.snapshot()`` of the same moment, have equal keys."""
    return (
        snap.step,
        snap.uids,
        snap.finished,
        snap.generated_tokens,
        snap.context_tokens,
        tuple(np.asarray(snap.left_padding).tolist()),
        tuple(np.asarray(snap.offset).tolist()),
        snap.kv_width_tokens,
        snap.capacity_tokens,
        snap.kv_bytes,
        snap.queue,
        snap.prefilling,
        snap.free_slots,
    )


def shown_index(snap: Snapshot, history: Sequence[Snapshot]) -> int | None:
    """The index in ``history`` of the snapshot ``snap`` shows: ``snap`` itself, else the latest
    snapshot of the same :func:`batch_state` (``sched.snapshot()`` returns a new object equal to the
    one the engine recorded); ``None`` when ``history`` holds no such snapshot (then nothing is
    marked: the last snapshot of the same step may be another batch, before or after a join).
    Example: notebook 02's history holds three snapshots of step 5 (3 rows, then 2 rows after
    ``filter()``, then 3 rows after a joiner takes the free slot); ``sched.snapshot()`` taken right
    after ``filter()`` is the middle one, index -2, not the last of step 5.
    """
    for i in range(len(history) - 1, -1, -1):
        if history[i] is snap:
            return i
    key = batch_state(snap)
    return next((i for i in range(len(history) - 1, -1, -1) if batch_state(history[i]) == key), None)
