"""Views: exact text forms on hand-built snapshots and event logs, figures that render with
the expected axes, and the Panel's button callbacks driving a live scheduler."""

from __future__ import annotations

import subprocess
import sys
from html import escape as html_escape
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

import workbench as wb
from workbench import views
from workbench.observe.masks import decode_mask
from workbench.observe.metrics import request_metrics, throughput_tok_per_s
from workbench.observe.report import Report
from workbench.observe.snapshot import LayerGroup, Snapshot, frozen
from workbench.views import panel as panel_module
from workbench.views.kv import row_geometry
from workbench.views.latency import run_lengths
from workbench.views.mask import mask_cells
from workbench.views.rows import one_line
from workbench.workloads.workload import prompt_of_length

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "02_join_evict.ipynb"


def full_snapshot(uids=(7, 9), left_padding=(0, 2), width=3, capacity=8, step=3, finished=None) -> Snapshot:
    """A hand-built snapshot of a full-attention batch (2 layers, 4,096 KV bytes)."""
    lp = frozen(np.array(left_padding))
    offset = frozen(width - lp)
    group = LayerGroup(
        name="full",
        layers=("0", "1"),
        kv_bytes=4096,
        mask=frozen(decode_mask(lp, width)),
        left_padding=lp,
        offset=offset,
        kv_width_tokens=width,
        capacity_tokens=capacity,
    )
    B = len(uids)
    return Snapshot(
        step=step,
        uids=tuple(uids),
        finished=tuple(finished or [False] * B),
        generated_tokens=(1,) * B,
        context_tokens=tuple(int(o) for o in offset),
        left_padding=lp,
        offset=offset,
        kv_width_tokens=width,
        capacity_tokens=capacity,
        kv_bytes=4096,
        groups=(group,),
    )


def report_of(events) -> Report:
    return Report(
        events=events, requests=request_metrics(events), throughput_tok_per_s=throughput_tok_per_s(events)
    )


def window_run(model_name="tiny-gemma3", steps=8):
    """A live tiny-gemma3 batch: two rows decode ``steps`` steps, a third joins."""
    model, tokenizer = wb.load(wb.runtime.loading.DATA_DIR / "models" / model_name)
    sched = wb.Scheduler(model, tokenizer, max_batch=3)
    for n, start in ((6, 0), (3, 50)):
        sched.submit(wb.Request(prompt=prompt_of_length(tokenizer, n, start), max_tokens=16))
    sched.admit()
    for _ in range(steps):
        sched.step()
    sched.submit(wb.Request(prompt=prompt_of_length(tokenizer, 5, 90), max_tokens=4))
    sched.admit()
    return sched


# -- mask view --------------------------------------------------------------------------
def test_mask_text_of_a_two_row_full_attention_snapshot_is_exact():
    assert views.mask_text(full_snapshot()) == "\n".join(
        [
            "masks at step 3: 2 row(s)",
            "[full] layers 0,1, 4,096 bytes; KV width 3 tokens",
            "  mask ('#' attended, '.' padding, '@' fed token):",
            "uid 7 | # # # @",
            "uid 9 | . . # @",
        ]
    )


def test_mask_text_of_an_empty_batch_says_no_rows():
    empty = Snapshot(
        step=0,
        uids=(),
        finished=(),
        generated_tokens=(),
        context_tokens=(),
        left_padding=frozen(np.zeros(0, int)),
        offset=frozen(np.zeros(0, int)),
        kv_width_tokens=0,
        capacity_tokens=0,
        kv_bytes=0,
    )
    assert views.mask_text(empty) == "masks at step 0: 0 row(s)\n(no rows)"
    fig = views.render_masks(empty)
    assert fig.axes[0].texts[0].get_text().startswith("no rows in the batch")


def test_mask_cells_code_masked_attended_and_the_fed_slot():
    cells = mask_cells(decode_mask([0, 2], 3))
    assert cells.tolist() == [[1, 1, 1, 2], [0, 0, 1, 2]]


def test_render_masks_of_a_hand_built_snapshot_labels_rows_by_uid_and_marks_finished_rows():
    fig = views.render_masks(full_snapshot(finished=[False, True]))
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["uid 7", "uid 9 (finished)"]
    assert ax.get_xlabel() == "key position relative to the fed token (0 = fed token)"
    assert ax.images[0].get_array().tolist() == [[1, 1, 1, 2], [0, 0, 3, 3]]  # 3: finished, not filtered
    assert len(views.figure_png(fig)) > 5_000


def test_a_finished_row_is_drawn_in_the_waiting_colour_with_its_legend_entry_only_when_present():
    from matplotlib.colors import to_rgb

    from workbench.views import style
    from workbench.views.mask import CMAP, FINISHED, render_mask_steps

    assert CMAP(FINISHED / (CMAP.N - 1))[:3] == pytest.approx(to_rgb(style.WAITING))
    finished, compacted = (
        full_snapshot(finished=[True, False]),
        full_snapshot(uids=(9,), left_padding=(0,), width=1),
    )
    fig = render_mask_steps([finished, compacted], ["before filter()", "after filter()"])
    assert fig.axes[0].images[0].get_array().tolist() == [[3, 3, 3, 3], [0, 0, 1, 2]]  # padding stays grey
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "finished, waiting for filter()" in labels
    for running in (views.render_masks(full_snapshot()), render_mask_steps([compacted])):
        assert "finished, waiting for filter()" not in [t.get_text() for t in running.legends[0].get_texts()]


