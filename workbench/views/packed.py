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
from matplotlib.patches import Rectangle

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
from .kv import bytes_unit

__all__ = ["budget_text", "packed_text", "render_packed_mask", "render_page_table", "render_token_budget"]

GRID_MAX = 80  # cell grid lines up to this many columns
NARROW_IN = 6.0  # narrower figures (the panel's) break their titles and labels into lines


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


# cell codes of the packed mask figure, the same kinds (and colours, words) as the 2-D masks of
# :mod:`workbench.views.attention`: what a query token does with a key position
MASKED, CACHED, NEW, OWN = 0, 1, 2, 3
MASK_LEGEND = (
    (MASKED, "masked (another request's key, or later)", style.UNUSED),
    (CACHED, "cached key (an earlier forward)", style.ATTENDED),
    (NEW, "key of this forward (prefill chunk)", style.NEW_KEY),
    (OWN, "own key (the query's token)", style.FED),
)
QUERY_KINDS = (("decode", "decode query", style.ATTENDED), ("prefill", "prefill query", style.PREFILL))


def packed_cells(chunks) -> np.ndarray:
    """``[T, S]`` int cell codes of a packed forward: ``OWN`` where a token meets its own
    key, ``CACHED`` / ``NEW`` where it attends a key from an earlier forward / this one,
    ``MASKED`` elsewhere (another request's key, or a later position).

    >>> from workbench.observe.packed import Chunk
    >>> packed_cells((Chunk(0, 2, 1, "decode"), Chunk(1, 0, 2, "prefill"))).tolist()
    [[1, 1, 3, 0, 0], [0, 0, 0, 3, 0], [0, 0, 0, 2, 3]]
    """
    mask = packed_mask(chunks)
    qu, qp, ku, kp = packed_layout(chunks)
    starts = np.array([{c.uid: c.start for c in chunks}[u] for u in ku])
    attended = np.where(kp < starts, CACHED, NEW)[None, :]
    own = (qu[:, None] == ku[None, :]) & (qp[:, None] == kp[None, :])
    return np.where(own, OWN, np.where(mask, attended, MASKED))


def render_packed_mask(snap, width_in: float = 9.0, title: str | None = None) -> Figure:
    """The latest packed forward's ``[T, S]`` mask (:func:`packed_cells`): rows are packed
    tokens (``uid@position``), a strip left of them their kind (decode blue, prefill
    yellow: the colours of :func:`render_token_budget`), columns each request's keys (its
    cached pages, then the chunk's own tokens); the legend lists only the kinds drawn.
    ``title`` replaces the default (``packed forward of step N: T tokens x S keys``)."""
    state = _packed(snap)
    chunks = state.last_chunks
    T = sum(c.n_tokens for c in chunks)
    fig = Figure(figsize=(width_in, 1.9 + 0.22 * max(T, 1)), layout="constrained")
    if not chunks:
        style.empty(fig.add_subplot(), "no packed forward yet")
        return fig
    strip, ax = fig.subplots(1, 2, sharey=True, width_ratios=[1, 40])
    cells = packed_cells(chunks)
    qu, qp, ku, _ = packed_layout(chunks)
    kinds = [c.kind for c in chunks for _ in range(c.n_tokens)]
    strip.imshow(
        np.array([[0 if k == "decode" else 1] for k in kinds]),
        cmap=ListedColormap([style.ATTENDED, style.PREFILL]),
        vmin=0,
        vmax=1,
        aspect="auto",
        interpolation="nearest",
    )
    strip.set_xticks([])
    strip.set_yticks(range(T), [f"{u}@{p}" for u, p in zip(qu, qp, strict=True)], fontsize=7 if T > 24 else 9)
    strip.set_ylabel("query (uid@position)")
    ax.imshow(
        cells,
        cmap=ListedColormap([c for _, _, c in MASK_LEGEND]),
        vmin=0,
        vmax=3,
        aspect="auto",
        interpolation="nearest",
    )
    narrow = width_in < NARROW_IN
    _mask_axes(ax, cells.shape, ku, chunks, narrow)
    ax.set_title(
        title
        or f"packed forward of step {snap.step}:{chr(10) if narrow else ' '}{T} tokens x {cells.shape[1]} keys "
        f"(budget {state.token_budget})",
        fontsize="medium",
        loc="left",
    )
    drawn = set(np.unique(cells).tolist())
    entries = [(label, colour) for code, label, colour in MASK_LEGEND if code in drawn]
    entries += [(label, colour) for kind, label, colour in QUERY_KINDS if kind in kinds]
    style.legend(fig, entries, ncol=1 if narrow else 3)
    return fig


def _mask_axes(ax, shape: tuple[int, int], key_uids: np.ndarray, chunks, narrow: bool) -> None:
    """Cell borders, a line between requests' key blocks, one x label per request."""
    T, S = shape
    if S <= GRID_MAX:
        style.cell_borders(ax, S, T, color="white", linewidth=0.8)
    for cut in np.flatnonzero(np.diff(key_uids)) + 0.5:
        ax.axvline(cut, color=style.EDGE, linewidth=1.2)
    centres = [np.mean(np.flatnonzero(key_uids == c.uid)) for c in chunks]
    sep = "\n" if narrow else " "
    ax.set_xticks(centres, [f"uid {c.uid}{sep}({c.end} keys)" for c in chunks], fontsize=9)
    ax.tick_params(axis="y", left=False, labelleft=False)
    ax.set_xlabel(f"key: each request's{sep}positions 0 .. its last")


