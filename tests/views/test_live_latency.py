"""The live latency views (views.live) and the panel's latency view: exact values on a
hand-written log, and on a live scheduler the plotted TTFT, ITL and per-step rates equal an
independent computation from the raw event list, step by step and after moving the slider
back."""

from __future__ import annotations

import html
import re
from collections import Counter, defaultdict

import numpy as np
import pytest

import workbench as wb
from workbench import views
from workbench.observe.events import Event, events_frame
from workbench.observe.metrics import request_metrics
from workbench.views import live
from workbench.views import panel as panel_module
from workbench.views.style import smallest_text_px


@pytest.fixture
def log():
    """Two requests decode (uid 0: 3 tokens, uid 1: 2), a third is submitted and waits.

    uid 0: submit 0.0, admit 1.5, join 1.8, tokens 2.0 (step 0), 3.0, 4.0 s.
    uid 1: submit 1.0, admit 1.5, join 1.8, tokens 2.0 (step 0), 3.0 s.
    Step 0 ran prefill chunks of 3 + 1 prompt tokens.
    """
    return events_frame(
        [
            Event("submit", 0, 0, 0.0, n_tokens=4),
            Event("submit", 1, 0, 1.0, n_tokens=2),
            Event("admit", 0, 0, 1.5, n_tokens=4),
            Event("admit", 1, 0, 1.5, n_tokens=2),
            Event("prefill", 0, 0, 1.7, n_tokens=3),
            Event("prefill", 1, 0, 1.7, n_tokens=1),
            Event("join", 0, 0, 1.8, row=0),
            Event("join", 1, 0, 1.8, row=1),
            Event("token", 0, 0, 2.0, row=0, token=5),
            Event("token", 1, 0, 2.0, row=1, token=6),
            Event("submit", 2, 1, 2.5, n_tokens=3),
            Event("token", 0, 1, 3.0, row=0, token=7),
            Event("token", 1, 1, 3.0, row=1, token=8),
            Event("finish", 1, 1, 3.0, row=1, finish_reason="length"),
            Event("evict", 1, 2, 3.5, row=1),
            Event("token", 0, 2, 4.0, row=0, token=9),
        ]
    )


def test_ttft_parts_add_up_to_the_ttft_of_request_metrics(log):
    parts = live.ttft_parts(log)
    assert parts.uid.tolist() == [0, 1]
    assert parts.queued_s.tolist() == [1.5, 0.5]
    assert parts.prefill_s.tolist() == pytest.approx([0.3, 0.3])
    assert parts.first_token_s.tolist() == pytest.approx([0.2, 0.2])
    ttft = request_metrics(log).set_index("uid").ttft_s
    assert parts.ttft_s.tolist() == [ttft[0], ttft[1]] == [2.0, 1.0]
    assert (parts.queued_s + parts.prefill_s + parts.first_token_s).tolist() == pytest.approx([2.0, 1.0])
    assert parts.first_token_step.tolist() == [0, 0]
    assert live.waiting_uids(log) == [2]


def test_step_rates_count_decode_and_prefill_tokens_over_the_steps_wall_time(log):
    rates = live.step_rates(log)
    assert rates.step.tolist() == [0, 1, 2]
    assert rates.decode_tokens.tolist() == [2, 2, 1] and rates.prefill_tokens.tolist() == [4, 0, 0]
    assert rates.wall_s.tolist() == [0.5, 1.0, 1.0]  # the first step from its first admit (1.5 s)
    assert rates.decode_tok_per_s.tolist() == [4.0, 2.0, 1.0]
    assert rates.prefill_tok_per_s.tolist() == [8.0, 0.0, 0.0]


def test_itl_cells_put_each_gap_at_the_step_of_its_later_token(log):
    cells = live.itl_cells(log)
    assert cells.values.tolist() == [[0, 1, 1.0], [0, 2, 1.0], [1, 1, 1.0]]