def test_render_masks_of_a_sliding_window_model_draws_each_group_on_shared_positions():
    snap = window_run().snapshot()
    fig = views.render_masks(snap)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert len(fig.axes) == 2 and titles[0].startswith("window8 · layers 0,2 · window 8 tokens, ring wrapped")
    assert titles[1].startswith("full · layers 1,3")
    window_ax, full_ax = fig.axes
    assert window_ax.get_xlim() == full_ax.get_xlim() == (-snap.kv_width_tokens - 0.5, 0.5)
    assert "mask in temporal order" in views.mask_text(snap)


# -- KV geometry ------------------------------------------------------------------------
def test_kv_text_of_a_two_row_snapshot_is_exact():
    assert views.kv_text(full_snapshot()) == "\n".join(
        [
            "KV geometry at step 3: 2 row(s), 4,096 KV bytes, padding waste 33.3%",
            "[full] layers 0,1: KV width 3 of 8 allocated tokens",
            "  uid | padding    valid   unused",
            "    7 |       0        3        5",
            "    9 |       2        1        5",
        ]
    )


def test_row_geometry_of_a_wrapped_ring_counts_the_overwritten_slot_as_expired():
    # window 4, wrapped: row 0 has no padding left (mlx-lm's left_padding went negative),
    # row 1 still has 2 pad slots. The fed token overwrites the write slot.
    mask = np.array([[True, True, True, True], [True, False, False, True]])
    ring = LayerGroup(
        name="window4",
        layers=("0",),
        kv_bytes=0,
        mask=mask,
        left_padding=np.array([-1, 2]),
        kv_width_tokens=4,
        capacity_tokens=4,
        window_tokens=4,
        write_index=0,
        wrapped=True,
    )
    geo = row_geometry(ring)
    assert {k: v.tolist() for k, v in geo.items()} == {
        "padding": [0, 2],
        "valid": [3, 1],
        "expired": [1, 1],
        "unused": [0, 0],
    }


def test_kv_history_text_has_one_line_per_snapshot():
    history = [full_snapshot(step=3), full_snapshot(uids=(9,), left_padding=(0,), width=1, step=4)]
    assert views.kv_history_text(history) == "\n".join(
        [
            "step  rows  KV width  padding waste      KV bytes",
            "   3     2         3          33.3%         4,096",
            "   4     1         1           0.0%         4,096",
        ]
    )


def test_render_kv_draws_row_bars_and_waste_and_bytes_per_step():
    history = [full_snapshot(step=3), full_snapshot(step=4)]
    fig = views.render_kv(history[-1], history)
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels[-2:] == ["padding waste (%)", "KV bytes (KiB)"]
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["uid 7", "uid 9"]
    widths = [p.get_width() for p in fig.axes[0].patches]  # padding, valid, expired, unused per row
    assert widths == [0, 2, 3, 1, 0, 0, 5, 5]


def test_render_kv_history_keeps_two_snapshots_of_one_step_apart_and_ticks_steps():
    # before and after a join at step 4: two snapshots of one step are two points, not a
    # vertical scatter at one x; the ticks name steps, the shown snapshot is marked
    history = [full_snapshot(step=3), full_snapshot(step=4), full_snapshot(step=4), full_snapshot(step=5)]
    fig = views.render_kv(history[1], history)
    waste_ax, bytes_ax = fig.axes[-2:]
    xs = waste_ax.lines[0].get_xdata()
    assert list(xs) == [0, 1, 2, 3]
    assert [t.get_text() for t in bytes_ax.get_xticklabels()] == ["3", "4", "5"]
    assert list(bytes_ax.get_xticks()) == [0, 1, 3]
    assert waste_ax.lines[-1].get_xdata()[0] == 1  # the shown snapshot, by identity


def test_the_kv_history_marks_the_snapshot_the_title_describes_when_it_is_a_copy_of_a_recorded_one():
    # notebook 02: three snapshots of step 5 (3 rows, 2 rows after filter(), 3 rows after a free-slot
    # join); render_kv(sched.snapshot() taken after filter(), history) marked the last one of step 5
    from dataclasses import replace

    running = full_snapshot(uids=(7, 9, 11), left_padding=(0, 2, 1), width=4, step=5)
    filtered = full_snapshot(uids=(7, 9), left_padding=(0, 2), width=3, step=5)
    refilled = full_snapshot(uids=(7, 9, 12), left_padding=(2, 4, 0), width=5, step=5)
    history = [full_snapshot(step=4), running, filtered, refilled]
    # a later sched.snapshot() of the recorded state: a new object, with a new memory reading
    copy = replace(filtered, active_memory_bytes=123)
    fig = views.render_kv(copy, history)
    waste_ax, bytes_ax = fig.axes[-2:]
    marked = waste_ax.lines[-1].get_xdata()[0]
    assert marked == 2 and bytes_ax.lines[-1].get_xdata()[0] == 2
    assert waste_ax.lines[0].get_ydata()[marked] == pytest.approx(100 * copy.padding_waste)
    assert f"padding waste {copy.padding_waste:.1%}" in fig.get_suptitle()
    unseen = views.render_kv(replace(filtered, step=9), history)  # in no snapshot of the history: no marker
    assert [len(ax.lines) for ax in unseen.axes[-2:]] == [1, 1]


