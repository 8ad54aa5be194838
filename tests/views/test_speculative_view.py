"""The draft view's text form (exact) and figure form, from a hand-built event log."""

import pytest

from tests.observe.test_speculation import hand_events
from workbench.views.speculative import drafts_text, render_drafts


def test_the_text_form_shows_accepted_and_rejected_drafts_per_row_per_step():
    assert drafts_text(hand_events()).splitlines() == [
        "4 steps, 8/15 draft tokens accepted (53%), 4.50 tokens per forward over the batch",
        "uid 0 | ++++ ++-  +--- .    | 7/11 accepted (64%), 2.75 tokens/forward",
        "uid 1 | .    .    ---  +    | 1/4 accepted (25%), 1.25 tokens/forward",
    ]
    assert drafts_text([]) == "no draft tokens (speculation off, or no row could draft)"
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        drafts_text(hand_events(), max_steps=0)


def test_the_figure_has_a_lane_per_drafting_row_and_its_acceptance_rate():
    fig = render_drafts(hand_events(), title="drafts")
    lanes, rates = fig.axes
    assert [t.get_text() for t in lanes.get_yticklabels()] == ["uid 0", "uid 1"]
    assert [round(p.get_width(), 3) for p in rates.patches] == [round(7 / 11, 3), 0.25]
    heights = [round(p.get_height(), 3) for p in lanes.patches[:4]]  # uid 0's accepted bars, of 4 per step
    assert heights == [0.8, 0.4, 0.2, 0.0]
