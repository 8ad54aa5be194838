"""Recurrent state against KV cache: bytes per layer group over a snapshot history. A
recurrent (``ssm``) group's state has a fixed size per row, whatever the context; an
attention group's KV cache holds every position of every row.

Knows: snapshots (``LayerGroup.kv_bytes``, ``token_bytes``, ``kv_width_tokens``),
matplotlib. Must not know: the scheduler, MLX.

For an attention group the bytes drawn are those its in-use positions hold,
``token_bytes x KV width x B`` (padding included; the allocation grows in 256-token steps
beyond it); for an ``ssm`` group its state arrays' bytes. Text form: one line per snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..observe.snapshot import LayerGroup, Snapshot
from . import style

KIB = 1024


def group_bytes(snap: Snapshot, g: LayerGroup) -> int:
    """Bytes ``g`` holds for the batch: the state for ``ssm``, else the in-use KV positions."""
    return g.kv_bytes if g.name == "ssm" else g.token_bytes * g.kv_width_tokens * snap.batch_size


def crossing_tokens(history: Sequence[Snapshot]) -> int | None:
    """The longest row's context (tokens) at the first snapshot with rows where an
    attention group holds more bytes than the ``ssm`` group's state (:func:`group_bytes`);
    ``None`` when that never happens or there is no ``ssm`` group."""
    for s in history:
        names = {g.name for g in s.groups}
        if s.batch_size and "ssm" in names:
            state = group_bytes(s, s.group("ssm"))
            if any(group_bytes(s, g) > state for g in s.groups if g.name != "ssm"):
                return int(max(s.context_tokens))
    return None


def state_text(history: Sequence[Snapshot]) -> str:
    """One line per snapshot with rows: step, rows, the longest context and each group's bytes."""
    names = [g.name for g in history[0].groups] if history else []
    lines = ["step  rows  longest context  " + "  ".join(f"{n + ' KiB':>12}" for n in names)]
    for s in history:
        if s.batch_size:
            lines.append(
                f"{s.step:>4}  {s.batch_size:>4}  {max(s.context_tokens):>15}  "
                + "  ".join(f"{group_bytes(s, g) / KIB:>12.1f}" for g in s.groups)
            )
    return "\n".join(lines)


def render_state(history: Sequence[Snapshot], title: str | None = None) -> Figure:
    """Bytes per layer group (KiB) against the longest row's context (tokens), one line
    per group: flat for recurrent state, rising for an attention group's KV cache; a
    dotted vertical line, labelled, where the KV cache first holds more than the state
    (:func:`crossing_tokens`).

    Raises:
        ValueError: when no snapshot of ``history`` has rows.
    """
    shown = [s for s in history if s.batch_size]
    if not shown:
        raise ValueError("render_state needs a snapshot with rows")
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ax = fig.subplots()
    context = [max(s.context_tokens) for s in shown]
    colours = {"ssm": style.STATE}
    for name in dict.fromkeys(g.name for s in shown for g in s.groups):
        points = [(c, group_bytes(s, s.group(name)) / KIB) for c, s in zip(context, shown)]
        label = f"{name}: recurrent state" if name == "ssm" else f"{name}: KV cache (in use)"
        ax.plot(*zip(*points), "o-", color=colours.get(name, style.ATTENDED), label=label, markersize=4)
    ax.set_xlabel("longest row's context (tokens)")
    ax.set_ylabel("KiB held by the group")
    ax.set_ylim(bottom=0)
    cross = crossing_tokens(shown)
    if cross is not None:
        ax.axvline(cross, color="black", ls=":", lw=1.2)
        ax.annotate(
            f"from {cross} tokens on, the KV cache\nholds more than the state",
            (cross, 0.04),
            xycoords=("data", "axes fraction"),
            xytext=(6, 0),
            textcoords="offset points",
            fontsize="small",
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    ax.set_title(title or "state and KV bytes as the rows grow", fontsize="medium", loc="left")
    return fig