def test_the_kv_history_of_a_live_run_marks_a_fresh_snapshot_after_filter_at_its_own_point(
    make_sched, prompt
):
    sched = make_sched(max_batch=3)
    for n, m in ((6, 8), (3, 8), (12, 2)):
        sched.submit(wb.Request(prompt=prompt(n), max_tokens=m))
    sched.admit()
    while not any(sched.snapshot().finished):
        sched.step()
    sched.filter()
    compacted = sched.snapshot()
    sched.submit(wb.Request(prompt=prompt(4), max_tokens=3))
    sched.admit()  # joins into the free slot: a later snapshot of the same step
    history = list(sched.history)
    assert history[-1].step == compacted.step and history[-1].batch_size != compacted.batch_size
    fig = views.render_kv(compacted, history)
    marked = fig.axes[-2].lines[-1].get_xdata()[0]
    assert history[marked].uids == compacted.uids and marked < len(history) - 1
    assert fig.axes[-2].lines[0].get_ydata()[marked] == pytest.approx(100 * compacted.padding_waste)


def test_kv_view_of_a_live_hybrid_model_lists_the_ssm_state():
    text = views.kv_text(window_run("tiny-qwen3-next", steps=2).snapshot())
    assert "[full] layers 1,3: KV width" in text
    assert "[ssm] layers 0,2:" in text and "no sequence axis" in text


# -- timeline ---------------------------------------------------------------------------
def test_timeline_text_marks_finished_rows_waiting_for_filter_and_evictions(two_request_events):
    ev = two_request_events.copy()
    ev.loc[(ev.kind == "evict") & (ev.uid == 0), "step"] = 5  # filter called late for uid 0
    ev.loc[ev.kind == "submit", "step"] = [0, 0]
    assert views.timeline_text(ev) == "uid 0 | ###ffx\nuid 1 | ##x"


def test_timeline_text_of_a_long_run_merges_steps_per_column_so_a_line_fits_the_output_area():
    from workbench.observe.events import Event, events_frame

    # uid 0: 250 tokens (steps 0..249), evicted at step 250; uid 1 queued from step 0, joins at step 200
    ev = (
        [
            Event("submit", 0, 0, 0.0),
            Event("submit", 1, 0, 0.0),
            Event("admit", 0, 0, 0.0),
            Event("admit", 1, 200, 0.0),
        ]
        + [Event("token", 0, s, 0.0) for s in range(250)]
        + [Event("token", 1, s, 0.0) for s in range(200, 210)]
        + [
            Event("finish", 0, 249, 0.0),
            Event("evict", 0, 250, 0.0),
            Event("finish", 1, 209, 0.0),
            Event("evict", 1, 210, 0.0),
        ]
    )
    lines = views.timeline_text(events_frame(ev)).splitlines()
    assert lines[0] == "(one column = 3 decode steps)"  # 251 steps, at most 100 columns
    assert lines[1] == "uid 0 | " + "#" * 83 + "x"  # steps 249, 250 share column 83: x outranks #
    assert lines[2] == "uid 1 | " + "q" * 66 + "####x"  # 198..200: a token outranks q; 210 is x
    assert max(len(line) for line in lines) <= 8 + views.timeline.TEXT_COLUMNS
    assert (
        views.timeline_text(events_frame(ev), max_columns=300).splitlines()[0] == "uid 0 | " + "#" * 250 + "x"
    )
    with pytest.raises(ValueError, match="max_columns"):
        views.timeline_text(events_frame(ev), max_columns=0)


def test_the_timeline_legend_lists_only_the_span_kinds_drawn_wide_enough_to_see(two_request_events):
    def legend(fig):
        return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]

    # over steps, submit, admit and the first token share step 0 and every row is evicted right
    # after it finished: only decode spans have a width (the old legend listed all four kinds)
    assert legend(views.render_timeline(two_request_events, x="step")) == ["decode"]
    # over time uid 1 waits 0.5 s for filter(): its span is drawn and listed
    assert legend(views.render_timeline(two_request_events, x="time")) == [
        "queued",
        "prefill",
        "decode",
        "finished, not filtered",
    ]
    late = two_request_events.copy()
    finish_s = late[late.kind == "finish"].set_index("uid").time_s
    evict = late.kind == "evict"
    late.loc[evict, "time_s"] = (
        late.loc[evict, "uid"].map(finish_s) + 1e-6
    )  # filter() right after the finishing step
    spans = views.timeline.visible_spans(views.timeline.span_bounds(late, "time"))
    assert not spans[spans.kind == "finished, not filtered"].visible.any()  # microseconds: drawn, not listed
    assert "finished, not filtered" not in legend(views.render_timeline(late, x="time"))


def test_render_timeline_over_steps_draws_spans_and_join_evict_marks(two_request_events):
    fig = views.render_timeline(two_request_events, x="step")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "decode step"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["uid 0", "uid 1"]
    decode = [
        (p.get_x(), p.get_width())
        for p in ax.patches
        if p.get_facecolor()[:3] == (59 / 255, 125 / 255, 216 / 255)
    ]
    assert decode == [(0, 3), (0, 2)]
    assert len(ax.lines) == 4  # a join and an evict mark per uid
    assert all(float(t).is_integer() for t in ax.get_xticks())  # whole decode steps, never 2.5