def test_events_before_a_step_keep_only_the_steps_completed_by_then(log):
    cut = live.events_before(log, 1)
    assert set(cut.step) == {0} and live.ttft_parts(cut).uid.tolist() == [0, 1]
    assert live.itl_cells(cut).empty and live.waiting_uids(cut) == []


def test_live_latency_text_of_the_log_is_exact(log):
    assert live.live_latency_text(log) == "\n".join(
        [
            "uid   TTFT ms = queued + prefill + 1st tok | ITL ms p50     max gaps",
            "  0    2000.0 = 1500.0 +   300.0 +   200.0 |     1000.0  1000.0    2",
            "  1    1000.0 =  500.0 +   300.0 +   200.0 |     1000.0  1000.0    1",
            "waiting: uid 2",
            "step 2: 1 decode + 0 prefill tokens in 1000.0 ms: 1.0 + 0.0 tok/s",
        ]
    )
    assert live.live_latency_text(log.iloc[:0]) == (
        "uid   TTFT ms = queued + prefill + 1st tok | ITL ms p50     max gaps\n(no request yet)"
    )


def test_the_module_docstring_shows_the_text_form_of_the_log(log):
    for line in live.live_latency_text(log).splitlines():
        assert f"    {line}\n" in live.__doc__, line


def test_the_three_figures_draw_the_logs_values(log):
    values = plotted(
        {"ttft": live.render_ttft(log), "itl": live.render_itl(log), "rates": live.render_step_rates(log)}
    )
    assert values["ttft"] == pytest.approx({0: 2000.0, 1: 1000.0})
    assert values["queued"] == pytest.approx({0: 1500.0, 1: 500.0})
    assert values["itl"] == pytest.approx({(0, 1): 1000.0, (0, 2): 1000.0, (1, 1): 1000.0})
    assert values["decode"] == pytest.approx({0: 4.0, 1: 2.0, 2: 1.0})
    assert values["prefill"] == pytest.approx({0: 8.0})  # a rate of 0 is not drawn on the log axis
    assert values["wall"] == pytest.approx({0: 500.0, 1: 1000.0, 2: 1000.0})


def test_the_figures_say_what_is_empty_with_no_bare_axes():
    empty = events_frame([])
    for fig in (live.render_ttft(empty), live.render_itl(empty), live.render_step_rates(empty)):
        assert all(not ax.axison for ax in fig.axes) and any(ax.texts for ax in fig.axes)
        said = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
        assert not re.search(r"[Ss]ubmit|[Aa]dmit|\bStep\b", said), said  # the replay has no buttons


def test_render_live_latency_draws_the_three_views_side_by_side(log):
    fig = live.render_live_latency(log)
    assert fig.get_figwidth() <= 9.4 and len(fig.subfigs) == 3
    assert [sub.get_suptitle() for sub in fig.subfigs] == [
        "TTFT per row (ms) · waiting: 2",
        "ITL per row and step (ms)",
        "tok/s per step, wall time",
    ]


# -- reading a figure back ---------------------------------------------------------------
def _uid(label: str) -> int:
    return int(label.get_text().split()[1])


def plotted(figs: dict) -> dict:
    """What the figures draw: TTFT and its queued part per uid (bar widths, ms), ITL per
    (uid, step) (the image's cells, ms), decode / prefill tok/s and wall ms per step."""
    figs = {k: f for k, f in figs.items() if f.axes[0].axison}  # an empty state draws nothing
    out = {}
    if "ttft" in figs:
        ax = figs["ttft"].axes[0]
        uids = [_uid(t) for t in ax.get_yticklabels()]
        widths = np.array([[p.get_width() for p in c] for c in ax.containers])
        out["ttft"] = dict(zip(uids, widths.sum(axis=0)))
        out["queued"] = dict(zip(uids, widths[0]))
    if "itl" in figs:
        ax = figs["itl"].axes[0]
        uids = [_uid(t) for t in ax.get_yticklabels()]
        grid = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
        first = int(ax.images[0].get_extent()[0])
        out["itl"] = {
            (uids[r], first + c): grid[r, c] for r, c in zip(*np.nonzero(np.isfinite(grid)))
        }  # fmt: skip
    if "rates" in figs:
        rate_ax, wall_ax = figs["rates"].axes[:2]
        for line in rate_ax.get_lines():
            out[line.get_label()] = {int(x - 0.5): y for x, y in zip(line.get_xdata(), line.get_ydata())}
        out["wall"] = {int(p.get_x() + p.get_width() / 2 - 0.5): p.get_height() for p in wall_ax.patches}
    return out


