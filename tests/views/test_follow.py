"""The events a snapshot had seen (workbench.views.follow): the panel's prefill and timeline
panes follow its history slider call by call (issue 43: three snapshots share a step index,
and a cut by step showed the next admit's prefill on the two before it)."""

import pytest

import workbench as wb
from workbench.engine import prefill
from workbench.observe.events import events_frame
from workbench.views.follow import events_seen_by, seen_by


def drive(sched, prompt, calls: int = 40) -> list[tuple[int, object]]:
    """admit / step / filter by hand, with requests arriving mid-run, chunked prefills (some
    while no row runs) and evictions; after every call that recorded a snapshot, (events
    logged so far, that snapshot)."""
    seen = []
    arrivals = {0: [(3, 4), (17, 3)], 2: [(40, 5)], 5: [(9, 2), (25, 6)]}
    for _ in range(calls):
        for n, m in arrivals.pop(sched.step_index, []):
            sched.submit(wb.Request(prompt=prompt(n, 7 * n), max_tokens=m, stop_ids=[]))
        for call in (sched.admit, sched.step, sched.filter):
            before = len(sched.history)
            call()
            if len(sched.history) > before:  # the call recorded a snapshot
                seen.append((len(sched.events), sched.history[-1]))
        if sched.idle and not arrivals:
            break
    return seen


@pytest.mark.parametrize("chunked_padding", [False, True], ids=["cpu default", "gpu default: batched chunks"])
def test_each_snapshot_sees_exactly_the_events_logged_before_it(
    make_sched, prompt, chunked_padding, monkeypatch
):
    """On a GPU padded prompts prefill batched in chunks and a member whose prompt ended rides
    the later chunks, logging ``prefill`` with ``n_tokens=0`` (docs/gpu.md): a snapshot between
    two chunks has not seen the second one's."""
    monkeypatch.setattr(prefill, "chunked_padding_default", lambda: chunked_padding)
    sched = make_sched(max_batch=2, prefill_step_size=8, history_size=1000)
    seen = drive(sched, prompt)
    events = events_frame(sched.events)
    assert len({snap.step for _, snap in seen}) < len(seen)  # several snapshots share a step index
    cut_by_step_was_wrong = 0
    for n, snap in seen:
        mask = seen_by(events, snap)
        assert mask[:n].all() and not mask[n:].any(), (snap.step, n, mask.sum())
        cut_by_step_was_wrong += int((events.step <= snap.step).sum() != n)
        assert len(events_seen_by(events, snap)) == n
    assert cut_by_step_was_wrong > 0  # the old cut (step <= s) showed later events on some snapshot
    assert (events.kind == "prefill").sum() > (events.kind == "admit").sum()  # chunked prefills ran
    assert ((events.kind == "prefill") & (events.n_tokens == 0)).any() == chunked_padding  # a member rode


def test_the_panels_prefill_and_timeline_panes_follow_the_slider_to_a_snapshot_before_a_join(
    make_sched, prompt
):
    from workbench import views

    sched = make_sched(max_batch=3, history_size=16)
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=6, stop_ids=[]))
    sched.admit()
    sched.step()
    sched.filter()  # nothing to evict: no snapshot; the one after step() has the same step index
    before_join = len(sched.history) - 1
    sched.submit(wb.Request(prompt=prompt(9, 40), max_tokens=6, stop_ids=[]))
    sched.admit()  # uid 1 prefills and joins at the same step index as the snapshot before it
    assert sched.history[before_join].step == sched.history[-1].step
    panel = views.Panel(sched)
    assert set(panel.last_prefill(panel.shown).uids) == {1}
    assert 1 in set(panel.recent_events(panel.shown).uid)
    panel.slider.value = before_join
    assert set(panel.last_prefill(panel.shown).uids) == {0}  # a cut by step showed uid 1's prefill here
    assert set(panel.recent_events(panel.shown).uid) == {0}
    assert set(panel.recent_events(panel.shown.step).uid) == {0, 1}  # the old cut, by step
