"""Views of the packed layout: the packed mask of a step (which token attends to which),
the page table (requests x pages, free pages), and the token budget per iteration split
into decode and prefill tokens.

Knows: :class:`workbench.observe.packed.PackedState` (a snapshot's ``packed``), matplotlib.
Must not know: the engine.

Text forms: :func:`packed_text` (snapshot), :func:`budget_text` (history). Rich forms:
:func:`render_packed_mask`, :func:`render_page_table` (snapshot), :func:`render_token_budget`
(history). A padded-layout snapshot (``packed is None``) is refused with a ValueError
naming ``Scheduler(layout="packed")``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..observe.packed import (
    PackedState,
    budget_rows,
    chunks_text,
    mask_text,
    pacing_text,
    packed_layout,
    packed_mask,
    page_table_text,
)
from . import style

__all__ = ["budget_text", "packed_text", "render_packed_mask", "render_page_table", "render_token_budget"]

GRID_MAX = 80  # cell grid lines up to this many columns


def _packed(snap) -> PackedState:
    if getattr(snap, "packed", None) is None:
        raise ValueError(
            "this snapshot is of the padded layout; the packed views need Scheduler(layout='packed')"
        )
    return snap.packed


def packed_text(snap) -> str:
    """The snapshot's page table, its latest forward's chunks (with pacing, its time
    budget) and their packed mask."""
    state = _packed(snap)
    paced = pacing_text(state)
    return "\n".join(
        [
            page_table_text(state),
            chunks_text(state.last_chunks, state.token_budget),
            *([paced] if paced else []),
            mask_text(state.last_chunks),
        ]
    )


def render_packed_mask(snap, width_in: float = 9.0) -> Figure:
    """The latest packed forward's ``[T, S]`` mask: rows are packed tokens (``uid@pos``),
    columns each request's keys (its cached pages, then the chunk's own tokens); a cell
    is coloured when attended: decode tokens blue, prefill tokens orange, keys written by
    the same forward light."""
    state = _packed(snap)
    chunks = state.last_chunks
    fig = Figure(
        figsize=(width_in, 1.6 + 0.22 * max(sum(c.n_tokens for c in chunks), 1)), layout="constrained"
    )
    ax = fig.add_subplot()
    if not chunks:
        ax.text(0.5, 0.5, "no packed forward yet", ha="center", va="center")
        ax.set_axis_off()
        return fig
    mask = packed_mask(chunks)
    qu, qp, ku, kp = packed_layout(chunks)
    kind = np.concatenate([np.full(c.n_tokens, 1 if c.kind == "decode" else 2) for c in chunks])
    starts = {c.uid: c.start for c in chunks}
    new_key = np.array([p >= starts[u] for u, p in zip(ku, kp, strict=True)])
    cells = np.where(mask, kind[:, None] + 2 * new_key[None, :], 0)  # 0 masked, 1/2 cached key, 3/4 new key
    cmap = ListedColormap([style.UNUSED, style.ATTENDED, style.PREFILL, style.FED, style.NEW_KEY])
    T, S = mask.shape
    ax.imshow(cells, cmap=cmap, vmin=0, vmax=4, aspect="auto", interpolation="nearest")
    if S <= GRID_MAX:
        ax.set_xticks(np.arange(S + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(T + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="white", linewidth=0.8)
    for cut in np.flatnonzero(np.diff(ku)) + 0.5:
        ax.axvline(cut, color=style.EDGE, linewidth=1.2)
    ax.set_yticks(range(T), [f"{u}@{p}" for u, p in zip(qu, qp, strict=True)], fontsize=7 if T > 24 else 9)
    centres = [np.mean(np.flatnonzero(ku == c.uid)) for c in chunks]
    ax.set_xticks(centres, [f"uid {c.uid} ({c.end} keys)" for c in chunks], fontsize=9)
    ax.tick_params(which="minor", length=0)
    ax.set_title(
        f"packed mask of step {snap.step}: {T} tokens x {S} keys (budget {state.token_budget})",
        fontsize="medium",
        loc="left",
    )
    fig.legend(
        handles=[
            Patch(color=style.ATTENDED, label="decode token -> cached key"),
            Patch(color=style.PREFILL, label="prefill token -> cached key"),
            Patch(color=style.FED, label="-> its own key (decode token)"),
            Patch(color=style.NEW_KEY, label="-> key of this forward (prefill)"),
            Patch(color=style.UNUSED, label="masked (other request / later)"),
        ],
        loc="outside lower center",
        ncol=3,
        fontsize=8.5,
        frameon=False,
    )
    return fig


def render_page_table(snap, width_in: float = 9.0) -> Figure:
    """The page table: one row per request holding pages, one column per page id of the
    pools; a cell shows how full that page is (a page shared by several requests in each of
    their rows); the last row marks the free pages (squares) and the cached ones (diamonds)."""
    state = _packed(snap)
    n, rows = max(state.capacity_pages, 1), list(state.pages)
    held = dict(state.held_tokens)
    grid = np.zeros((len(rows) + 1, n))
    for r, (uid, pages) in enumerate(rows):
        for i, page in enumerate(pages):
            grid[r, page] = min(max(held[uid] - i * state.page_size, 0), state.page_size) / state.page_size
    for page in state.free_pages:
        grid[len(rows), page] = -1
    fig = Figure(figsize=(width_in, 1.4 + 0.3 * (len(rows) + 1)), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(
        np.where(grid < 0, np.nan, grid), cmap="Blues", vmin=0, vmax=1, aspect="auto", interpolation="nearest"
    )
    free = np.argwhere(grid < 0)
    if len(free):
        ax.scatter(free[:, 1], free[:, 0], marker="s", color=style.QUEUED, s=40)
    cached = list(state.cached_pages or ())
    if cached:  # prefix caching: pages no request holds that keep a prefix
        ax.scatter(cached, [len(rows)] * len(cached), marker="D", color=style.STATE, s=30)
    ax.set_yticks(
        range(len(rows) + 1),
        [f"uid {u}" for u, _ in rows] + ["free / cached" if state.cached_pages is not None else "free"],
    )
    ax.set_xlabel("page id")
    ax.set_title(
        f"page table at step {snap.step}: {state.used_pages}/{state.capacity_pages} pages of "
        f"{state.page_size} tokens, {state.held_bytes:,} bytes held ({state.token_bytes:,} of tokens)",
        fontsize="medium",
        loc="left",
    )
    return fig


def budget_text(history: Sequence) -> str:
    """One line per packed forward of ``history``: step, decode and prefill tokens, budget;
    with pacing also the token cap its time budget set (``paced``) and its predicted and
    budgeted milliseconds."""
    rows = budget_rows(history)
    paced = any(r.paced_tokens is not None for r in rows)
    lines = ["step  decode  prefill  budget" + ("  paced  predicted_ms  budget_ms" if paced else "")]
    for r in rows:
        line = f"{r.step:>4}  {r.decode_tokens:>6}  {r.prefill_tokens:>7}  {r.budget_tokens:>6}"
        if paced:
            line += f"  {_or_dash(r.paced_tokens):>5}  {_ms(r.predicted_s):>12}  {_ms(r.time_budget_s):>9}"
        lines.append(line)
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return (
        "-"
        if seconds is None or np.isnan(seconds)
        else "inf"
        if np.isinf(seconds)
        else f"{seconds * 1e3:.2f}"
    )


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def render_token_budget(history: Sequence, width_in: float = 9.0) -> Figure:
    """Stacked bars per packed forward of ``history``: decode tokens and prefill tokens,
    with the token budget as a line and, with pacing, each forward's cap from its time
    budget (a tick, where below the token budget)."""
    rows = budget_rows(history)
    fig = Figure(figsize=(width_in, 3.0), layout="constrained")
    ax = fig.add_subplot()
    steps = np.array([r.step for r in rows])
    d = np.array([r.decode_tokens for r in rows])
    p = np.array([r.prefill_tokens for r in rows])
    ax.bar(steps, d, color=style.ATTENDED, label="decode tokens")
    ax.bar(steps, p, bottom=d, color=style.PREFILL, label="prefill tokens")
    if rows:
        ax.axhline(
            rows[-1].budget_tokens, color=style.EDGE, linestyle="--", linewidth=1, label="token budget"
        )
    capped = [
        (r.step, r.paced_tokens)
        for r in rows
        if r.paced_tokens is not None and r.paced_tokens < r.budget_tokens
    ]
    if capped:  # pacing: the cap each forward's time budget set, where it was below the token budget
        ax.scatter(*zip(*capped), marker="_", s=120, color=style.EDGE, label="time budget's cap")
    ax.set_xlabel("step (after the forward)")
    ax.set_ylabel("tokens in the forward")
    ax.set_title("token budget per iteration: decode + prefill", fontsize="medium", loc="left")
    ax.legend(fontsize=9, frameon=False)
    return fig
