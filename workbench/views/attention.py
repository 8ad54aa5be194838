"""2-D attention masks: query position x key position, per row, for the forwards the engine
ran (prefill chunks, a right-padded group) and the next decode step.

Knows: :class:`~workbench.observe.forward_masks.ForwardMask` (built from the event log or a
snapshot), matplotlib. Must not know: the scheduler, MLX.

Text form (:func:`attention_text`), one grid per row; ``c`` a cached key (an earlier
forward), ``#`` a key of this forward, ``@`` the query's own key, ``.`` a later position
(masked), ``p`` padding (a pad query, computed and dropped, or a pad key)::

    prefill uid 0: positions 4-6, 4 cached
    uid 0  keys 0-6
      q 4 | c c c c @ . .
      q 5 | c c c c # @ .
      q 6 | c c c c # # @

Rich form (:func:`render_attention`): the same cells as a heatmap, one axes per row of a
prefill forward, one axes for a decode step (a line per row), integer ticks and cell
borders, colours from :mod:`workbench.views.style`.
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..observe.forward_masks import ForwardMask
from . import style

LATER, PAD, NEW, CACHED, OWN = 0, 1, 2, 3, 4  # cell codes of :func:`attention_cells`
SYMBOLS = ".p#c@"
CMAP = ListedColormap([style.LATER, style.PADDING, style.NEW_KEY, style.ATTENDED, style.FED])
LEGEND = [
    ("later (causal: masked)", style.LATER),
    ("padding (masked)", style.PADDING),
    ("key of this forward", style.NEW_KEY),
    ("cached key (earlier forward)", style.ATTENDED),
    ("own key (the fed token)", style.FED),
]
KEY_AXIS = "key slot (0 = cache start)"  # absolute; the decode masks count back from the fed token
GRID_MAX_KEYS = 64  # draw cell borders up to this many key positions
NARROW_GRID_IN = 1.3  # under 6 inches wide (the panel), the tallest grid is at most this high
TICK_LABEL_IN = 0.3  # room for one whole-number tick label and its gap (inches, at least)


def attention_cells(fm: ForwardMask) -> np.ndarray:
    """``[B, N, S]`` int cell codes: ``PAD`` where the query or the key is padding, else
    ``OWN`` for the query's own position, ``CACHED`` / ``NEW`` where the mask attends a key
    from an earlier forward / this one, ``LATER`` where it masks.

    >>> from workbench.observe.forward_masks import causal_mask
    >>> fm = ForwardMask("x", (0,), causal_mask(2, 1), 1, np.zeros((1, 2), bool), np.zeros((1, 3), bool))
    >>> attention_cells(fm)[0].tolist()
    [[3, 4, 0], [3, 2, 4]]
    """
    B, N, S = fm.shape
    keys = np.arange(S)[None, None, :]
    own = keys == (fm.n_cached + np.arange(N))[None, :, None]
    cells = np.where(fm.mask, np.where(keys < fm.n_cached, CACHED, NEW), LATER)
    cells = np.where(own & fm.mask, OWN, cells)
    pad = fm.query_padding[:, :, None] | fm.key_padding[:, None, :]
    return np.where(pad, PAD, cells)


def attention_text(fm: ForwardMask) -> str:
    """Deterministic text form: the forward's label and, per row, its query x key grid."""
    cells = attention_cells(fm)
    B, N, S = fm.shape
    q_width = len(str(fm.n_cached + N - 1))
    lines = [fm.label]
    if N == 1:  # a decode step: one line per row
        u_width = max(len(str(u)) for u in fm.uids) if fm.uids else 1
        lines.append(f"keys 0-{S - 1}, one query per row (its position {S - 1} in the batch cache)")
        lines += [
            f"  uid {u:>{u_width}} | " + " ".join(SYMBOLS[c] for c in cells[b, 0])
            for b, u in enumerate(fm.uids)
        ]
        return "\n".join(lines)
    for b, uid in enumerate(fm.uids):
        lines.append(f"uid {uid}  keys 0-{S - 1}")
        lines += [
            f"  q {fm.n_cached + i:>{q_width}} | " + " ".join(SYMBOLS[c] for c in cells[b, i])
            for i in range(N)
        ]
    return "\n".join(lines)


def _draw(
    ax,
    cells: np.ndarray,
    first_query: int | None,
    row_labels: list[str] | None,
    max_labels: int = 16,
    cell_in: float | None = None,
) -> None:
    """One heatmap of ``[rows, S]`` cells with whole-number ticks and cell borders; with
    ``cell_in`` (a cell's size, inches), at most one label per ``TICK_LABEL_IN`` of the grid."""
    rows, S = cells.shape
    ax.imshow(cells, cmap=CMAP, vmin=0, vmax=len(SYMBOLS) - 1, aspect="equal", interpolation="nearest")
    if S <= GRID_MAX_KEYS:
        style.cell_borders(ax, S, rows)
    x_labels = max_labels if cell_in is None else min(max_labels, max(2, int(cell_in * S / TICK_LABEL_IN)))
    style.integer_ticks(ax.xaxis, 0, S - 1, x_labels)
    if row_labels is not None:
        ax.set_yticks(range(rows), row_labels)
    else:
        y_labels = 12 if cell_in is None else max(2, int(cell_in * rows / TICK_LABEL_IN))
        every_q = max(1, int(np.ceil(rows / min(12, max_labels, y_labels))))
        ax.set_yticks(np.arange(0, rows, every_q), [str(first_query + i) for i in range(0, rows, every_q)])
    ax.set_xlabel(KEY_AXIS)


