"""Views comparing two batch layouts on the same arrivals (``layout="padded"`` against
``layout="packed"``): the KV bytes each holds per step, and each request's TTFT and
largest inter-token gap.

Knows: snapshots (``kv_bytes``, ``prefill_kv_bytes``, ``step``, a packed snapshot's
``packed.held_tokens``), events (``uid``, ``kind``, ``time_s``), matplotlib. Must not know:
the engine.

One colour per layout: ``style.LAYOUT_COLOURS`` for "padded" / "paged" / "packed" (the pair
12's paged view uses too), ``style.SERIES`` in the order given for any other name; legends
below the axes. No
mlx-lm counterpart (mlx-lm draws nothing and has only the padded layout).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..observe.snapshot import Snapshot
from . import style

KIB = 1024


def layout_colours(names) -> list[str]:
    """One colour per layout name: ``style.LAYOUT_COLOURS[name]`` for a known layout, else
    the ``k``-th of ``style.SERIES``."""
    return [style.LAYOUT_COLOURS.get(n, style.SERIES[k % len(style.SERIES)]) for k, n in enumerate(names)]


def cache_bytes(snap: Snapshot) -> int:
    """KV bytes in a snapshot's batch caches and prefilling group (no prompt cache: ``Snapshot.held_bytes`` adds it)."""
    return snap.kv_bytes + snap.prefill_kv_bytes


def render_layout_bytes(histories: Mapping[str, Sequence[Snapshot]], token_bytes: int) -> Figure:
    """KV bytes held per step (KiB), one line per layout of ``histories`` (name -> its
    snapshots), and for a packed history (snapshots with ``packed``) the bytes of the tokens
    it holds, ``token_bytes`` each (dashed): what an exact cache would hold.

    Raises:
        ValueError: when ``histories`` is empty or one of them has no snapshot.
    """
    if not histories or not all(histories.values()):
        raise ValueError("render_layout_bytes needs at least one layout with snapshots")
    fig = Figure(figsize=(9.4, 3.4), layout="constrained")
    ax = fig.subplots()
    handles = []
    for (name, history), colour in zip(histories.items(), layout_colours(histories)):
        steps = [s.step for s in history]
        ax.plot(steps, [cache_bytes(s) / KIB for s in history], color=colour)
        handles.append(Line2D([], [], color=colour, label=f"{name}: KV bytes held"))
        if all(s.packed is not None for s in history):
            tokens = [sum(n for _, n in s.packed.held_tokens) for s in history]
            ax.plot(steps, [t * token_bytes / KIB for t in tokens], color=style.EDGE, ls="--")
            handles.append(
                Line2D([], [], color=style.EDGE, ls="--", label=f"bytes of the tokens held ({name})")
            )
    ax.set_xlabel("decode step")
    ax.set_ylabel("KiB")
    ax.set_ylim(bottom=0)
    ax.set_title("KV bytes held per step", fontsize="medium", loc="left")
    fig.legend(
        handles=handles, loc="outside lower center", ncol=len(handles), fontsize="small", frameon=False
    )
    return fig


def request_latency_ms(events: Sequence[Any], uids: Sequence[int]) -> list[tuple[float, float]]:
    """Per uid of ``uids``: (TTFT, largest inter-token gap) in ms, from the events' own times
    (submit to first token; 0.0 for a request of one token).

    Raises:
        ValueError: naming a uid without a submit or a token event.
    """
    out = []
    for uid in uids:
        mine = [e for e in events if e.uid == uid]
        submit = [e.time_s for e in mine if e.kind == "submit"]
        tokens = [e.time_s for e in mine if e.kind == "token"]
        if not submit or not tokens:
            raise ValueError(f"request_latency_ms: uid {uid} has no submit or no token event")
        gaps = np.diff(tokens)
        out.append((1e3 * (tokens[0] - submit[0]), 1e3 * float(gaps.max()) if len(gaps) else 0.0))
    return out


def render_layout_latency(
    latency: Mapping[str, Sequence[tuple[float, float]]], uids: Sequence[int] | None = None
) -> Figure:
    """Two panels of bars, one bar per request and layout: TTFT (ms) and the largest
    inter-token gap (ms); ``latency`` maps a layout's name to :func:`request_latency_ms`'s
    list (the same requests, in the same order, for every layout). ``uids`` names the
    requests on the x axis (``uid 3``; default ``request 0``, ``request 1``, ... in order).

    Raises:
        ValueError: when the layouts (or ``uids``) hold different numbers of requests.
    """
    counts = {len(v) for v in latency.values()} | ({len(uids)} if uids else set())
    if len(counts) != 1:
        raise ValueError(
            f"render_layout_latency: the layouts hold different numbers of requests {sorted(counts)}"
        )
    fig = Figure(figsize=(9.4, 3.0), layout="constrained")
    axes = fig.subplots(1, 2)
    x = np.arange(counts.pop())
    width = 0.8 / len(latency)
    colours = layout_colours(latency)
    for k, (rows, colour) in enumerate(zip(latency.values(), colours)):
        for j, ax in enumerate(axes):
            offset = (k - (len(latency) - 1) / 2) * width
            ax.bar(x + offset, [r[j] for r in rows], width=width, color=colour, edgecolor=style.EDGE)
    for ax, label in zip(axes, ("TTFT (ms)", "largest ITL (ms)")):
        ax.set_xticks(
            x, [f"uid {u}" for u in uids] if uids else [f"request {i}" for i in x], fontsize="small"
        )
        ax.set_ylabel(label)
    style.legend(fig, list(zip(latency, colours)))
    return fig
