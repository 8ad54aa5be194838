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


def test_a_full_bar_is_num_draft_tokens_and_tokens_per_forward_sit_after_the_rate_bar():
    fig = render_drafts(hand_events(), num_draft_tokens=8)
    lanes, rates = fig.axes
    assert "a box holds 8 drafts" in lanes.get_title(loc="left")
    assert round(lanes.patches[0].get_height(), 3) == round(4 / 8 * 0.8, 3)  # uid 0 accepted 4 at step 0
    labels = {t.get_text(): t.get_position()[0] for t in rates.texts}
    assert labels == {"2.75 tok/fwd": pytest.approx(7 / 11 + 0.04), "1.25 tok/fwd": pytest.approx(0.29)}
    assert all(x > p.get_width() for x, p in zip(labels.values(), rates.patches))  # outside the 0-1 bar
    assert not rates.yaxis.get_major_ticks()[0].tick1line.get_visible()  # no tick before a label


def test_each_step_draws_its_capacity_as_an_outlined_box_filled_from_its_bottom():
    fig = render_drafts(hand_events(), num_draft_tokens=4)
    lanes = fig.axes[0]
    boxes = [p for p in lanes.patches if not p.get_fill()]
    assert len(boxes) == 2 * 4  # every step of both uids, the steps that drafted nothing too
    assert {round(p.get_height(), 3) for p in boxes} == {0.8}  # the full bar height: 4 drafts
    uid0 = sorted((p for p in boxes if p.get_y() < 0.5), key=lambda p: p.get_x())
    accepted = lanes.patches[:4]  # uid 0's accepted bars: 4, 2, 1, 0 of 4
    for box, bar in zip(uid0, accepted):  # the fill starts at the box's bottom (y grows downward)
        assert round(bar.get_y() + bar.get_height(), 3) == round(box.get_y() + box.get_height(), 3)
    assert [round(p.get_height() / 0.8, 3) for p in accepted] == [1.0, 0.5, 0.25, 0.0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[-1] == "no draft fed (of 4 per step)"


def test_the_figure_fits_a_jupyterlab_output_area_at_100_percent():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = render_drafts(hand_events(), title="drafts")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    # the inline backend saves the tight box at 100 dpi; wider than the 968 px output area, it is scaled down
    assert fig.get_tightbbox(canvas.get_renderer()).width * 100 <= 968


def test_at_the_panels_width_every_label_and_legend_entry_stays_inside_the_image():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = render_drafts(hand_events(), width_in=4.7, height_in=2.5, last_steps=4, num_draft_tokens=16)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    texts = [a.xaxis.label for a in fig.axes] + list(fig.legends[0].get_texts())
    assert all(
        0 <= t.get_window_extent(renderer).x0 and t.get_window_extent(renderer).x1 <= 470 for t in texts
    ), [(t.get_text(), t.get_window_extent(renderer).x0, t.get_window_extent(renderer).x1) for t in texts]


def test_the_latest_steps_window_shows_the_last_steps_with_their_step_numbers():
    assert drafts_text(hand_events(), last_steps=2).splitlines() == [
        "4 steps (steps 2-3 shown), 8/15 draft tokens accepted (53%), 4.50 tokens per forward over the batch",
        "uid 0 | +--- .    | 7/11 accepted (64%), 2.75 tokens/forward",
        "uid 1 | ---  +    | 1/4 accepted (25%), 1.25 tokens/forward",
    ]
    with pytest.raises(ValueError, match="last_steps must be >= 1"):
        drafts_text(hand_events(), last_steps=0)
    lanes = render_drafts(hand_events(), last_steps=2, width_in=4.7, height_in=2.5).axes[0]
    accepted = lanes.patches[:2]  # uid 0's accepted bars at steps 2 and 3 (of 4 per step)
    assert [round(p.get_x() + p.get_width() / 2, 3) for p in accepted] == [2.0, 3.0]
    assert [round(p.get_height(), 3) for p in accepted] == [0.2, 0.0]


# -- in the live Panel -------------------------------------------------------------------
CODE = "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return"  # repeated: drafts accepted and rejected


def signs(text: str, uid: int) -> tuple[int, int]:
    """``(+, -)`` cells of ``uid``'s line in a draft text form (0, 0 when it has none)."""
    line = next((ln for ln in text.splitlines() if ln.startswith(f"uid {uid} |")), "uid | |")
    cells = line.split(" | ")[1]
    return cells.count("+"), cells.count("-")


def drafted_up_to(sched, uid: int, step: int) -> tuple[int, int]:
    """``(accepted, rejected)`` draft tokens of ``uid`` in decode steps before ``step``,
    from the engine's ``draft`` events."""
    ev = [e for e in sched.events if e.kind == "draft" and e.uid == uid and e.step < step]
    accepted = sum(e.n_accepted for e in ev)
    return accepted, sum(e.n_tokens for e in ev) - accepted


def test_the_panel_shows_each_rows_drafts_while_speculating_and_follows_the_steps_and_the_slider(
    make_sched,
):
    pytest.importorskip("ipywidgets")
    import workbench as wb
    from workbench import views
    from workbench.views import panel as panel_module
    from workbench.views.style import smallest_text_px

    sched = make_sched(max_batch=2, history_size=32, speculative="prompt-lookup", num_draft_tokens=16)
    greedy = sched.submit(wb.Request(prompt=CODE * 2, max_tokens=12))
    no_drafts = sched.submit(wb.Request(prompt=CODE * 2, max_tokens=12, top_logprobs=2))  # takes none
    panel = views.Panel(sched)
    assert panel.drafts_box.layout.display == "" and "no draft tokens" in panel.drafts_ascii.value
    panel.buttons["Admit"].click()
    seen = []
    for _ in range(5):
        panel.buttons["Step"].click()
        step = panel.shown.step
        assert signs(panel.drafts_ascii.value, greedy) == drafted_up_to(sched, greedy, step)
        assert signs(panel.drafts_ascii.value, no_drafts) == (0, 0)
        seen.append(drafted_up_to(sched, greedy, step))
    assert seen[-1][0] > seen[0][0] and seen[-1][1] > 0, f"accepted and rejected drafts as it stepped: {seen}"
    figures = panel.figures(panel.shown, list(sched.history))
    drafts = figures[panel.drafts_image]
    assert [t.get_text() for t in drafts.axes[0].get_yticklabels()] == [f"uid {greedy}"]
    assert "a box holds 16 drafts" in drafts.axes[0].get_title(loc="left")  # the scheduler's num_draft_tokens
    assert drafts.get_figwidth() * panel_module.IMAGE_DPI <= 470
    assert drafts.get_figheight() * panel_module.IMAGE_DPI <= 340
    assert smallest_text_px(drafts, panel_module.IMAGE_DPI) >= 9
    assert bytes(panel.drafts_image.value).startswith(b"\x89PNG")
    assert panel.static().data.count("data:image/png;base64,") == 5 and "accepted" in panel.static().data
    history = list(sched.history)
    panel.slider.value = max(i for i, s in enumerate(history) if s.step == sched.step_index - 1)
    assert panel.shown.step == sched.step_index - 1  # back one step: the view shows that snapshot's drafts
    assert signs(panel.drafts_ascii.value, greedy) == drafted_up_to(sched, greedy, panel.shown.step)


def test_a_panel_on_a_scheduler_that_does_not_speculate_hides_the_draft_view(make_sched):
    pytest.importorskip("ipywidgets")
    import workbench as wb
    from workbench import views

    sched = make_sched(max_batch=2, history_size=8)
    sched.submit(wb.Request(prompt=CODE * 2, max_tokens=4))
    panel = views.Panel(sched)
    panel.buttons["Admit"].click(), panel.buttons["Step"].click()
    assert panel.drafts_box.layout.display == "none" and panel.drafts_ascii.value == ""
    assert panel.drafts_image not in panel.figures(panel.shown, list(sched.history))
    assert panel.static().data.count("data:image/png;base64,") == 4