def test_a_join_mark_at_zero_sits_inside_the_axes_not_on_its_edge(two_request_events):
    ax = views.render_timeline(two_request_events, x="step").axes[0]
    left, right = ax.get_xlim()
    joins = [line for line in ax.get_lines() if line.get_marker() == ">"]
    assert joins and min(line.get_xdata()[0] for line in joins) == 0 and left < 0 < right
    assert all(not line.get_clip_on() for line in joins)


def test_render_timelines_draws_one_panel_per_run_on_shared_axes(two_request_events):
    later = two_request_events.assign(step=two_request_events.step + 2)
    fig = views.render_timelines({"fcfs": two_request_events, "spf": later})
    left, right = fig.axes[:2]
    assert [a.get_title().split()[0] for a in (left, right)] == ["fcfs", "spf"]
    assert (
        left.get_xlim() == right.get_xlim() and right.get_legend() is not None and left.get_legend() is None
    )
    with pytest.raises(ValueError, match="at least one run"):
        views.render_timelines({})


def test_render_timelines_puts_the_first_uid_on_top_for_any_number_of_runs(two_request_events):
    # the panels share one y axis: inverting it once per panel flipped it back for 2 runs
    for n in (1, 2, 3):
        fig = views.render_timelines({f"run {i}": two_request_events for i in range(n)})
        assert all(ax.yaxis_inverted() for ax in fig.axes[:n]), n


def test_runs_side_by_side_fit_a_jupyterlab_output_area_unscaled(two_request_events):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = views.render_timelines({"a": two_request_events, "b": two_request_events})
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    assert fig.get_tightbbox(canvas.get_renderer()).width * 100 <= 968  # 1111 px before


def test_render_timeline_refuses_an_unknown_axis(two_request_events):
    with pytest.raises(ValueError, match="x must be one of"):
        views.render_timeline(two_request_events, x="tokens")


# -- latency ----------------------------------------------------------------------------
def test_latency_text_of_a_hand_written_log_is_exact(two_request_events):
    assert views.latency_text(report_of(two_request_events)) == "\n".join(
        [
            "2 requests, 5 generated tokens over 3 decode steps",
            "TTFT (ms): p50 1500.0, p95 1950.0 (2 requests)",
            "TPOT (ms): p50 1000.0, p95 1000.0 (2 requests)",
            "throughput: 1.2 tok/s over the run; decode tok/s per step: min 1.0, max 2.0",
            "batch size by step: 2×2 1",
        ]
    )


def test_run_lengths_collapse_repeats():
    assert run_lengths([1, 1, 2, 3, 3, 3]) == "1×2 2 3×3"
    assert run_lengths([]) == "(no steps)"


def test_render_latency_has_the_four_panels(two_request_events):
    fig = views.render_latency(report_of(two_request_events))
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        "TTFT per request",
        "TPOT per request",
        "decode throughput per step",
        "batch size per step",
    ]
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "p50 1500.0 ms"


# -- the panel --------------------------------------------------------------------------
@pytest.fixture
def panel(make_sched, prompt):
    """A panel on a tiny-llama scheduler with two rows decoding."""
    sched = make_sched(max_batch=3, history_size=8)
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=12))
    sched.submit(wb.Request(prompt=prompt(2, 40), max_tokens=12))
    sched.admit()
    return views.Panel(sched)


def test_step_button_steps_the_engine_and_changes_label_and_mask_image(panel):
    label, image = panel.status.value, panel.mask_image.value
    assert label == "engine now: step 0 · 2 row(s) · KV 1.25 MiB · queue []"  # 1,310,720 bytes
    panel.buttons["Step"].click()
    assert panel.sched.step_index == 1
    assert panel.status.value == "engine now: step 1 · 2 row(s) · KV 1.25 MiB · queue []"
    assert bytes(panel.mask_image.value) != bytes(image) and bytes(panel.mask_image.value).startswith(
        b"\x89PNG"
    )
    assert "uid 0 | # # # # # # @" in panel.mask_ascii.value


def test_bad_submit_shows_the_error_and_leaves_the_running_rows_untouched(panel):
    before = panel.sched.snapshot()
    n_history, tokens = len(panel.sched.history), panel.sched.tokens(0)
    panel.max_tokens.value = 0
    panel.buttons["Submit"].click()
    assert "ValueError: max_tokens must be an int &gt;= 1, got 0" in panel.error.value
    after = panel.sched.snapshot()
    assert after.uids == before.uids and after.queue == () and panel.sched.tokens(0) == tokens
    assert len(panel.sched.history) == n_history  # a refused submit changed nothing: no new snapshot
    panel.max_tokens.value = 4
    panel.buttons["Submit"].click()
    assert panel.error.value == "" and panel.status.value.endswith("queue [2]")


def test_run_n_steps_snapshots_every_step_and_the_slider_scrubs_history(panel):
    panel.run_steps.value = 3
    panel.buttons["Run N steps"].click()
    assert panel.sched.step_index == 3
    assert [s.step for s in panel.sched.history][-4:] == [0, 1, 2, 3]
    assert panel.slider.value == panel.slider.max == len(panel.sched.history) - 1
    latest = bytes(panel.mask_image.value)
    panel.slider.value = panel.slider.max - 3
    assert panel.shown.step == 0 and bytes(panel.mask_image.value) != latest
    assert (
        panel.slider_label.value
        == f"showing: snapshot {panel.slider.value + 1} of {panel.slider.max + 1} (step 0)"
    )
    assert panel.status.value.startswith("engine now: step 3 ")  # the status always shows the engine now


