"""Readability of the replay figures (workbench/views/replay.py): log-axis tick labels that
never overlap, and a runs legend that covers no line."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex

from tests.observe.event_logs import event_log
from workbench.observe.report import Report
from workbench.sim.replay import Replay
from workbench.views import style
from workbench.views.replay import render_latency_cdfs, render_occupancy


def _run(name: str, scale: float) -> Replay:
    """A replay whose requests' latencies spread like notebook 06's (TTFT 30..5000 ms,
    TPOT 5..31 ms, E2E 150..5500 ms); two requests' events for the occupancy panels."""
    rng = np.random.default_rng(0)
    n = 40
    requests = pd.DataFrame(
        {
            "ttft_s": rng.uniform(0.03, 5.0, n) * scale,
            "tpot_s": rng.uniform(0.005, 0.031, n),
            "e2e_s": rng.uniform(0.15, 5.5, n) * scale,
        }
    )
    events = event_log(
        f"""
        submit 0 0 0.0
        submit 1 0 0.2
        admit 0 0 0.5
        join 0 0 0.5
        admit 1 1 1.0
        join 1 1 1.0
        evict 0 2 {3.0 * scale}
        evict 1 3 {7.5 * scale}
        """
    )
    return Replay(name=name, config={}, mode="cost", report=Report(events, requests=requests), samples=None)


def _overlapping_tick_labels(ax) -> list[tuple[str, str]]:
    boxes = [
        (t.get_text(), t.get_window_extent())
        for t in ax.get_xticklabels()
        if t.get_visible() and t.get_text()
    ]
    return [(a, b) for (a, ba), (b, bb) in zip(boxes, boxes[1:]) if ba.x1 > bb.x0]


def test_latency_cdf_tick_labels_are_plain_numbers_that_never_overlap():
    runs = {
        name: _run(name, s) for name, s in (("fcfs", 1.0), ("shortest-first", 1.1), ("prefill-first", 0.9))
    }
    fig = render_latency_cdfs(runs)
    FigureCanvasAgg(fig).draw()
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert len(labels) >= 2 and all("times" not in t and "^" not in t for t in labels), labels
        assert _overlapping_tick_labels(ax) == [], ax.get_xlabel()
    assert fig.get_figwidth() * 100 <= 968  # three panels fit a JupyterLab output area at the inline 100 dpi


def test_the_occupancy_legend_sits_outside_both_panels():
    runs = {name: _run(name, 1.0) for name in ("fcfs", "shortest-first", "prefill-first")}
    fig = render_occupancy(
        runs, title="synthetic stand-in for conv 10:00+12 s: batch size and queue over virtual time"
    )
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    legend = fig.legends[0].get_window_extent()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(runs)
    for ax in fig.axes:
        assert ax.get_legend() is None and not legend.overlaps(ax.get_window_extent())
    assert not legend.overlaps(fig._suptitle.get_window_extent(canvas.get_renderer()))  # it covered the title


def test_the_policies_lines_take_series_colours_never_the_fed_tokens_orange():
    runs = {name: _run(name, 1.0) for name in ("fcfs", "shortest-first", "prefill-first")}
    for fig in (render_latency_cdfs(runs), render_occupancy(runs)):
        colours = {to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines()}
        assert colours and colours <= set(style.SERIES), colours


def test_the_batch_size_is_drawn_as_one_lane_per_run_above_one_queue_panel():
    runs = {name: _run(name, 1.0) for name in ("fcfs", "shortest-first", "prefill-first")}
    fig = render_occupancy(runs)
    *lanes, queue = fig.axes
    assert len(lanes) == len(runs) and queue.get_ylabel() == "queued requests"
    for lane, name in zip(lanes, runs):
        assert len(lane.get_lines()) == 1 and [t.get_text() for t in lane.texts] == [name]
        assert lane.get_ylim() == lanes[0].get_ylim()  # one scale: the lanes compare by height
    assert len(queue.get_lines()) == len(runs)
