"""What the views share: one colour per kind of cache slot or span, legends, PNG export.

Knows: matplotlib. Must not know: the engine. Every view uses these colours, so a padding
slot is the same grey in the mask heatmap, the KV geometry bars and the legend.
"""

from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.text import Text

from ..bench.axes import log_tick_subs, plain_log_axis  # noqa: F401  (the views' log axes)
from ..observe.numbers import SUPERSCRIPT, scientific  # noqa: F401  (numbers without e-notation)

# One meaning per colour, in every figure of the views (tests/views/test_style.py checks that
# no colour has two names, that every view draws its cells and spans from these names, and
# that the benchmark's figures, below the views in the import order, agree with them).
PADDING = "#d9d9d9"  # padding: a masked slot (left padding, a pad query, outside a sliding window)
PREFILL = "#e6c229"  # prompt tokens being prefilled: timeline spans, prefill chunks (yellow: far
#   from the fed token's orange)
ATTENDED = "#3b7dd8"  # decode: a cached token a row attends, generated tokens, decode spans, live KV
FED = "#e8590c"  # the token fed at the next step = the query: its own key (decode masks, 2-D
#   masks' diagonal), the ring's write slot. The one orange of the views.
NEW_KEY = "#9ec5f0"  # a key written by the same prefill forward as the query (2-D masks)
STATE = "#1b9e9e"  # a recurrent (ssm) group's fixed-size state
LATER = "#ffffff"  # free / idle: a later position (masked by causality), an idle slot, a free block
UNUSED = "#f4f4f4"  # allocated capacity not in use yet (growth room of a batch cache)
EXPIRED = "#9e9e9e"  # evicted from the window: a ring-buffer slot holding a token outside it
QUEUED = "#c7c7c7"  # a request waiting in the queue
WAITING = "#b39ddb"  # finished, still in the batch until filter()
# A verdict pair safe for colour-blind readers (no red/green): Okabe-Ito's bluish green against
# a dark wine, far apart in lightness too, and the views draw BAD with BAD_HATCH or a cross
# marker as well, so the verdict never rests on hue alone.
GOOD = "#009e73"  # a verdict: equal / within tolerance
BAD = "#882255"  # a verdict: differs / over tolerance (also error text)
BAD_HATCH = "xx"
BAD_MARKER = "X"
MLX_LM = "#8c564b"  # mlx-lm, the reference engine, in the benchmark's figures (brown means only that)
# Two batch layouts compared side by side (12's paged KV, 17's packed forward): the left-padded
# rectangle of mlx-lm's batch cache against a layout that holds only the tokens (paged blocks
# or packed pages), the same pair in every figure that compares them.
PADDED_LAYOUT = "#c51b7d"  # the left-padded rectangle layout (magenta-pink)
PAGED_LAYOUT = "#222222"  # the paged / packed layout (near black)
LAYOUT_COLOURS = {"padded": PADDED_LAYOUT, "paged": PAGED_LAYOUT, "packed": PAGED_LAYOUT}
# categorical series that carry no cache meaning (settings compared side by side)
SERIES = ("#4d4d4d", "#e377c2", "#bcbd22", "#9467bd", "#17becf")
BORDER = "#8c8c8c"  # cell borders of heatmaps
EDGE = "#666666"  # outlines of bars and legend patches

PALETTE = {
    "padding": PADDING,
    "prefill": PREFILL,
    "decode / attended": ATTENDED,
    "fed token (the query's own key)": FED,
    "key of this forward": NEW_KEY,
    "recurrent state": STATE,
    "free / idle / later": LATER,
    "unused capacity": UNUSED,
    "expired (outside the window)": EXPIRED,
    "queued": QUEUED,
    "finished, not filtered": WAITING,
    "good": GOOD,
    "bad": BAD,
    "mlx-lm": MLX_LM,
    "padded layout": PADDED_LAYOUT,
    "paged / packed layout": PAGED_LAYOUT,
    **{f"series {i}": c for i, c in enumerate(SERIES)},
}


LAYERS_LISTED = 8  # up to this many layers are listed one by one; more are written as ranges


def layer_list(layers) -> str:
    """Layer names for a title or a text line: ``0,1,3`` as given up to ``LAYERS_LISTED``
    layers; beyond that, runs of three or more consecutive integers as ranges, so a
    30-layer model's group fits one line.

    >>> layer_list(["0", "1", "3"]), layer_list([str(i) for i in range(30)])
    ('0,1,3', '0-29')
    >>> layer_list([str(i) for i in range(12) if i != 5])
    '0-4,6-11'
    """
    names = [str(x) for x in layers]
    if len(names) <= LAYERS_LISTED or not all(n.isdigit() for n in names):
        return ",".join(names)
    runs: list[list[int]] = []
    for i in map(int, names):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) >= 3 else ",".join(map(str, r)) for r in runs)