def test_a_panel_opens_at_the_snapshot_it_is_given_drawing_its_images_once(make_sched, prompt, monkeypatch):
    sched = make_sched(max_batch=3, history_size=8)
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=12))
    sched.admit()
    sched.step()
    sched.step()
    first = [i for i, s in enumerate(sched.history) if s.step == 0][-1]
    drawn = []
    monkeypatch.setattr(views.Panel, "render", lambda self, draw=views.Panel.render: drawn.append(draw(self)))
    panel = views.Panel(sched, shown=first)
    assert panel.shown.step == 0 and panel.slider.value == first and len(drawn) == 1
    assert panel.slider.max == len(sched.history) - 1 and panel.status.value.startswith("engine now: step 2 ")
    for bad in (-1, len(sched.history)):
        with pytest.raises(ValueError, match=f"shown={bad} is not an index of sched.history"):
            views.Panel(sched, shown=bad)


def _panel_after_steps(make_sched, prompt, steps, history_checkpoints):
    """A Panel over one admitted 5-token request (``max_tokens=12``, 8 snapshots kept,
    ``history_checkpoints`` of them restorable) after clicking Run N steps with ``steps``."""
    sched = make_sched(max_batch=3, history_size=8, history_checkpoints=history_checkpoints)
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=12))
    sched.admit()
    panel = views.Panel(sched)
    panel.run_steps.value = steps
    panel.buttons["Run N steps"].click()
    return sched, panel


def test_restore_returns_the_engine_to_the_snapshot_the_slider_shows(make_sched, prompt):
    sched, panel = _panel_after_steps(make_sched, prompt, steps=4, history_checkpoints=8)
    tokens_at_4 = sched.tokens(0)
    panel.slider.value = panel.slider.max - 2  # step 2
    assert not panel.buttons["Restore"].disabled
    panel.buttons["Restore"].click()
    assert panel.error.value == "" and sched.step_index == 2 and sched.tokens(0) == tokens_at_4[:2]
    assert panel.notice.value == "Restore: restored step 2; 2 later snapshot(s) dropped."
    assert panel.status.value.startswith("engine now: step 2 ") and panel.shown.step == 2
    panel.run_steps.value = 2
    panel.buttons["Run N steps"].click()
    assert sched.tokens(0) == tokens_at_4  # the same continuation


def test_restore_on_a_snapshot_older_than_the_kept_checkpoints_says_from_which_one_it_works(
    make_sched, prompt
):
    sched, panel = _panel_after_steps(make_sched, prompt, steps=5, history_checkpoints=3)
    panel.slider.value = 0
    first = len(sched.history) - 3 + 1  # the oldest of the 3 latest, counted from 1
    assert panel.buttons["Restore"].disabled
    assert f"move the slider to snapshot {first} or later to restore" in panel.buttons["Restore"].tooltip
    assert panel.slider_label.value.endswith(
        f" · Restore greyed here: checkpoints from snapshot {first} on"
    )  # short: fits the row, and says the button is off here, not that it works
    assert panel.buttons["Restore"].tooltip.startswith("no checkpoint kept this far back: ")
    assert "history_checkpoints" not in panel.slider_label.value  # words, not a parameter name
    panel.slider.value = panel.slider.max - 1
    assert not panel.buttons["Restore"].disabled and "·" not in panel.slider_label.value


def test_admit_with_a_full_batch_says_the_queue_waits_for_a_free_row(make_sched, prompt):
    sched = make_sched(max_batch=1)
    for n in (3, 4):
        sched.submit(wb.Request(prompt=prompt(n), max_tokens=4))
    panel = views.Panel(sched)
    panel.buttons["Admit"].click()
    panel.buttons["Admit"].click()
    assert (
        panel.notice.value.startswith("Admit: queue [1] waits") and "queue is empty" not in panel.notice.value
    )
    panel.slider.value = 0  # scrubbing the history: the notice was about the engine now, not that snapshot
    assert panel.notice.value == ""


def test_restore_is_disabled_without_kept_checkpoints_and_says_how_to_keep_them(panel):
    assert panel.buttons["Restore"].disabled and "history_checkpoints" in panel.buttons["Restore"].tooltip
    panel.on_restore()
    assert "history_checkpoints=N" in panel.error.value and panel.sched.step_index == 0