def expected(events: list[Event], step: int) -> dict:
    """The same values computed straight from the raw event list, for the snapshot taken
    after ``step`` decode steps (events of steps before it)."""
    seen = [e for e in events if e.step < step]
    submit, admit, first, last = {}, {}, {}, {}
    ends, tokens, prefill = {}, Counter(), Counter()
    itl = defaultdict(float)
    for e in seen:
        if e.kind == "submit":
            submit.setdefault(e.uid, e.time_s)
        elif e.kind == "admit":
            admit.setdefault(e.uid, e.time_s)
        elif e.kind == "prefill":
            prefill[e.step] += e.n_tokens
        elif e.kind == "token":
            first.setdefault(e.uid, e.time_s)
            if e.uid in last:
                itl[e.uid, e.step] = max(itl[e.uid, e.step], (e.time_s - last[e.uid]) * 1e3)
            last[e.uid] = e.time_s
            ends[e.step] = e.time_s
            tokens[e.step] += 1
    steps = sorted(ends)
    start = min((e.time_s for e in seen if e.kind == "admit" and e.step == steps[0]), default=None)
    wall = {s: ends[s] - (ends[p] if p is not None else start) for p, s in zip([None, *steps], steps)}
    return {
        "ttft": {u: (t - submit[u]) * 1e3 for u, t in first.items()},
        "queued": {u: (admit[u] - submit[u]) * 1e3 for u in first},
        "itl": dict(itl),
        "decode": {s: tokens[s] / wall[s] for s in steps},
        "prefill": {s: prefill[s] / wall[s] for s in steps if prefill[s]},
        "wall": {s: w * 1e3 for s, w in wall.items()},
    }


def assert_matches(values: dict, want: dict) -> None:
    for key, series in want.items():
        assert values.get(key, {}).keys() == series.keys(), key
        assert values.get(key, {}) == pytest.approx(series), key


# -- the panel ---------------------------------------------------------------------------
@pytest.fixture
def latency_panel(make_sched, prompt, fake_clock_class):
    """A panel on two rows of the bundled model (a fake clock: 1 ms a read), a third request
    queued until a row finishes, showing its latency view; it records the figures it draws."""
    sched = make_sched(max_batch=2, history_size=32, clock=fake_clock_class(0.001))
    for n, start, max_tokens in ((5, 0, 3), (3, 40, 8), (4, 80, 4)):
        sched.submit(wb.Request(prompt=prompt(n, start), max_tokens=max_tokens))
    panel = views.Panel(sched)
    drawn = []
    draw = panel.latency_figures

    def recording(snap):
        figures = draw(snap)
        drawn.append((snap, figures))
        return figures

    panel.latency_figures = recording
    panel.view.value = "latency"
    panel.drawn = drawn
    return panel


def last_drawn(panel) -> tuple:
    snap, figures = panel.drawn[-1]
    names = {panel.ttft_image: "ttft", panel.itl_image: "itl", panel.rates_image: "rates"}
    return snap, plotted({names[image]: fig for image, fig in figures.items()})