def stacked_cells(forwards: list[ForwardMask]) -> tuple[np.ndarray, list[int]]:
    """The chunks of one row's chunked prefill as one ``[sum N, S_max]`` grid of cell codes
    (each chunk's keys beyond its own ``S`` are ``LATER``), and the first query row of
    each chunk.

    Raises:
        ValueError: unless every forward has one row, of the same uid.
    """
    if not forwards or any(f.shape[0] != 1 or f.uids != forwards[0].uids for f in forwards):
        raise ValueError("stacked chunks must be single-row forwards of one uid")
    s_max = max(f.shape[2] for f in forwards)
    parts = [
        np.pad(attention_cells(f)[0], ((0, 0), (0, s_max - f.shape[2])), constant_values=LATER)
        for f in forwards
    ]
    return np.concatenate(parts), list(np.cumsum([0] + [p.shape[0] for p in parts[:-1]]))


def render_attention(
    forwards: list[ForwardMask],
    title: str | None = None,
    columns: int = 3,
    stack: bool = False,
    width_in: float = 9.0,
) -> Figure:
    """Heatmaps of the forwards' 2-D masks: one axes per row of each prefill forward
    (query position down, key position across), one axes per decode step (a line per row);
    with ``stack``, one axes for the chunks of one row's chunked prefill, chunk under chunk
    (:func:`stacked_cells`), a line between chunks.

    Args:
        forwards: the forwards to draw, in order (e.g. ``prefill_forwards(sched.events)``
            and ``decode_forward(snap)``).
        title: the figure's title (default: none).
        columns: axes per figure row.
        stack: draw the forwards as the chunks of one prefill.
        width_in: the figure's width (inches).

    Raises:
        ValueError: for no forwards; with ``stack``, as :func:`stacked_cells`.
    """
    if not forwards:
        raise ValueError("render_attention needs at least one forward")
    panels = []  # (title, cells [rows, S], first query, row labels)
    if stack:
        cells, starts = stacked_cells(forwards)
        panels.append(
            (f"uid {forwards[0].uids[0]}: {len(forwards)} prefill chunks", cells, forwards[0].n_cached, None)
        )
    one = (  # one prefill forward of several rows: its label is the figure's title (a decode keeps its own)
        not stack and len(forwards) == 1 and forwards[0].shape[0] > 1 and forwards[0].shape[1] > 1
    )
    for fm in [] if stack else forwards:
        cells = attention_cells(fm)
        if fm.shape[1] == 1:
            panels.append((fm.label, cells[:, 0], None, [f"uid {u}" for u in fm.uids]))
        else:
            panels += [
                (
                    f"row uid {u}" if one else f"{fm.label}\nrow uid {u}" if fm.shape[0] > 1 else fm.label,
                    cells[b],
                    fm.n_cached,
                    None,
                )
                for b, u in enumerate(fm.uids)
            ]
    if one:
        title = f"{title}\n{forwards[0].label}" if title else forwards[0].label
    columns = min(columns, len(panels))
    n_rows = -(-len(panels) // columns)
    s_max = max(p[1].shape[1] for p in panels)
    rows_max = max(p[1].shape[0] for p in panels)
    cell_in = min(
        0.32, (width_in - 1.0) / columns / max(s_max, 1), NARROW_GRID_IN / rows_max if width_in < 6 else 1.0
    )  # a narrow figure stays short
    heights = [
        max(p[1].shape[0] for p in panels[i * columns : (i + 1) * columns]) * cell_in + 1.1
        for i in range(n_rows)
    ]
    fig = Figure(figsize=(width_in, sum(heights) + 0.9), layout="constrained")
    if title:
        fig.suptitle(title, fontsize="medium" if width_in < 6 else "large")
    axes = fig.subplots(n_rows, columns, squeeze=False, height_ratios=heights).ravel()
    max_labels = max(4, int(3 * width_in / columns))  # whole-number labels that never touch
    for ax, (name, cells, first_query, labels) in zip(axes, panels):
        _draw(ax, cells, first_query, labels, max_labels, cell_in)
        ax.set_title(name, fontsize="small", loc="left")
        if labels is None:
            ax.set_ylabel("query position")
    if stack:
        for k, start in enumerate(starts):
            if k:
                axes[0].axhline(start - 0.5, color="black", linewidth=2)
            axes[0].annotate(
                f"chunk {k + 1}",
                (1.01, start - 0.3),
                xycoords=("axes fraction", "data"),
                fontsize="small",
                va="top",
            )
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    present = {int(c) for p in panels for c in np.unique(p[1])}
    style.legend(fig, [e for code, e in enumerate(LEGEND) if code in present], ncol=3 if width_in >= 6 else 2)
    return fig