def test_an_interrupt_during_run_n_steps_is_shown_and_the_status_shows_the_true_state(panel, monkeypatch):
    calls = {"n": 0}
    real_step = type(panel.sched).step

    def step(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(type(panel.sched), "step", step)
    panel.run_steps.value = 5
    panel.buttons["Run N steps"].click()
    assert "interrupted: KeyboardInterrupt" in panel.error.value
    assert panel.sched.step_index == 2 and panel.sched.check().ok
    assert panel.status.value.startswith("engine now: step 2 · 2 row(s)")


def test_the_panel_timeline_draws_only_the_latest_uids_so_a_long_session_renders_as_fast(make_sched, prompt):
    sched = make_sched(max_batch=4, history_size=4)
    for i in range(40):
        sched.submit(wb.Request(prompt=prompt(3, 7 * i), max_tokens=2))
    sched.run()
    panel = views.Panel(sched)
    shown = panel.recent_events(sched.step_index)
    assert shown.uid.nunique() == panel_module.TIMELINE_UIDS and shown.uid.max() == 39


def test_reset_replaces_the_scheduler_with_a_fresh_one_of_the_same_configuration(panel):
    old = panel.sched
    panel.buttons["Reset"].click()
    new = panel.sched
    assert new is not old and new.idle and new.step_index == 0 and len(new.history) == 1
    assert (new.model, new.max_batch, new.history.maxlen) == (old.model, 3, 8)
    assert old.snapshot().batch_size == 2  # the old scheduler is left as it was
    assert panel.status.value == "engine now: step 0 · 0 row(s) · KV 0 bytes · queue []"


def test_the_panel_images_fit_two_side_by_side_unscaled_with_text_of_at_least_9_px(panel):
    from workbench.views.style import smallest_text_px

    panel.buttons["Step"].click()
    figures = panel.figures(panel.shown, list(panel.sched.history))
    assert len(figures) == 4
    for image, fig in figures.items():
        width_px = fig.get_figwidth() * panel_module.IMAGE_DPI
        assert 2 * width_px + 16 <= 968, image  # two per row in JupyterLab's output area at a 1400 px window
        assert fig.get_figheight() * panel_module.IMAGE_DPI <= 260, (
            image
        )  # both rows and the buttons in the ~770 px notebook area of a 1400 x 900 window
        assert smallest_text_px(fig, panel_module.IMAGE_DPI) >= 9, (
            image
        )  # shown at its own size (test_browser.py)
    layout = panel.mask_image.layout
    assert layout.width is None and layout.max_width == "100%" and layout.align_self == "flex-start"


def test_static_form_embeds_the_four_images_the_rows_text_and_the_ascii_masks(panel):
    html = panel.static().data
    assert html.count("data:image/png;base64,") == 4
    assert "uid 1 | . . . # # @" in html
    assert "uid 0 (0 tokens)" in html and "uid 1 (0 tokens)" in html


def test_a_stored_panel_shows_a_png_of_its_images_and_text_instead_of_the_widget_repr(panel):
    import base64

    data = panel._repr_mimebundle_()
    data = data[0] if isinstance(data, tuple) else data
    assert "application/vnd.jupyter.widget-view+json" in data  # JupyterLab with the kernel: the live widget
    png = base64.b64decode(data["image/png"])
    assert png.startswith(b"\x89PNG")
    assert "VBox" not in data["text/plain"] and data["text/plain"].startswith("engine now: step 0 · 2 row(s)")
    assert "uid 1 | . . . # # @" in data["text/plain"]


def test_the_panel_shows_each_rows_prompt_and_generated_text(panel):
    panel.buttons["Step"].click()
    text = panel.rows.value
    for uid in (0, 1):
        prompt = panel.sched.tokenizer.decode(list(panel.sched.request_of(uid).prompt_ids))
        assert f"uid {uid} (1 tokens)" in text and html_escape(one_line(prompt))[-8:] in text


def test_the_panel_draws_the_2d_mask_of_the_last_prefill_beside_the_decode_rows(panel):
    fm = panel.last_prefill(panel.shown.step)
    assert fm is not None and set(fm.uids) == {0, 1}
    fig = panel_module.prefill_figure(fm)
    assert [ax.get_title(loc="left") for ax in fig.axes[:2]] == ["row uid 0", "row uid 1"]


def test_after_reset_every_image_says_what_is_empty_with_no_bare_axes_or_negative_bytes(panel):
    panel.run_steps.value = 3
    panel.buttons["Run N steps"].click()
    panel.buttons["Reset"].click()
    for image, fig in panel.figures(panel.shown, list(panel.sched.history)).items():
        visible = [ax for ax in fig.axes if ax.axison]
        assert not visible, (image, [ax.get_ylim() for ax in visible])  # only the empty-state texts
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert texts and all(t for t in texts), image
    assert panel.rows.value == "<pre>no rows in the batch</pre>"


def test_the_kv_history_never_draws_negative_bytes_or_waste(panel):
    panel.run_steps.value = 2
    panel.buttons["Run N steps"].click()
    fig = views.render_kv(panel.shown, list(panel.sched.history), width_in=panel_module.IMAGE_WIDTH_IN)
    waste_ax, bytes_ax = fig.axes[-2:]
    assert waste_ax.get_ylim()[0] == 0 and bytes_ax.get_ylim()[0] == 0
    assert bytes_ax.get_ylabel() == "MiB"  # 1,310,720 bytes: MiB, not 1280 KiB


def test_restore_is_enabled_in_every_notebook_that_shows_the_panel():
    import nbformat

    shown = 0
    for path in sorted(NOTEBOOK.parent.glob("*.ipynb")):
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        if "views.Panel(" in code:
            shown += 1
            assert "history_checkpoints=" in code, path.name
    assert shown >= 2


def test_importing_workbench_and_its_views_does_not_import_ipywidgets():
    code = (
        "import sys, workbench as wb; wb.views.render_masks; "
        "assert 'ipywidgets' not in sys.modules, 'ipywidgets imported'; "
        "wb.views.Panel; assert 'ipywidgets' in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_the_teaching_notebook_exports_to_static_html_with_its_figures_and_no_widget_script():
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.metadata.kernelspec.name == "python3" and "widgets" not in nb.metadata
    html, _ = HTMLExporter().from_notebook_node(nb)
    assert html.count("data:image/png;base64,") >= 9  # 8 figures and the panel's static images
    assert "@jupyter-widgets/html-manager" not in html


def test_layer_lists_of_deep_models_are_written_as_ranges_and_short_ones_name_every_layer():
    from workbench.views.style import layer_list

    assert layer_list(["0", "1", "2", "3", "4"]) == "0,1,2,3,4"  # the tiny models' text stays as it was
    assert layer_list([str(i) for i in range(30)]) == "0-29"  # SmolLM2-135M's one group
    assert layer_list([str(i) for i in range(0, 30, 2)]) == ",".join(str(i) for i in range(0, 30, 2))
    assert layer_list([str(i) for i in range(12) if i not in (5, 9)]) == "0-4,6,7,8,10,11".replace(
        "6,7,8", "6-8"
    )


def test_mask_text_writes_a_deep_models_layer_list_as_a_range_and_keeps_short_lists():
    from dataclasses import replace

    snap = full_snapshot()
    deep = replace(snap, groups=(replace(snap.groups[0], layers=tuple(str(i) for i in range(30))),))
    assert "[full] layers 0-29, 4,096 bytes; KV width 3 tokens" in views.mask_text(deep)
    assert "[full] layers 0,1, 4,096 bytes" in views.mask_text(full_snapshot())


def test_admit_step_and_filter_with_nothing_to_do_say_so_and_the_next_action_clears_it(panel):
    panel.buttons["Admit"].click()
    assert panel.notice.value == "Admit: nothing to admit (the queue is empty; 2 row(s) running: press Step)."
    panel.buttons["Filter"].click()
    assert panel.notice.value == "Filter: no finished row to evict."
    panel.buttons["Step"].click()
    assert panel.notice.value == "" and panel.sched.step_index == 1
    panel.buttons["Reset"].click()
    panel.buttons["Step"].click()
    assert panel.notice.value == "Step: no running row to decode (submit a prompt, then Admit)."
    panel.buttons["Submit"].click()
    panel.buttons["Step"].click()
    assert panel.notice.value == "Step: no running row to decode (queue [0]: press Admit)."
    panel.buttons["Admit"].click()
    assert panel.notice.value == "" and panel.sched.snapshot().batch_size == 1


def test_the_notice_and_error_labels_take_no_room_until_they_say_something(panel):
    assert panel.notice.layout.display == "none" and panel.error.layout.display == "none"
    panel.buttons["Admit"].click()
    assert panel.notice.value and panel.notice.layout.display == ""
    panel.buttons["Step"].click()
    assert panel.notice.layout.display == "none"


def test_the_panel_prefill_image_of_a_long_prompt_stays_short():
    from workbench.observe.forward_masks import ForwardMask, causal_mask

    n = 40  # a chat prompt's prefill, one row
    fm = ForwardMask(
        "prefill uid 4: positions 0-39",
        (4,),
        causal_mask(n),
        0,
        np.zeros((1, n), bool),
        np.zeros((1, n), bool),
    )
    fig = panel_module.prefill_figure(fm)
    assert fig.get_figheight() * panel_module.IMAGE_DPI <= 340


def test_the_status_line_says_the_panel_is_busy_while_the_engine_runs_and_while_it_draws(panel, monkeypatch):
    seen = []
    step = panel.sched.step
    monkeypatch.setattr(
        panel.sched, "step", lambda *a, **k: (seen.append(panel.status.value), step(*a, **k))[1]
    )
    figures = panel.figures
    monkeypatch.setattr(panel, "figures", lambda *a: (seen.append(panel.status.value), figures(*a))[1])
    panel.buttons["Step"].click()
    assert seen[0].endswith(" — step running …") and seen[1].endswith(" — drawing step 1 …"), seen
    assert " — " not in panel.status.value and panel.status.value.startswith("engine now: step 1 ")


def test_render_mask_steps_draws_before_and_after_on_one_axis_so_compaction_shows_as_width():
    from workbench.views.mask import render_mask_steps

    before = full_snapshot(uids=(7, 9), left_padding=(0, 2), width=3)
    after = full_snapshot(uids=(9,), left_padding=(0,), width=1)
    fig = render_mask_steps([before, after], ["before filter()", "after filter()"])
    left, right = fig.axes[:2]
    assert left.get_title(loc="left") == "before filter()\nKV width 3 + fed column"
    assert right.get_title(loc="left") == "after filter()\nKV width 1 + fed column"
    assert left.get_xlim() == right.get_xlim() == (-3.5, 0.5)  # shared: the after panel is narrower
    assert right.images[0].get_array().tolist() == [[1, 2]]
    assert [t.get_text() for t in right.get_yticklabels()] == ["uid 9"]
    with pytest.raises(ValueError, match="at least one snapshot"):
        render_mask_steps([])


def test_a_tall_view_is_drawn_at_most_image_max_height_in_the_panel(panel, monkeypatch):
    """Many rows make a tall KV figure; the panel draws it at IMAGE_MAX_HEIGHT_IN, so the buttons
    and both rows of images stay in a 1400 x 900 window (the text keeps its size)."""
    monkeypatch.setattr(
        panel_module, "render_kv", lambda snap, history, width_in: Figure(figsize=(width_in, 5.0))
    )
    figures = panel.figures(panel.shown, list(panel.sched.history))
    assert figures[panel.kv_image].get_figheight() == panel_module.IMAGE_MAX_HEIGHT_IN
    assert all(f.get_figheight() <= panel_module.IMAGE_MAX_HEIGHT_IN for f in figures.values())


def test_a_panel_on_a_fork_that_keeps_checkpoints_can_restore_where_it_forked_and_not_its_latest_snapshot(
    make_sched, prompt
):
    sched = make_sched(max_batch=3, history_size=16)  # keeps no checkpoint itself
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=12))
    sched.admit()
    sched.step()
    live = sched.fork(history_checkpoints=4)
    panel = views.Panel(live, shown=0)
    assert panel.buttons["Restore"].disabled  # older than the fork: no checkpoint
    # its only checkpoint is the engine now's: the label says to act first, not "works from snapshot N"
    assert panel.slider_label.value.endswith(" · Restore greyed: no older checkpoint; act, then come back")
    assert "after your next action" in panel.buttons["Restore"].tooltip
    panel.slider.value = panel.slider.max  # the engine now: nothing to restore
    assert panel.buttons["Restore"].disabled
    assert panel.slider_label.value.endswith(" · the engine now: nothing to restore")
    assert panel.buttons["Restore"].tooltip == "the engine is at this snapshot: nothing to restore"
    start, tokens = len(live.history) - 1, live.tokens(0)
    panel.run_steps.value = 3
    panel.buttons["Run N steps"].click()
    panel.slider.value = start  # where the fork started
    assert not panel.buttons["Restore"].disabled
    panel.buttons["Restore"].click()
    assert live.step_index == 1 and live.tokens(0) == tokens and panel.error.value == ""
    assert panel.notice.value.startswith("Restore: restored step 1; ") and len(live.history) == start + 1


