"""The HTML replay (views.export): one self-contained file per run, its frames and images,
the ``replay-html`` command, and in Debian's Chromium (file://, no server) the play button
and the slider change the shown step and images."""

from __future__ import annotations

import io
import json
import os
import re

import pytest
from PIL import Image

import workbench as wb
from tests.conftest import FakeClock
from workbench.cli import build_parser, main
from workbench.observe.events import events_frame
from workbench.views.export import export_html
from workbench.views.live import events_seen, ttft_parts, waiting_uids
from workbench.workloads import workload as workload_module
from workbench.workloads.workload import prompt_maker


@pytest.fixture(scope="module")
def run(bundled):
    """Three requests through two rows of the bundled model (a fake clock), every snapshot kept."""
    model, tokenizer = bundled
    prompt = prompt_maker(tokenizer)
    sched = wb.Scheduler(model, tokenizer, max_batch=2, history_size=1000, clock=FakeClock(0.001))
    arrivals = [
        (0, wb.Request(prompt=prompt(5), max_tokens=2)),
        (0, wb.Request(prompt=prompt(3, 40), max_tokens=4)),
    ]
    sched.run(arrivals + [(1, wb.Request(prompt=prompt(9, 80), max_tokens=2))])
    return sched


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    """The run exported once for the module's tests."""
    return export_html(run, tmp_path_factory.mktemp("replay") / "sub" / "replay.html", title="three requests")


def page_data(path) -> tuple[str, list[str], list[dict], dict]:
    text = path.read_text()
    data = {
        name: json.loads(re.search(rf"const {name} = (.*);\n", text).group(1))
        for name in ("IMAGES", "FRAMES", "WIDE")
    }
    return text, data["IMAGES"], data["FRAMES"], data["WIDE"]


def test_a_run_exports_one_frame_per_snapshot_with_embedded_pngs_and_nothing_outside(run, exported):
    text, images, frames, wide = page_data(exported)
    history = list(run.history)
    assert len(frames) == len(history) > 6
    for i, (frame, snap) in enumerate(zip(frames, history)):
        assert frame["step"] == snap.step
        assert frame["status"].startswith(f"snapshot {i + 1} of {len(history)} · step {snap.step} · ")
    assert all(uri.startswith("data:image/png;base64,") for uri in images)
    for i, uri in enumerate(images):
        png = Image.open(io.BytesIO(__import__("base64").b64decode(uri.split(",", 1)[1])))
        wide_in = 2 * 4.7 if i == wide["timeline"]["image"] else 4.7  # the timeline: step and wall axes
        assert png.format == "PNG" and png.mode == "P" and png.width == round(wide_in * 90)
    assert not re.search(r"(src|href)=\"(?!data:)", text) and "<link" not in text and "http" not in text
    assert {name: len(w["veils"]) for name, w in wide.items()} == {"timeline": 2, "rates": 1, "itl": 1}
    assert len(images) == len(set(images))  # every image once, however many frames show it
    assert text.count("<script>") == 1 and "<h2>three requests</h2>" in text


def test_a_frames_ttft_image_changes_only_when_a_first_token_lands_or_a_request_arrives(run, exported):
    _, _, frames, _ = page_data(exported)
    ev = events_frame(run.events)
    seen = [events_seen(ev, s) for s in run.history]
    drawn = [(len(ttft_parts(e)), tuple(waiting_uids(e))) for e in seen]
    for i in range(1, len(frames)):
        assert (frames[i]["ttft"] == frames[i - 1]["ttft"]) == (drawn[i] == drawn[i - 1]), i
    assert len({f["ttft"] for f in frames}) == len(set(drawn)) < len(frames)
    assert frames[-1]["text"].startswith("uid   TTFT ms")


def test_a_frames_latency_text_names_the_rows_it_shows_before_their_first_token(run, exported):
    """Issue 43's replay of notebook 01 read "(no request yet)" at its first frame beside a
    status of "1 row(s): uid 0": a request the snapshot holds is waiting, never absent."""
    _, _, frames, _ = page_data(exported)
    ev = events_frame(run.events)
    for frame, snap in zip(frames, run.history):
        tokened = set(ev.uid[(ev.kind == "token") & (ev.step < snap.step)])
        held = {u for u in [*snap.uids, *snap.queue, *(p[0] for p in snap.prefilling)] if u not in tokened}
        waiting = re.search(r"waiting: uid ([\d, ]+)", frame["text"])
        assert ({int(u) for u in waiting.group(1).split(",")} if waiting else set()) == held, frame["status"]
        assert ("(no request yet)" in frame["text"]) == (not held and not tokened), frame["status"]
    assert "waiting: uid 0, 1" in frames[0]["text"]


def test_the_veil_of_a_step_sits_on_that_step_of_the_whole_run_figures(exported):
    _, _, frames, wide = page_data(exported)
    for name, w in wide.items():
        for j, v in enumerate(w["veils"]):
            last = max(f["at"][name][j] for f in frames)
            assert 0 < v["x0"] < v["right"] <= 1 and 0 <= v["top"] < v["bottom"] <= 1, name
            assert v["x0"] + last * v["dx"] < v["right"] + 1e-6, name  # the last frame still inside the axes
    assert all(f["at"]["rates"] == f["at"]["itl"] == [f["step"]] for f in frames)
    step_veil, time_veil = wide["timeline"]["veils"]  # side by side: the step axis, then the wall axis
    assert step_veil["right"] < time_veil["x0"]


