"""The row timeline (workbench.views.timeline) of a preempted request: back in the queue
from its preemption to its re-admission, in the text form and the figure, with a mark."""

import pandas as pd
import pytest

from workbench.observe.events import Event, events_frame
from workbench.views import style
from workbench.views.timeline import preemptions, render_timeline, timeline_text


@pytest.fixture
def preempted_events() -> pd.DataFrame:
    """uid 0 decodes at steps 0, 1, is preempted before step 2 for uid 1 (steps 2..4),
    re-admitted at step 5 and decodes at steps 5, 6."""
    ev = [Event("submit", 0, 0, 0.0), Event("admit", 0, 0, 0.0), Event("join", 0, 0, 0.0, row=0)]
    ev += [Event("token", 0, s, 1.0 + s, row=0) for s in (0, 1)]
    ev += [Event("submit", 1, 2, 3.0), Event("preempt", 0, 2, 3.0, row=0, n_tokens=2)]
    ev += [Event("admit", 1, 2, 3.0), Event("join", 1, 2, 3.0, row=0)]
    ev += [Event("token", 1, s, 1.0 + s, row=0) for s in (2, 3, 4)]
    ev += [Event("finish", 1, 4, 5.0, row=0), Event("evict", 1, 5, 5.5, row=0)]
    ev += [Event("admit", 0, 5, 5.5, n_tokens=4), Event("join", 0, 5, 5.6, row=0)]
    ev += [Event("token", 0, s, 1.0 + s, row=0) for s in (5, 6)]
    ev += [Event("finish", 0, 6, 7.0, row=0), Event("evict", 0, 7, 7.5, row=0)]
    return events_frame(ev)


def test_a_preempted_row_is_marked_and_queued_again_until_its_readmission_in_text(preempted_events):
    assert timeline_text(preempted_events).splitlines() == ["uid 0 | ##pqq##x", "uid 1 |   ###x"]
    cut = preemptions(preempted_events, "step")
    assert cut.to_dict("records") == [{"uid": 0, "preempt": 2.0, "admit": 5.0, "first_token": 5.0}]
    assert preemptions(preempted_events, "time").iloc[0][["preempt", "admit", "first_token"]].tolist() == [
        3.0,
        5.5,
        6.0,
    ]


def test_the_figure_draws_the_preempted_rows_queue_wait_between_its_two_decode_spans(preempted_events):
    ax = render_timeline(preempted_events, x="step").axes[0]
    colour = {style.ATTENDED: "decode", style.QUEUED: "queued"}
    from matplotlib.colors import to_hex

    row0 = sorted(
        (p.get_x(), p.get_width(), colour[to_hex(p.get_facecolor())])
        for p in ax.patches
        if abs(p.get_y() + p.get_height() / 2) < 1e-9
    )
    assert row0 == [(0, 2, "decode"), (2, 3, "queued"), (5, 2, "decode")]  # before: one decode span 0..7
    marks = [(line.get_marker(), line.get_xdata()[0]) for line in ax.lines]
    assert ("v", 2) in marks and marks.count((">", 5)) == 1  # the preemption and the rejoin
    assert "▼ preempt" in ax.get_title()
    over_time = render_timeline(preempted_events, x="time").axes[0]
    assert "queued" in [t.get_text() for t in over_time.get_legend().get_texts()]


def test_a_run_without_preemption_keeps_its_title_and_marks(two_request_events):
    ax = render_timeline(two_request_events, x="step").axes[0]
    assert ax.get_title().endswith("(▶ join, ◀ evict)") and len(ax.lines) == 4
    assert preemptions(two_request_events).empty