def test_after_reset_restore_is_disabled_as_there_is_nothing_to_restore(make_sched, prompt):
    sched = make_sched(max_batch=3, history_size=8, history_checkpoints=4)
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=12))
    panel = views.Panel(sched)
    panel.buttons["Reset"].click()
    assert len(panel.sched.history) == 1 and panel.buttons["Restore"].disabled
    assert panel.slider_label.value.startswith("showing: snapshot 1 of 1 (step 0) · ")


def test_a_chat_requests_row_shows_its_last_user_message_not_the_chat_templates_tail():
    from workbench.views.panel import shown_prompt

    class Valid:  # what the panel reads of a validated request
        def __init__(self, **request):
            self.request = wb.Request(max_tokens=2, **request)
            self.prompt_ids = (5, 6)

    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ]
    assert shown_prompt(Valid(messages=chat), lambda ids: "<|im_start|>assistant") == "And of Italy?"
    assert shown_prompt(Valid(prompt=[5, 6]), lambda ids: f"decoded {ids}") == "decoded [5, 6]"


def test_the_panel_takes_its_prompt_boxs_initial_text_and_submits_it_as_a_user_message_when_chat(
    make_sched, monkeypatch
):
    panel = views.Panel(make_sched(max_batch=2), prompt="What color is the sky?", chat=True)
    assert panel.prompt.value == "What color is the sky?"
    sent = []
    monkeypatch.setattr(panel.sched, "submit", lambda request: sent.append(request))
    panel.buttons["Submit"].click()
    assert (
        sent[0].messages == [{"role": "user", "content": "What color is the sky?"}] and sent[0].prompt is None
    )


