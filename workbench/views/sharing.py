"""Which requests share which KV pages (the packed layout): ``submit_n`` siblings holding one
prefilled prompt, a prompt-cache hit taking a finished request's pages, and the copy-on-write
that gives each sibling its own copy of a shared page before it writes into it.

Knows: snapshots' :class:`~workbench.observe.packed.PackedState` (page table) and the event
log's ``admit`` events (``n_cached``: prompt tokens found in the prompt cache). Must not know:
the scheduler, MLX.

A request's page ``i`` holds its positions ``i * page_size .. (i + 1) * page_size - 1``; the
page id is where it lives in the pools. Two requests holding the same page id read the same
keys and values: one copy in memory.

Text form (:func:`sharing_text`), per snapshot one line per request: its pages by position, a
page held by several requests written with the uids that share it, one from the prompt cache
marked ``c``::

    step 1: 3 page(s) shared
      uid 0 | 0[0,1,2] 1[0,1,2] 2[0,1,2] 6
      uid 1 | 0[0,1,2] 1[0,1,2] 2[0,1,2] 7
      uid 2 | 0[0,1,2] 1[0,1,2] 2[0,1,2] 3

Rich form (:func:`render_sharing`): one panel per snapshot, a row per request, a column per
page index (positions), each cell the page id it holds: shared pages in one colour, pages of
one request in another, filled from the left by the share of its positions holding tokens,
pages taken from the prompt cache hatched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..observe.events import Event
from . import style

__all__ = ["cached_tokens", "page_holders", "render_sharing", "sharing_text"]

SHARED, OWN = style.SERIES[3], style.ATTENDED
CACHE_HATCH = "//"


def cached_tokens(events: Sequence[Event]) -> dict[int, int]:
    """Per uid, the prompt tokens its (last) admission found in the prompt cache."""
    return {e.uid: e.n_cached for e in events if e.kind == "admit"}


def page_holders(snap) -> dict[int, tuple[int, ...]]:
    """Per page held in the snapshot's page table, the uids holding it (row order).

    Raises:
        ValueError: for a snapshot without a packed layout (naming the step).
    """
    state = snap.packed
    if state is None:
        raise ValueError(f"the snapshot of step {snap.step} has no page table (layout='packed' only)")
    out: dict[int, list[int]] = {}
    for uid, pages in state.pages:
        for p in pages:
            out.setdefault(p, []).append(uid)
    return {p: tuple(u) for p, u in out.items()}


def _from_cache(state, uid: int, i: int, cached: Mapping[int, int]) -> bool:
    """Page ``i`` of ``uid`` lies within the prompt tokens its admission found cached."""
    return (i + 1) * state.page_size <= cached.get(uid, 0)


def sharing_text(snaps: Sequence, cached: Mapping[int, int] | None = None) -> str:
    """Deterministic text form (see the module docstring); ``cached``: :func:`cached_tokens`
    of the log, to mark the pages a request took from the prompt cache."""
    cached = cached or {}
    lines = []
    for snap in snaps:
        holders, state = page_holders(snap), snap.packed
        shared = sorted(p for p, u in holders.items() if len(u) > 1)
        head = f"step {snap.step}: {len(shared)} page(s) shared"
        if state.cached_pages:
            head += f", cached (held by none): {list(state.cached_pages)}"
        lines.append(head)
        for uid, pages in state.pages:
            cells = [
                f"{p}"
                + (f"[{','.join(map(str, holders[p]))}]" if len(holders[p]) > 1 else "")
                + ("c" if _from_cache(state, uid, i, cached) else "")
                for i, p in enumerate(pages)
            ]
            lines.append(f"  uid {uid} | {' '.join(cells)}")
    return "\n".join(lines)


def render_sharing(
    panels: Sequence[tuple[str, object]], cached: Mapping[int, int] | None = None, width_in: float = 9.2
) -> Figure:
    """One panel per ``(title, snapshot)``: a row per request holding pages, a column per page
    index (its positions), the page id written in each cell, shared pages (held by several
    requests) in one colour, a request's own pages in another, each filled from the left by
    the share of its positions holding tokens; pages found in the prompt cache (``cached``:
    :func:`cached_tokens`) hatched.

    Raises:
        ValueError: for no panels, or a snapshot without a page table.
    """
    if not panels:
        raise ValueError("render_sharing needs at least one (title, snapshot)")
    cached = cached or {}
    cols = max(max((len(p) for _, p in s.packed.pages), default=1) for _, s in panels)
    heights = [max(len(s.packed.pages), 1) * 0.42 + 0.9 for _, s in panels]
    fig = Figure(figsize=(width_in, sum(heights) + 0.8), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, (title, snap) in zip(axes, panels):
        holders, state = page_holders(snap), snap.packed
        held = dict(state.held_tokens)
        for r, (uid, pages) in enumerate(state.pages):
            for i, p in enumerate(pages):
                fill = min(max(held.get(uid, 0) - i * state.page_size, 0), state.page_size) / state.page_size
                colour = SHARED if len(holders[p]) > 1 else OWN
                ax.add_patch(
                    Rectangle((i - 0.45, r - 0.4), 0.9, 0.8, facecolor=style.UNUSED, edgecolor="none")
                )
                ax.add_patch(
                    Rectangle((i - 0.45, r - 0.4), 0.9 * fill, 0.8, facecolor=colour, edgecolor="none")
                )
                hatch = CACHE_HATCH if _from_cache(state, uid, i, cached) else None
                ax.add_patch(  # the outline last, over the fill: neighbouring pages stay apart
                    Rectangle((i - 0.45, r - 0.4), 0.9, 0.8, fill=False, hatch=hatch, edgecolor=style.EDGE)
                )
                ax.text(
                    i,
                    r,
                    f"page {p}",
                    ha="center",
                    va="center",
                    fontsize="small",
                    color="white" if fill == 1 else "black",
                    bbox=None
                    if fill == 1
                    else {"boxstyle": "round,pad=0.15", "facecolor": style.LATER, "edgecolor": "none"},
                )
        n = max(len(state.pages), 1)
        ax.set_xlim(-0.5, cols - 0.5)
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_yticks(range(len(state.pages)), [f"uid {u}" for u, _ in state.pages])
        ps = state.page_size
        ax.set_xticks(range(cols), [f"{i * ps}-{(i + 1) * ps - 1}" for i in range(cols)], fontsize="small")
        ax.set_title(title, fontsize="small", loc="left")
    axes[-1].set_xlabel(
        "positions the page holds (page index in the request); in a cell: the page id in the pool"
    )
    style.legend(
        fig,
        [
            ("page shared by several requests (one copy)", SHARED),
            ("page of one request", OWN),
            ("room (positions not written yet)", style.UNUSED),
            ("found in the prompt cache", style.LATER, CACHE_HATCH),
        ],
        ncol=2,
    )
    return fig
