"""Views of the KV byte budget over a run: the bytes the caches hold (stacked by owner)
against what admission projected and the budget, and MLX's measured memory against the
computed bytes, one point per engine call.

Knows: snapshots' byte fields (``kv_bytes``, ``prefill_kv_bytes``, ``prompt_cache_bytes``,
``kv_projected_bytes``), matplotlib. Must not know: the engine, MLX.

Bytes are drawn in MiB. Legends sit below the axes, off the data (``style.legend``). No
mlx-lm counterpart (mlx-lm draws nothing); the bytes are the engine's own readings.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..observe.snapshot import Snapshot
from . import style

MIB = 2**20
HELD = (  # (snapshot field, label, colour, hatch): the stacked owners of held bytes
    ("kv_bytes", "batch caches", style.ATTENDED, None),
    ("prefill_kv_bytes", "prefilling group", style.PREFILL, None),
    ("prompt_cache_bytes", "prompt cache", style.SERIES[3], "//"),  # purple, hatched: no second yellow
)
PROJECTED = "projected by admission (rows only)"  # the prompt cache is trimmed to the budget separately
LIMIT = {"color": "black", "ls": "--", "lw": 1.5}  # a limit, not a verdict: no verdict colour


def render_budget_bytes(
    history: Sequence[Snapshot], budget_bytes: int, per_request_bytes: Sequence[int] | None = None
) -> Figure:
    """KV bytes held per snapshot (MiB), stacked: batch caches, the prefilling group, the
    prompt cache; over them the bytes admission projected for the batch and prefilling
    rows (``kv_projected_bytes``: the prompt cache is not in it, it is trimmed to the
    budget separately), the budget ``budget_bytes`` (black, dashed) and, when given,
    ``per_request_bytes`` (one value per snapshot: a per-request sum to compare with, dotted).

    Raises:
        ValueError: for an empty ``history``, or ``per_request_bytes`` of another length.
    """
    if not history:
        raise ValueError("render_budget_bytes needs at least one snapshot")
    if per_request_bytes is not None and len(per_request_bytes) != len(history):
        raise ValueError(
            f"per_request_bytes has {len(per_request_bytes)} values for {len(history)} snapshots"
        )
    fig = Figure(figsize=(9.4, 3.8), layout="constrained")
    ax = fig.subplots()
    x = range(len(history))
    layers = ax.stackplot(
        x,
        *[[getattr(s, field) / MIB for s in history] for field, *_ in HELD],
        colors=[c for _, _, c, _ in HELD],
        alpha=0.85,
    )
    for layer, (*_, hatch) in zip(layers, HELD):
        layer.set_hatch(hatch)
        layer.set_edgecolor("white")  # the hatch's lines
    ax.plot(x, [s.kv_projected_bytes / MIB for s in history], color="black", lw=1)
    lines = [(PROJECTED, {"color": "black", "ls": "-", "lw": 1}), ("kv_budget_bytes", LIMIT)]
    if per_request_bytes is not None:
        dotted = {"color": style.EDGE, "ls": ":", "lw": 1.2}
        ax.plot(x, [b / MIB for b in per_request_bytes], **dotted)
        lines.append(("per-request sum", dotted))
    ax.axhline(budget_bytes / MIB, **LIMIT)
    ax.set_xlabel("snapshot (one per engine call that changed the batch)")
    ax.set_ylabel("MiB")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.06)  # the budget line below the frame, not on it
    ax.set_title("KV bytes held against the budget", fontsize="medium", loc="left")
    handles = [Patch(facecolor=c, edgecolor=style.EDGE, hatch=h, label=label) for _, label, c, h in HELD]
    handles += [Line2D([], [], label=label, **kw) for label, kw in lines]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize="small", frameon=False)
    return fig


def render_memory_moves(moves: Sequence[tuple[int, int]]) -> Figure:
    """One point per engine call: the computed change of held bytes against the measured
    change of MLX's active memory (both MiB), with the diagonal where they are equal.

    Args:
        moves: ``(computed_bytes_change, measured_bytes_change)`` per call.

    Raises:
        ValueError: for no moves.
    """
    if not moves:
        raise ValueError("render_memory_moves needs at least one (computed, measured) pair")
    fig = Figure(figsize=(4.8, 4.2), layout="constrained")
    ax = fig.subplots()
    ax.scatter([h / MIB for h, _ in moves], [a / MIB for _, a in moves], s=14, color=style.ATTENDED)
    lim = max(abs(v) for m in moves for v in m) * 1.1 / MIB
    ax.plot([-lim, lim], [-lim, lim], color=style.EDGE, lw=0.8)
    ax.set_xlabel("computed change of held bytes (MiB)")
    ax.set_ylabel("measured change of active memory (MiB)")
    ax.set_title("one point per engine call", fontsize="medium")
    return fig