def _two_rows(make_sched, prompt, lengths=(5, 2)):
    """A scheduler with one admitted row per prompt length (left padding: their difference)."""
    sched = make_sched(max_batch=3, history_size=8)
    for i, n in enumerate(lengths):
        sched.submit(wb.Request(prompt=prompt(n, 40 * i), max_tokens=12))
    sched.admit()
    return sched


def _legend_texts(fig):
    return [t.get_text() for t in fig.legends[0].get_texts()]


def test_the_mask_legends_list_only_the_kinds_of_cell_drawn_and_name_them_alike_at_both_widths(
    make_sched, prompt
):
    padded = _two_rows(make_sched, prompt).snapshot()
    assert _legend_texts(views.render_masks(padded))[0] == "masked (padding)"  # no window: no "expired"
    assert _legend_texts(views.render_masks(padded, width_in=4.7))[0] == "masked (padding)"  # the Panel's
    alone = _two_rows(make_sched, prompt, (5,)).snapshot()  # one row: nothing masked
    assert not any(t.startswith("masked") for t in _legend_texts(views.render_masks(alone)))


def test_the_kv_legend_lists_only_the_segments_present_and_a_cut_axis_is_marked(make_sched, prompt):
    sched = _two_rows(make_sched, prompt)
    fig = views.render_kv(sched.snapshot(), list(sched.history))
    assert _legend_texts(fig) == ["padding", "valid", "unused"]  # full attention: no expired slot
    bars = fig.axes[0]
    assert bars.get_xlabel() == "tokens per row (stacked: padding, valid, unused)"
    cut = int(bars.get_xlim()[1])
    assert bars.get_title(loc="left").endswith(f"(axis cut at {cut})") and cut < 256
    assert [t.get_text() for t in bars.texts].count("//") == 2  # a break mark on each row's bar


def test_a_just_joined_row_has_a_step_of_room_right_of_its_join_mark(make_sched, prompt):
    sched = _two_rows(make_sched, prompt)
    sched.step()
    sched.step()
    sched.submit(wb.Request(prompt=prompt(3, 90), max_tokens=4))
    sched.admit()  # joins at step 2; its first token comes with step 2's forward
    ax = views.render_timeline(sched.report().events, x="step", width_in=4.7).axes[0]
    assert ax.get_xlim()[1] >= 3