def test_the_latency_view_follows_the_engine_step_by_step_and_the_slider_back(latency_panel):
    panel = latency_panel
    panel.buttons["Admit"].click()
    images = []
    for _ in range(6):  # uid 0 finishes at step 2; Run N steps admits uid 2 into its row
        panel.run_steps.value = 1
        panel.buttons["Run N steps"].click()
        snap, values = last_drawn(panel)
        assert snap is panel.sched.history[-1] and snap.step == panel.sched.step_index
        assert_matches(values, expected(panel.sched.events, snap.step))
        images.append(bytes(panel.ttft_image.value) + bytes(panel.rates_image.value))
        assert panel.latency_ascii.value.startswith("<pre")
    assert len(set(images)) == len(images)  # every step drew new figures
    assert set(values["ttft"]) == {0, 1, 2} and values["queued"][2] > 0  # uid 2 waited for a row
    assert max(values["prefill"]) > 0  # uid 2's prefill ran between two decode steps
    latest = bytes(panel.itl_image.value)
    for back in (3, 5):
        panel.slider.value = panel.slider.max - back
        snap, values = last_drawn(panel)
        assert snap is panel.shown and snap.step < panel.sched.step_index
        assert_matches(values, expected(panel.sched.events, snap.step))
        assert bytes(panel.itl_image.value) != latest
    assert 2 not in values["ttft"]  # moved back before uid 2's first token: no bar for it


def test_requests_the_shown_snapshot_holds_are_waiting_until_their_first_token(latency_panel):
    """Before the first step the panel's latency text read "(no request yet)" while its rows
    listed the submitted requests (issue 43, checked in JupyterLab): they are waiting."""
    panel = latency_panel

    def said() -> tuple[str, str]:
        _, figures = panel.drawn[-1]
        return panel.latency_ascii.value, figures[panel.ttft_image]._suptitle.get_text()

    text, title = said()
    assert "waiting: uid 0, 1, 2" in text and "no request yet" not in text
    assert title.endswith("waiting: 0, 1, 2")
    panel.buttons["Admit"].click()  # uids 0 and 1 join, before their first token; uid 2 queued
    assert "waiting: uid 0, 1, 2" in said()[0]
    panel.buttons["Step"].click()
    text, title = said()
    assert html.escape(panel_module.BY_HAND) in text  # a step clicked: its wall time has the pause
    assert "waiting: uid 2" in text and "waiting" in title and "0" not in title.split("waiting")[1]


def test_the_latency_view_is_drawn_only_while_shown_and_the_batch_view_comes_back(latency_panel):
    panel = latency_panel
    assert panel.batch_box.layout.display == "none" and panel.latency_box.layout.display == ""
    n = len(panel.drawn)
    panel.view.value = "batch"
    panel.buttons["Admit"].click()
    panel.buttons["Step"].click()
    assert len(panel.drawn) == n  # not drawn while hidden
    assert panel.batch_box.layout.display == "" and panel.latency_box.layout.display == "none"
    assert panel.status.value.startswith("engine now: step 1 ")
    panel.view.value = "latency"
    snap, values = last_drawn(panel)
    assert snap.step == 1 and values["ttft"].keys() == {0, 1}
    assert [bytes(w.value)[:4] for w in panel._images()] == [b"\x89PNG"] * 3


def test_the_latency_images_fit_the_panels_grid_with_text_of_at_least_9_px(latency_panel):
    panel = latency_panel
    panel.buttons["Admit"].click()
    panel.run_steps.value = 4
    panel.buttons["Run N steps"].click()
    _, figures = panel.drawn[-1]
    assert len(figures) == 3
    for image, fig in figures.items():
        assert 2 * fig.get_figwidth() * panel_module.IMAGE_DPI + 16 <= 968, image
        assert fig.get_figheight() <= panel_module.IMAGE_MAX_HEIGHT_IN, image
        assert smallest_text_px(fig, panel_module.IMAGE_DPI) >= 9, image
    assert panel.latency_ascii.layout.max_height == "260px"
