"""What a step costs, drawn (workbench.views.phases): a prefill is as wide as its tokens on
the step axis and as its wall seconds on the time axis, and a decoding row waiting through
another request's prefill is stalled, not solid decode (issue 43)."""

import pandas as pd
import pytest
from matplotlib.colors import to_hex

import workbench as wb
from workbench.observe.events import Event, events_frame
from workbench.views import style
from workbench.views.phases import (
    COLOURS,
    phase_totals,
    render_phases,
    row_segments,
    stalls_text,
    step_phases,
    step_ticks,
)


@pytest.fixture
def joined_events() -> pd.DataFrame:
    """uid 0 (a 1-token prompt) decodes at steps 0..3; uid 1 (a 9-token prompt: an 8-token
    chunk and its join) is admitted before step 2, whose prefill takes 4 s (t 2.5 -> 6.5)
    while a decode step takes 1 s."""
    ev = [Event("submit", 0, 0, 0.0), Event("admit", 0, 0, 0.0), Event("join", 0, 0, 0.5, row=0)]
    ev += [Event("token", 0, 0, 1.5, row=0), Event("token", 0, 1, 2.5, row=0)]
    ev += [Event("submit", 1, 2, 2.6, n_tokens=9), Event("admit", 1, 2, 2.7, n_tokens=9)]
    ev += [Event("prefill", 1, 2, 6.0, n_tokens=8), Event("join", 1, 2, 6.5, row=1, join_mode="extend")]
    ev += [Event("token", 0, 2, 7.5, row=0), Event("token", 1, 2, 7.5, row=1)]
    ev += [Event("token", 0, 3, 8.5, row=0), Event("token", 1, 3, 8.5, row=1)]
    ev += [Event("finish", 0, 3, 8.5, row=0), Event("finish", 1, 3, 8.5, row=1)]
    ev += [Event("evict", 0, 4, 8.6, row=0), Event("evict", 1, 4, 8.6, row=1)]
    return events_frame(ev)


def test_a_prefill_phase_is_as_wide_as_its_prompt_tokens_and_its_wall_seconds(joined_events):
    ph = step_phases(joined_events)
    pre = ph[(ph.step == 2) & (ph.phase == "prefill")].iloc[0]
    assert pre.step_width == 8 + 1  # the chunk's real tokens + the join forward's last prompt token
    assert pre.time_left == 2.5 and pre.time_width == 4.0  # from step 1's token to the join
    dec = ph[(ph.step == 2) & (ph.phase == "decode")].iloc[0]
    assert (dec.step_left, dec.step_width, dec.time_left, dec.time_width) == (1 + 2 + 9, 2, 6.5, 1.0)
    assert ph.time_width.sum() == pytest.approx(8.5)  # the phases tile the run, submit to last token
    assert (ph.step_left.diff().dropna() == ph.step_width.iloc[:-1].to_numpy()).all()  # end to end


def test_a_decoding_row_is_stalled_through_another_requests_prefill_and_decodes_otherwise(joined_events):
    seg = row_segments(joined_events).set_index(["uid", "step", "phase"]).kind
    assert seg[(0, 2, "prefill")] == "stalled" and seg[(1, 2, "prefill")] == "prefill"
    assert seg[(0, 2, "decode")] == "decode" and seg[(1, 2, "decode")] == "decode"
    assert seg[(0, 1, "decode")] == "decode" and (1, 1, "decode") not in seg.index  # not submitted yet
    assert (seg == "stalled").sum() == 1
    totals = phase_totals(joined_events)
    assert totals["stalled"] == 1 and totals["stalled_s"] == 4.0
    assert (totals["prefill_tokens"], totals["decode_tokens"], totals["decode_steps"]) == (1 + 9, 6, 4)
    assert totals["prefill_s"] + totals["decode_s"] == pytest.approx(totals["wall_s"])


def test_the_text_names_each_prefill_its_tokens_and_the_rows_it_stalled(joined_events):
    assert stalls_text(joined_events).splitlines() == [
        "step 0 prefill: 1 token of uid 0",
        "steps 0-1 decode: 2 tokens",
        "step 2 prefill: 9 tokens of uid 1, stalling uid 0",
        "steps 2-3 decode: 4 tokens",
        "prefill: 10 tokens in 2 phases; decode: 6 tokens in 4 steps; stalled: 1 row-phase",
    ]


