"""Axis helpers shared by the benchmark's figures and the views."""

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from workbench.bench.axes import log_tick_subs, plain_log_axis


def test_log_tick_subs_thin_out_as_the_range_grows():
    assert log_tick_subs(30, 5000) == (1.0,)
    assert log_tick_subs(150, 5500) == (1.0, 3.0)
    assert log_tick_subs(5, 31) == (1.0, 2.0, 5.0)


def test_a_plain_log_axis_over_one_decade_carries_at_least_two_plain_labels():
    fig = Figure()
    ax = fig.subplots()
    values = np.array([160.0, 300.0, 900.0, 1900.0])  # the TTFT CDF that showed only "10^3"
    ax.plot(values, [0, 0.3, 0.6, 1.0])
    plain_log_axis(ax.xaxis, [values])
    FigureCanvasAgg(fig).draw()
    lo, hi = ax.get_xlim()
    labels = [t.get_text() for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi and t.get_text()]
    assert ax.get_xscale() == "log" and len(labels) >= 2, labels
    assert all("10^" not in t and "$" not in t for t in labels), labels
