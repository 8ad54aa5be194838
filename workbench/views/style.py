"""What the views share: one colour per kind of cache slot or span, legends, PNG export.

Knows: matplotlib. Must not know: the engine. Every view uses these colours, so a padding
slot is the same grey in the mask heatmap, the KV geometry bars and the legend.
"""

from __future__ import annotations

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.text import Text

PADDING = "#d9d9d9"  # masked slot: left padding, or outside a sliding window
ATTENDED = "#3b7dd8"  # cached token the row attends to (also: decode spans)
FED = "#e8590c"  # the slot of the token fed at the next step (a query's own key)
STATE = "#1b9e9e"  # a recurrent (ssm) group's state
NEW_KEY = "#9ec5f0"  # a key written by the same prefill forward as the query (2-D masks)
LATER = "#ffffff"  # a later position, masked by causality (2-D masks)
UNUSED = "#f4f4f4"  # allocated capacity not in use yet
EXPIRED = "#9e9e9e"  # ring-buffer slot holding a token outside the window
QUEUED = "#c7c7c7"
PREFILL = "#f2a541"
WAITING = "#b39ddb"  # finished, still in the batch until filter()


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


def legend(fig: Figure, entries: list[tuple], ncol: int | None = None) -> None:
    """A figure-level legend of ``(label, colour)`` or ``(label, colour, hatch)`` patches,
    below the axes."""
    handles = [Patch(facecolor=e[1], edgecolor="#666666", hatch=e[2] if len(e) > 2 else None, label=e[0])
               for e in entries]
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol or len(entries),
               fontsize="small", frameon=False)


def figure_png(fig: Figure, dpi: int = 90) -> bytes:
    """The figure rendered as PNG bytes (Agg, no pyplot state)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
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