PAGE_LEGEND = (
    ("tokens held (a full page is all blue)", style.ATTENDED, None),
    ("room left in a partly filled page", style.UNUSED, None),
    ("free page", style.LATER, None),
    ("cached prefix (no request holds it)", style.LATER, "//"),
)
PAGE_NUMBERS_MAX = 40  # write each page's index in its request up to this many pages across


def page_fill(state: PackedState) -> list[tuple[int, list[tuple[int, int, float]]]]:
    """Per request holding pages: ``(uid, [(page id, index in the request, fill)])``, the
    fill ``0..1`` the share of the page's ``page_size`` positions holding its tokens."""
    held = dict(state.held_tokens)
    return [
        (
            uid,
            [
                (page, i, min(max(held[uid] - i * state.page_size, 0), state.page_size) / state.page_size)
                for i, page in enumerate(pages)
            ],
        )
        for uid, pages in state.pages
    ]


def render_page_table(snap, width_in: float = 9.0) -> Figure:
    """The page table: one row per request holding pages, one column per page id of the
    pools; a held page's cell is blue for the share of its positions holding tokens (the
    rest light: room) and shows its index in the request (its order: 0 first); a page
    shared by several requests appears in each of their rows. The last row: free pages
    (white), with prefix caching also cached ones (hatched), or "no free page"."""
    state = _packed(snap)
    n, rows = max(state.capacity_pages, 1), page_fill(state)
    narrow = width_in < NARROW_IN
    fig = Figure(figsize=(width_in, 2.1 + 0.34 * (len(rows) + 1)), layout="constrained")
    ax = fig.add_subplot()
    numbers = n <= PAGE_NUMBERS_MAX
    for r, (_, pages) in enumerate(rows):
        for page, index, fill in pages:
            _page_cell(ax, page, r, fill, str(index) if numbers else None)
    free_row = len(rows)
    for page in state.free_pages:
        ax.add_patch(
            Rectangle((page - 0.5, free_row - 0.5), 1, 1, facecolor=style.LATER, edgecolor=style.BORDER)
        )
    for page in state.cached_pages or ():
        ax.add_patch(
            Rectangle(
                (page - 0.5, free_row - 0.5), 1, 1, facecolor=style.LATER, edgecolor=style.EDGE, hatch="//"
            )
        )
    if not state.free_pages and not state.cached_pages:
        ax.text((n - 1) / 2, free_row, "no free page", ha="center", va="center", color=style.EDGE)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(free_row + 0.5, -0.5)
    ax.set_yticks(
        range(free_row + 1),
        [f"uid {u}" for u, _ in rows] + ["free / cached" if state.cached_pages is not None else "free"],
    )
    style.integer_ticks(ax.xaxis, 0, n - 1, max_labels=20)
    sep = "\n" if narrow else "; "
    ax.set_xlabel(
        "page id (where a page lives in the pool)"
        + (f"{sep}in a cell: its index in the request" if numbers else "")
    )
    ax.set_title(_page_title(snap.step, state, "\n" if narrow else " "), fontsize="medium", loc="left")
    drawn = [e for e in PAGE_LEGEND[:3]] + ([PAGE_LEGEND[3]] if state.cached_pages else [])
    style.legend(fig, list(drawn), ncol=1 if narrow else 2)
    return fig


def _page_cell(ax, page: int, row: int, fill: float, label: str | None) -> None:
    """A held page: room (light) under the held share (blue, from the left), its label."""
    ax.add_patch(Rectangle((page - 0.5, row - 0.5), 1, 1, facecolor=style.UNUSED, edgecolor=style.BORDER))
    ax.add_patch(Rectangle((page - 0.5, row - 0.5), fill, 1, facecolor=style.ATTENDED, edgecolor="none"))
    if label is not None:  # white on a full page; dark on a white patch where the page is partly filled
        box = (
            None
            if fill == 1
            else {"boxstyle": "round,pad=0.15", "facecolor": style.LATER, "edgecolor": "none"}
        )
        ax.text(
            page,
            row,
            label,
            ha="center",
            va="center",
            fontsize=9,
            color="white" if box is None else "black",
            bbox=box,
        )


def _page_title(step: int, state: PackedState, sep: str = " ") -> str:
    """``page table at step N: used/capacity pages of P tokens, X KiB held (Y KiB of tokens)``."""
    div, unit = bytes_unit(max(state.held_bytes, 1))
    return (
        f"page table at step {step}: {state.used_pages}/{state.capacity_pages} pages of "
        f"{state.page_size} tokens,{sep}{state.held_bytes / div:,.1f} {unit} held "
        f"({state.token_bytes / div:,.1f} {unit} of tokens)"
    )


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