def test_the_replay_timeline_unveils_each_phase_as_the_snapshot_that_saw_it(run, exported):
    """The replay's timeline is the phases view (a prefill as wide as its tokens, issue 43);
    its veil follows the snapshots call by call: a snapshot after an admit shows that step's
    prefill phase, the one before it at the same step does not."""
    from workbench.views.follow import seen_by
    from workbench.views.phases import step_phases

    _, _, frames, _ = page_data(exported)
    ev = events_frame(run.events)
    phases = step_phases(ev)
    cuts = [f["at"]["timeline"] for f in frames]
    assert cuts == sorted(cuts)  # the unveiled part only grows as the run plays
    ends = phases.step_left + phases.step_width
    assert cuts[-1] == [float(ends.max()), pytest.approx(float((phases.time_left + phases.time_width).max()))]
    assert ends.max() > (ev.kind == "token").sum()  # the step axis counts prompt tokens, not only steps
    grew_within_a_step = 0
    for i in range(1, len(frames)):
        snap, prev = run.history[i], run.history[i - 1]
        seen = ev[seen_by(ev, snap)]
        fed = (
            phases[phases.step.isin(seen.step[seen.kind == "token"])].decode_tokens.sum()
            + phases[phases.step.isin(seen.step[seen.kind.isin(["prefill", "join"])])].prefill_tokens.sum()
        )
        assert cuts[i][0] == fed, i  # the step axis unveiled: exactly the tokens the snapshot had seen fed
        grew_within_a_step += int(snap.step == prev.step and cuts[i][0] > cuts[i - 1][0])
    assert grew_within_a_step > 0  # an admit's prefill unveiled by the snapshot after it, at the same step


def test_export_html_refuses_a_run_without_snapshots_or_events(make_sched, tmp_path, prompt):
    with pytest.raises(ValueError, match="history_size=N"):
        export_html(make_sched(history_size=0), tmp_path / "x.html")
    sched = make_sched(max_batch=2)
    sched.submit(wb.Request(prompt=prompt(3), max_tokens=2))
    sched.admit()
    with pytest.raises(ValueError, match="events is required"):
        export_html(list(sched.history), tmp_path / "x.html")
    with pytest.raises(TypeError, match="list of Snapshots"):
        export_html([1, 2], tmp_path / "x.html", events=sched.events)
    assert export_html(list(sched.history), tmp_path / "y.html", events=sched.events).exists()


def test_the_replay_html_command_writes_the_tour_and_says_its_size(tmp_path, monkeypatch, capsys):
    tour = workload_module.demo_workload
    monkeypatch.setattr(workload_module, "demo_workload", lambda tok, cap=None: tour(tok, 2)[:2])
    assert build_parser().parse_args(["replay-html"]).out == "workbench-out"
    assert main(["replay-html", "--out", str(tmp_path), "--layout", "packed", "--max-batch", "2"]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(rf"wrote {tmp_path}/replay-packed.html \(\d+\.\d MiB, \d+ snapshots\)\n", out), out
    text, _, frames, _ = page_data(tmp_path / "replay-packed.html")
    assert "tour workload, packed" in text and len(frames) > 3


# -- in a real browser ---------------------------------------------------------------------
@pytest.mark.browser
def test_the_replay_plays_and_scrubs_in_chromium_from_a_file(run, exported, tmp_path):
    from tests.browser_lab import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        message = "Debian's chromium is missing: run `apt-get install -y chromium` (.ci/run does)"
        if os.environ.get("WORKBENCH_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    path, n = exported, len(run.history)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})
            page.route(
                "**/*",
                lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort(),
            )
            page.goto(path.as_uri())
            label, mask = page.locator("#label"), page.locator("#mask")
            veil = page.locator("#timeline-veil-0")
            assert label.inner_text().startswith(f"snapshot 1 of {n} · step 0")
            first_src, first_veil = mask.get_attribute("src"), veil.evaluate("v => v.style.left")
            page.click("#play")
            page.wait_for_function("() => +document.getElementById('slider').value >= 3", timeout=10_000)
            assert page.locator("#play").inner_text().endswith("pause")
            assert re.match(rf"snapshot \d+ of {n} · step \d+", label.inner_text())
            page.wait_for_function(
                f"() => +document.getElementById('slider').value === {n - 1}", timeout=5_000 + 600 * n
            )
            assert page.locator("#play").inner_text().endswith("play")  # stopped at the last frame
            last = label.inner_text()
            assert last.startswith(f"snapshot {n} of {n} · step {run.history[-1].step}")
            assert mask.get_attribute("src") != first_src
            assert veil.evaluate("v => v.style.left") != first_veil
            wall = page.locator("#timeline-veil-1").evaluate("v => parseFloat(v.style.width)")
            assert wall < 1  # the last frame had seen every phase: the wall axis unveiled
            width = page.locator("#timeline").evaluate("i => i.getBoundingClientRect().width")
            assert width == pytest.approx(2 * 4.7 * 90, abs=1)  # both axes, shown at the PNG's own size
            page.screenshot(path=str(tmp_path / "replay_end.png"))
            page.locator("#slider").focus()
            page.keyboard.press("Home")
            page.keyboard.press("ArrowRight")
            page.keyboard.press("ArrowRight")
            assert label.inner_text().startswith(f"snapshot 3 of {n} · step {run.history[2].step}")
            assert page.locator("#text").inner_text().startswith("uid   TTFT ms")
            frame_2 = page_data(path)[2][2]
            assert mask.get_attribute("src") == page_data(path)[1][frame_2["mask"]]
        finally:
            browser.close()
