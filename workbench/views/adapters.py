"""Per-request LoRA in one forward: row x wrapped Linear layer, the adapter slot each row
gathers at each layer (``A[idx]``, ``B[idx]`` of the bank's per-layer stacks; slot 0 is the
base model's zero delta, also where a row's adapter does not wrap that layer).

:func:`render_adapter_slots` draws a whole run instead: slot x decode step, each token
coloured by its request's adapter (the event log through :func:`workbench.views.slots.slot_grid`).

Knows: a snapshot's ``uids`` and ``adapters`` (each row's ``Request.adapter``), events, the
loaded adapters' names and target layers (an :class:`~workbench.engine.levers.lora.AdapterBank`,
read duck-typed: ``names``, ``adapters[name].targets``), matplotlib. Must not know: the
scheduler, MLX.

Text form (:func:`adapters_text`): one line per row, its adapter, its slot and how many of
the wrapped layers give it a delta::

    35 wrapped Linear layers; slot 0 = base model (zero delta)
    uid 0 | prose   slot 2 | a delta at 35 of 35 layers
    uid 1 | numbers slot 1 | a delta at 9 of 35 layers (layers 2,3,4: q, v, down)
    uid 2 | none    slot 0 | no delta (the base model)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from . import style
from .slots import IDLE, slot_grid

BASE = style.LATER  # slot 0: the base model's zero delta
IDLE_COLOUR = style.UNUSED  # a slot without a request (hatched)
ADAPTER_COLOURS = (style.SERIES[1], style.SERIES[3], style.SERIES[4], style.SERIES[0])


FORWARD_ORDER = (
    "q",
    "k",
    "v",
    "o",
    "gate",
    "up",
    "down",
)  # a layer's Linears in the order a forward runs them


def _layer_key(path: str) -> tuple[int, int, str]:
    match = re.search(r"layers\.(\d+)\.", path)
    short = _short(path)
    rank = FORWARD_ORDER.index(short) if short in FORWARD_ORDER else len(FORWARD_ORDER)
    return (int(match.group(1)) if match else -1, rank, path)


def wrapped_layers(bank: Any) -> list[str]:
    """Every layer path some loaded adapter wraps, in the model's order (transformer layer,
    then q, k, v, o, gate, up, down)."""
    return sorted({p for a in bank.adapters.values() for p in a.targets}, key=_layer_key)


def adapter_slots(snapshot: Any, bank: Any) -> np.ndarray:
    """``[B, L]`` int: the slot row ``b`` of ``snapshot`` gathers at wrapped layer ``l``
    (:func:`wrapped_layers` order): its adapter's ``names.index + 1`` where that adapter
    wraps the layer, else 0 (the base model's zero delta).

    Raises:
        ValueError: a row's adapter is not one of ``bank.names``.
    """
    layers = wrapped_layers(bank)
    grid = np.zeros((len(snapshot.uids), len(layers)), np.int64)
    for b, name in enumerate(snapshot.adapters or [None] * len(snapshot.uids)):
        if name is None:
            continue
        if name not in bank.names:
            raise ValueError(f"row {b} selects adapter {name!r}, not one of the loaded {list(bank.names)}")
        targets = set(bank.adapters[name].targets)
        grid[b] = [bank.names.index(name) + 1 if p in targets else 0 for p in layers]
    return grid


def _short(path: str) -> str:
    return path.rsplit(".", 1)[-1].removesuffix("_proj")


def adapters_text(snapshot: Any, bank: Any) -> str:
    """Deterministic text form (see the module docstring)."""
    layers, grid = wrapped_layers(bank), adapter_slots(snapshot, bank)
    lines = [f"{len(layers)} wrapped Linear layers; slot 0 = base model (zero delta)"]
    width = max([len(n) for n in bank.names] + [4])
    for b, uid in enumerate(snapshot.uids):
        slot = int(grid[b].max()) if grid.size else 0
        name = bank.names[slot - 1] if slot else "none"
        hit = [p for p, s in zip(layers, grid[b]) if s]
        where = f"a delta at {len(hit)} of {len(layers)} layers" if hit else "no delta (the base model)"
        if hit and len(hit) < len(layers):
            nums = sorted({_layer_key(p)[0] for p in hit})
            where += f" (layer{'s' if len(nums) > 1 else ''} {style.layer_list([str(n) for n in nums])}: "
            where += (
                ", ".join(dict.fromkeys(_short(p) for p in sorted(hit, key=lambda p: _layer_key(p)[1]))) + ")"
            )
        lines.append(f"uid {uid} | {name:{width}} slot {slot} | {where}")
    return "\n".join(lines)


def render_adapters(snapshot: Any, bank: Any, title: str | None = None, width_in: float = 9.2) -> Figure:
    """Rich form: a row x wrapped-layer grid of one forward, each cell coloured by the
    adapter whose delta that row gets at that layer and labelled with the gathered slot
    (white, 0: the base model's zero delta); the transformer layer numbers under each group
    of columns, a line between groups.

    Args:
        width_in: the figure's width in inches (default fits a JupyterLab output area, 968 px
            at 100 dpi).
    """
    layers, grid = wrapped_layers(bank), adapter_slots(snapshot, bank)
    B, L = grid.shape
    fig = Figure(figsize=(width_in, 0.42 * max(B, 1) + 2.2), layout="constrained")
    if title:
        fig.suptitle(title)
    ax = fig.subplots()
    colours = [BASE, *ADAPTER_COLOURS[: len(bank.names)]]
    ax.imshow(grid, cmap=ListedColormap(colours), vmin=0, vmax=len(colours) - 1, aspect="auto")
    for (b, col), slot in np.ndenumerate(grid):
        ax.text(col, b, str(slot), ha="center", va="center", fontsize="small", color="black")
    style.cell_borders(ax, L, B)
    groups = [_layer_key(p)[0] for p in layers]
    starts = [i for i in range(L) if i == 0 or groups[i] != groups[i - 1]]
    ax.vlines([s - 0.5 for s in starts[1:]], -0.5, B - 0.5, colors="black", linewidth=1.5)
    ax.set_xticks(range(L), [_short(p) for p in layers], rotation=90, fontsize="small")
    for i, s in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else L
        ax.text((s + end - 1) / 2, -0.62, f"layer {groups[s]}", ha="center", va="bottom", fontsize="small")
    ax.set_yticks(range(B), [f"uid {u}: {a or 'none'}" for u, a in zip(snapshot.uids, _names(snapshot))])
    ax.set_xlabel("wrapped Linear layer (the number: the slot of A[idx], B[idx] the row gathers)")
    names = [("base model: zero delta (slot 0)", BASE)]
    style.legend(fig, names + [(f"{n} (slot {i + 1})", colours[i + 1]) for i, n in enumerate(bank.names)])
    return fig


def _names(snapshot: Any) -> list[str | None]:
    return list(snapshot.adapters) if snapshot.adapters else [None] * len(snapshot.uids)


def render_adapter_slots(
    events: Sequence[Any],
    slots: int,
    adapter_of: Mapping[int, str | None],
    names: Sequence[str],
    title: str | None = None,
    width_in: float = 9.2,
) -> Figure:
    """Slot x decode step over a run (:func:`workbench.views.slots.slot_grid` of the event
    log): each cell where a slot's request produced a token coloured by that request's
    adapter (``adapter_of``: uid -> ``Request.adapter``; ``names``: the loaded adapters in
    load order, the colours of :func:`render_adapters`), the uid written where its turn
    starts, a black line where the slot changes hands; an idle slot hatched grey.

    Raises:
        ValueError: a uid missing from ``adapter_of``, or an adapter not in ``names``.
    """
    grid = slot_grid(events, slots)
    S, T = grid.shape
    missing = sorted({int(u) for u in grid.ravel() if u != IDLE} - set(adapter_of))
    if missing or any(a is not None and a not in names for a in adapter_of.values()):
        raise ValueError(
            f"adapter_of must give every uid ({missing} missing) an adapter of {list(names)} or None"
        )
    code = np.vectorize(lambda u: 0 if u == IDLE else 1 + _slot(names, adapter_of[int(u)]), otypes=[int])
    colours = [IDLE_COLOUR, BASE, *ADAPTER_COLOURS[: len(names)]]
    fig = Figure(figsize=(width_in, 0.5 * S + 1.6), layout="constrained")
    if title:
        fig.suptitle(title)
    ax = fig.subplots()
    ax.imshow(
        code(grid) if grid.size else grid,
        cmap=ListedColormap(colours),
        vmin=0,
        vmax=len(colours) - 1,
        aspect="auto",
    )
    for (s, t), u in np.ndenumerate(grid):
        if u == IDLE:
            ax.add_patch(
                Rectangle((t - 0.5, s - 0.5), 1, 1, fill=False, hatch="//", edgecolor=style.BORDER, lw=0)
            )
        elif t == 0 or grid[s, t - 1] != u:
            ax.vlines(t - 0.5, s - 0.5, s + 0.5, colors="black", linewidth=2)
            ax.text(t - 0.35, s, f"uid {u}", ha="left", va="center", fontsize="small")
    style.cell_borders(ax, T, S, linewidth=0.3)
    ax.set_yticks(range(S), [f"slot {s}" for s in range(S)])
    if T:
        style.integer_ticks(ax.xaxis, 0, T - 1)
    ax.set_xlabel("decode step (each slot's request, coloured by its adapter)")
    entries = [("base model (no adapter)", BASE)] + [(n, colours[i + 2]) for i, n in enumerate(names)]
    style.legend(fig, entries + [("slot idle", IDLE_COLOUR, "//")])
    return fig


def _slot(names: Sequence[str], name: str | None) -> int:
    return 0 if name is None else list(names).index(name) + 1
