"""The top-k view: each running row's latest token's candidates as text, and the Panel
showing it for rows that asked (``Request(top_logprobs=k)``)."""

import pytest

import workbench as wb
from workbench.observe.events import Event, events_frame
from workbench.observe.snapshot import Snapshot
from workbench.views.top_logprobs import top_logprobs_text

pytest.importorskip("ipywidgets")
from workbench import views  # noqa: E402


def test_the_text_shows_the_latest_tokens_candidates_of_each_row_that_asked():
    events = events_frame(
        [
            Event("token", 3, 0, 1.0, row=0, token=7, logprob=-0.1, top_logprobs=((7, -0.1), (2, -2.4))),
            Event("token", 5, 0, 1.0, row=1, token=4, logprob=-0.3),
            Event("token", 3, 1, 2.0, row=0, token=9, logprob=-0.9, top_logprobs=((5, -0.7), (9, -0.9))),
        ]
    )
    snap = Snapshot(2, (3, 5), (), (), (), (), (), 0, 0, 0)
    assert top_logprobs_text(snap, events) == (
        "top log-probs of each row's latest token (best first)\nrow 0 uid 3  5  -0.70 | 9  -0.90"
    )
    earlier = Snapshot(1, (3, 5), (), (), (), (), (), 0, 0, 0)  # the history's step 1: the first token's
    assert top_logprobs_text(earlier, events).endswith("row 0 uid 3  7  -0.10 | 2  -2.40")
    assert top_logprobs_text(Snapshot(2, (5,), (), (), (), (), (), 0, 0, 0), events) == ""


def test_the_panel_shows_top_logprobs_for_rows_that_asked_and_nothing_otherwise(make_sched, prompt):
    sched = make_sched(max_batch=2, history_size=8)
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=6))
    panel = views.Panel(sched)
    panel.buttons["Admit"].click(), panel.buttons["Step"].click()
    assert panel.top_ascii.value == ""
    sched.submit(wb.Request(prompt=prompt(4, 30), max_tokens=6, top_logprobs=3))
    panel.buttons["Admit"].click(), panel.buttons["Step"].click()
    assert "row 1 uid 1" in panel.top_ascii.value and panel.top_ascii.value.count(" | ") == 2
    assert "top log-probs" in panel.static().data
