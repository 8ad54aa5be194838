"""Axis helpers shared by the benchmark's figures and the views: a log axis labelled with
plain numbers. It lives here, not in :mod:`workbench.views.style`, because the benchmark
sits below the views in the import order (the views import it through ``style``).

Knows: matplotlib. Must not know: the engine, the benchmark's runs.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from matplotlib.axis import Axis
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter


def log_tick_subs(lo: float, hi: float) -> tuple[float, ...]:
    """Which multiples of each power of ten label a log axis from ``lo`` to ``hi`` (> 0):
    few enough that the labels never overlap on a 3-inch axis, at least two in range.

    >>> log_tick_subs(30, 5000), log_tick_subs(150, 5500), log_tick_subs(5, 31), log_tick_subs(9, 14)
    ((1.0,), (1.0, 3.0), (1.0, 2.0, 5.0), (1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 7.0))
    """
    decades = np.log10(hi / lo) if lo > 0 and hi > lo else 0.0
    if decades >= 2:
        return (1.0,)
    if decades >= 1:
        return (1.0, 3.0)
    return (1.0, 2.0, 5.0) if decades >= 0.5 else (1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 7.0)


def plain_log_axis(axis: Axis, values: Iterable[np.ndarray]) -> None:
    """Make ``axis`` (``ax.xaxis`` or ``ax.yaxis``) logarithmic, labelled with plain numbers
    (``200``, ``1000``, not ``10^3``) at :func:`log_tick_subs` of the data's range, so it
    carries at least two labels; minor ticks unlabelled. ``values``: the arrays drawn on it
    (non-positive values are ignored)."""
    getattr(axis.axes, f"set_{axis.axis_name}scale")("log")
    finite = np.concatenate([np.asarray(v, float).ravel() for v in values] or [np.array([1.0])])
    finite = finite[np.isfinite(finite) & (finite > 0)]
    subs = log_tick_subs(finite.min(), finite.max()) if finite.size else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=12))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())
