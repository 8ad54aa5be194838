"""The panel's timeline pane draws each step's prefill and decode phases
(workbench.views.phases, issue 43): a prefill as wide as its prompt tokens, a decoding row
waiting through it hatched (stalled), following the history slider call by call."""

import workbench as wb
from workbench import views
from workbench.views.phases import STALL_HATCH


def bars(fig) -> list:
    """The timeline's bars (uid rows) on its first axes: (y, left, width, hatch)."""
    ax = fig.axes[0]
    return [
        (round(p.get_y() + p.get_height() / 2), p.get_x(), p.get_width(), p.get_hatch()) for p in ax.patches
    ]


def test_the_panel_timeline_gives_a_prefill_its_tokens_and_hatches_the_row_it_stalls(make_sched, prompt):
    sched = make_sched(max_batch=3, history_size=16)
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=6, stop_ids=[]))
    sched.admit()
    sched.step()
    before_join = len(sched.history) - 1
    sched.submit(wb.Request(prompt=prompt(30, 40), max_tokens=6, stop_ids=[]))
    sched.admit()  # uid 1's 30-token prompt prefills while uid 0 decodes: uid 0 waits (stalled)
    panel = views.Panel(sched)
    timeline = panel.figures(panel.shown, list(sched.history))[panel.timeline_image]
    drawn = bars(timeline)
    stalled = [b for b in drawn if b[3] == STALL_HATCH]
    assert [b[0] for b in stalled] == [0]  # uid 0 (y 0), hatched through uid 1's prefill
    prefill_1 = [b for b in drawn if b[0] == 1]
    assert len(prefill_1) == 1 and prefill_1[0][2] == stalled[0][2] >= 30  # as wide as its prompt tokens
    assert timeline.axes[0].get_xlim()[1] >= 30 + 2  # step 0's prefill and decode phases come before it
    panel.slider.value = before_join  # the slider back to the snapshot before uid 1's admit
    back = bars(panel.figures(panel.shown, list(sched.history)[: before_join + 1])[panel.timeline_image])
    assert back and {b[0] for b in back} == {0} and not any(b[3] for b in back)
    assert max(b[1] + b[2] for b in back) < 30  # uid 1's prefill is not drawn before it ran
