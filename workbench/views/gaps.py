"""A batching mistake against the engine's way: how far each moves a row's log-probabilities
from the same request alone, on a log scale, against the oracle's tolerance.

Knows: matplotlib. Must not know: the engine, models; the gaps are measured by the caller
(e.g. :mod:`workbench.verify.lessons` for the mistake, :func:`workbench.verify.oracle.solo_check`
for the engine's rows). No mlx-lm counterpart (mlx-lm draws nothing).

Text form (what nbval compares: verdicts only, no float noise)::

    stale state (the mistake)     over the tolerance (1×10⁻⁵ nats)
    engine: late joiner vs alone  within the tolerance (1×10⁻⁵ nats)

Rich form: one horizontal bar per case, ``max |Δ log-prob|`` in nats on a log axis
labelled without e-notation, its value written beside it; within the tolerance in the
verdict's good colour, over it in the bad colour and hatched (the verdict not by hue
alone); the tolerance a black dashed line (a limit). A gap of exactly 0 sits on the
axis's floor, labelled ``0 (identical)``.
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from . import style

FLOOR_DECADES = 2  # the axis starts this many decades under the smallest positive value drawn


def _verdict(gap: float, tolerance: float) -> str:
    return "within" if gap <= tolerance else "over"


def _value(gap: float) -> str:
    """A gap in nats as written beside its bar: ``0.59``, ``9.5×10⁻⁷``, ``0 (identical)``."""
    if gap == 0:
        return "0 (identical)"
    return f"{gap:.2f} nats" if gap >= 0.01 else f"{style.scientific(gap)} nats"


def _decade(v: float, _pos=None) -> str:
    """A log axis label: ``10⁻⁶`` for small powers of ten, ``0.01``, ``1``, ``10`` from 0.01 on."""
    return f"10{str(round(math.log10(v))).translate(style.SUPERSCRIPT)}" if v < 0.01 else f"{v:g}"


def gaps_text(gaps: dict[str, float], tolerance: float) -> str:
    """One line per case: its label and whether its gap is within ``tolerance`` (nats)."""
    width = max((len(k) for k in gaps), default=0)
    tol = style.scientific(tolerance, 1)
    return "\n".join(
        f"{label:<{width}}  {_verdict(g, tolerance)} the tolerance ({tol} nats)" for label, g in gaps.items()
    )


def render_gaps(gaps: dict[str, float], tolerance: float, title: str, width_in: float = 9.0) -> Figure:
    """The figure of the module docstring.

    Args:
        gaps: case label -> ``max |Δ log-prob|`` against the request alone (nats, >= 0),
            drawn top to bottom in this order.
        tolerance: the oracle's tolerance (nats, > 0).
        title: the figure's title.
        width_in: the figure's width (inches).

    Raises:
        ValueError: for no gaps, a negative or non-finite gap, or a tolerance <= 0.
    """
    if not gaps:
        raise ValueError("render_gaps needs at least one case (label -> gap)")
    if not all(math.isfinite(g) and g >= 0 for g in gaps.values()) or not tolerance > 0:
        raise ValueError(f"gaps must be finite and >= 0 and tolerance > 0, got {gaps!r}, {tolerance!r}")
    positive = [g for g in gaps.values() if g > 0] + [tolerance]
    floor = 10 ** (math.floor(math.log10(min(positive))) - FLOOR_DECADES)
    fig = Figure(figsize=(width_in, 0.45 * len(gaps) + 1.3), layout="constrained")
    ax = fig.subplots()
    for y, g in enumerate(gaps.values()):
        over = g > tolerance
        ax.barh(
            y,
            max(g, floor) - floor,
            left=floor,
            color=style.BAD if over else style.GOOD,
            hatch=style.BAD_HATCH if over else None,
            edgecolor=style.EDGE,
        )
        ax.annotate(
            _value(g),
            (max(g, floor), y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},  # over the tolerance line
            zorder=4,
        )
    ax.axvline(
        tolerance,
        color="black",
        ls="--",
        lw=1.2,
        label=f"oracle's tolerance\n{style.scientific(tolerance, 1)} nats",
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    ax.set_xscale("log")
    ax.set_xlim(floor, 10 ** (math.ceil(math.log10(max(positive))) + 2))  # room for the value labels
    ax.xaxis.set_major_locator(LogLocator(base=10, numticks=12))
    ax.xaxis.set_major_formatter(FuncFormatter(_decade))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks(range(len(gaps)), list(gaps))
    ax.invert_yaxis()
    ax.set_xlabel("max |Δ log-prob| against the request alone (nats, log scale)")
    ax.set_title(title, fontsize="medium", loc="left")
    return fig