def _bars(ax, y: int) -> list[tuple[float, float, str]]:
    """(left, width, kind) of the bars drawn on row ``y`` of a panel, left to right."""
    kinds = {to_hex(c): k for k, c in COLOURS.items()}
    return sorted(
        (p.get_x(), p.get_width(), kinds[to_hex(p.get_facecolor())])
        for p in ax.patches
        if abs(p.get_y() + p.get_height() / 2 - y) < 1e-9
    )


def test_the_figure_draws_the_prefill_its_width_on_both_axes_and_the_stall_hatched(joined_events):
    fig = render_phases(joined_events, title="one join")
    by_step, by_time = fig.axes
    assert _bars(by_step, 1)[0] == (3, 9, "prefill") and _bars(by_time, 1)[0] == (2.5, 4.0, "prefill")
    stalled = [p for p in by_time.patches if to_hex(p.get_facecolor()) == to_hex(style.LATER)]
    assert [(p.get_x(), p.get_width(), p.get_hatch()) for p in stalled] == [(2.5, 4.0, "////")]
    assert "stalled" in [t.get_text() for t in fig.legends[0].get_texts()]
    one_axis = render_phases({"a": joined_events, "b": joined_events}, axes=("time",))
    assert len(one_axis.axes) == 2 and one_axis.axes[0].get_xlim() == one_axis.axes[1].get_xlim()


def test_runs_on_one_shared_axis_all_fit_the_longest_first_or_last(joined_events):
    """A shared x axis keeps only the last ``set_xlim``: a longer run drawn first (notebook
    00's static run beside the continuous one) was cut at the shorter run's end."""
    short = joined_events[joined_events.step < 2]  # ends at uid 0's step 1 token, t = 2.5 s
    for runs in ({"long": joined_events, "short": short}, {"short": short, "long": joined_events}):
        fig = render_phases(runs, axes=("time",))
        assert [ax.get_xlim() for ax in fig.axes] == [(0.0, 8.5)] * 2


def test_bad_axes_and_empty_runs_are_refused_or_said():
    with pytest.raises(ValueError, match="axes must be"):
        render_phases(events_frame([]), axes=("wall",))
    with pytest.raises(ValueError, match="at least one run"):
        render_phases({})
    assert stalls_text(events_frame([])) == "(no steps)" and row_segments(events_frame([])).empty


def test_step_ticks_skip_steps_too_close_to_read():
    ph = pd.DataFrame({"step": [0, 1, 2, 3], "step_left": [0, 90, 91, 92], "step_width": [90, 1, 1, 8]})
    assert step_ticks(ph).to_dict() == {0: 0, 1: 90}


def test_on_the_engine_every_prompt_is_fed_once_and_joins_stall_the_running_rows(
    bundled, prompt, fake_clock_class
):
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=2, clock=fake_clock_class(0.25))
    lengths = [3, 30, 12]
    arrivals = [
        (2 * i, wb.Request(prompt=prompt(n, 10 * i), max_tokens=6, stop_ids=[]))
        for i, n in enumerate(lengths)
    ]
    ev = sched.run(arrivals).events
    ph, seg = step_phases(ev), row_segments(ev)
    assert phase_totals(ev)["prefill_tokens"] == sum(lengths)  # chunks + join forwards = each prompt
    assert phase_totals(ev)["decode_tokens"] == 3 * 6
    for p in ph[ph.phase == "prefill"].itertuples():
        joined = ev[(ev.step == p.step) & (ev.kind == "join")].uid
        assert p.step_width == ev[(ev.step == p.step) & (ev.uid.isin(joined))].query(
            "kind == 'prefill'"
        ).n_tokens.sum() + len(joined)
        running = set(seg[(seg.step == p.step - 1) & (seg.kind == "decode")].uid) - set(
            ev[(ev.step == p.step) & (ev.kind == "evict")].uid
        )
        assert set(seg[(seg.step == p.step) & (seg.kind == "stalled")].uid) == running
    assert (seg.kind == "stalled").any()