def integer_ticks(axis, first: int, last: int, max_labels: int = 16) -> None:
    """Label ``axis`` at whole positions ``first .. last`` only (token positions, steps,
    rows): every ``k``-th one, ``k`` the smallest step that keeps at most ``max_labels``
    labels, always on multiples of ``k`` (and ``first``, ``last`` when they are 0)."""
    k = max(1, -(-(last - first + 1) // max_labels))
    k = next(n for n in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, k) if n >= k)
    axis.set_ticks([v for v in range(first, last + 1) if v % k == 0])


def cell_borders(
    ax,
    n_cols: int,
    n_rows: int,
    x0: float = -0.5,
    y0: float = -0.5,
    color: str = BORDER,
    linewidth: float = 0.6,
) -> None:
    """A line around every cell of an ``n_rows x n_cols`` heatmap whose first cell's corner
    is at ``(x0, y0)`` (data units, cells 1 wide): drawn as lines, not as a grid of minor
    ticks (matplotlib drops a minor tick that falls on a major one, so 3 cells could look
    like 2)."""
    ax.vlines(x0 + np.arange(n_cols + 1), y0, y0 + n_rows, colors=color, linewidth=linewidth)
    ax.hlines(y0 + np.arange(n_rows + 1), x0, x0 + n_cols, colors=color, linewidth=linewidth)


def empty(ax, message: str) -> None:
    """An axes with nothing to draw: ``message`` in its middle, no frame and no ticks (no
    bare 0..1 axes)."""
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color=EDGE, wrap=True)
    ax.set_axis_off()


def legend(fig: Figure, entries: list[tuple], ncol: int | None = None) -> None:
    """A figure-level legend of ``(label, colour)`` or ``(label, colour, hatch)`` patches,
    below the axes."""
    handles = [
        Patch(facecolor=e[1], edgecolor="#666666", hatch=e[2] if len(e) > 2 else None, label=e[0])
        for e in entries
    ]
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=ncol or len(entries),
        fontsize="small",
        frameon=False,
    )


def figure_png(fig: Figure, dpi: int = 90) -> bytes:
    """The figure rendered as PNG bytes (Agg, no pyplot state)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def png_grid(rows: list[list[bytes]], gap_px: int = 8) -> bytes:
    """PNG images (bytes) laid out as rows of a grid, each row's images side by side and
    top-aligned, on white, ``gap_px`` apart: one PNG (bytes).

    Raises:
        ValueError: for no images.
    """
    from matplotlib import image

    tiles = [[image.imread(io.BytesIO(b), format="png")[..., :3] for b in row if b] for row in rows]
    tiles = [row for row in tiles if row]
    if not tiles:
        raise ValueError("png_grid needs at least one image")

    def pad(a: np.ndarray, h: int, w: int) -> np.ndarray:
        return np.pad(a, ((0, h - a.shape[0]), (0, w - a.shape[1]), (0, 0)), constant_values=1.0)

    lines = []
    for row in tiles:
        h = max(a.shape[0] for a in row)
        parts = []
        for a in row:
            parts += [pad(a, h, a.shape[1]), np.ones((h, gap_px, 3))]
        lines.append(np.concatenate(parts[:-1], axis=1))
    w = max(a.shape[1] for a in lines)
    blocks = []
    for a in lines:
        blocks += [pad(a, a.shape[0], w), np.ones((gap_px, w, 3))]
    grid = np.concatenate(blocks[:-1])
    buf = io.BytesIO()
    image.imsave(buf, np.clip(grid, 0, 1), format="png")
    return buf.getvalue()


def smallest_text_px(fig: Figure, dpi: float) -> float:
    """Height in pixels of the smallest visible text of ``fig`` (titles, labels, tick
    labels, legends, annotations) in a PNG written at ``dpi``: its font size in points
    times ``dpi / 72``. Shown at a width of ``w`` pixels instead of the PNG's own ``W``,
    the text is ``w / W`` times this. Draws the figure once (Agg) so tick labels exist.

    Raises:
        ValueError: when the figure has no visible text.
    """
    FigureCanvasAgg(fig).draw()
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    if not sizes:
        raise ValueError("the figure has no visible text")
    return min(sizes) * dpi / 72
