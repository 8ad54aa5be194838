"""``wb.views.Panel(server)``: the Panel follows a served engine while a client loads it, reads it
only through copies the engine thread hands over, refuses to step it, and gets its history and
Restore back once the server stops."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import workbench as wb
from workbench.views.panel import Panel
from workbench.views.served import EngineCopy

openai = pytest.importorskip("openai", reason="the dev extra installs openai")

PROMPTS = ["def add(a, b):", "def mul(x, y):", "class Stack:", "for i in range(10):"]


def alone(bundled, prompt: str, max_tokens: int) -> str:
    sched = wb.Scheduler(*bundled)
    uid = sched.submit(wb.Request(prompt=prompt, max_tokens=max_tokens))
    sched.run()
    return sched.text(uid)


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)


def test_the_panel_follows_a_served_engine_and_gets_it_back_when_the_server_stops(bundled):
    sched = wb.Scheduler(*bundled, max_batch=4, history_checkpoints=8)
    server = wb.serve(sched, port=0)
    try:
        panel = Panel(server, follow_s=0.1)
        assert panel.following and isinstance(panel.source, EngineCopy)
        assert all(
            panel.buttons[n].disabled for n in ("Submit", "Admit", "Step", "Filter", "Run N steps", "Reset")
        )
        assert panel.buttons["Restore"].disabled and "server.stop()" in panel.buttons["Restore"].tooltip
        assert "following http://127.0.0.1:" in panel.follow_note.value

        client = openai.OpenAI(base_url=server.url, api_key="-", timeout=60, max_retries=0)
        answers: dict[str, list[str]] = {p: [] for p in PROMPTS}
        done, failures = threading.Event(), []

        def load() -> None:  # one client thread: rounds of concurrent requests until told to stop
            try:
                with ThreadPoolExecutor(len(PROMPTS)) as pool:
                    while not done.is_set():
                        texts = pool.map(
                            lambda p: (
                                client.completions.create(model="m", prompt=p, max_tokens=40).choices[0].text
                            ),
                            PROMPTS,
                        )
                        for p, text in zip(PROMPTS, texts):
                            answers[p].append(text)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                failures.append(exc)

        shown: list[int] = []
        loader = threading.Thread(target=load)
        loader.start()
        try:
            deadline = time.monotonic() + 60
            while len(set(shown)) < 3 and time.monotonic() < deadline:  # the shown step, read as a user would
                shown.append(panel.shown.step)
                time.sleep(0.05)
            # a Step while served is refused with the reason and calls nothing
            before = len(panel.source.history)
            panel.on_step()
            assert "refused" in panel.notice.value and "server.stop()" in panel.notice.value
        finally:
            done.set()
            loader.join(60)
        assert not failures, failures
        steps = sorted(set(shown))
        assert len(steps) >= 3 and shown == sorted(shown), f"the panel's step did not advance: {shown}"
        assert panel.following and panel.error.value == "" and before >= 1
        assert all(len(a) >= 1 for a in answers.values())
        for p, texts in answers.items():  # the panel watching changed nothing (compile off, as served)
            assert set(texts) == {alone(bundled, p, 40)}, p
    finally:
        server.stop()

    wait_until(lambda: not panel.following, 10, "the follower to end after server.stop()")
    assert panel.follow_error is None and panel.error.value == ""
    assert panel.source is sched and panel.follow_note.value == ""
    assert not any(panel.buttons[n].disabled for n in ("Admit", "Step", "Filter"))
    last = len(sched.history) - 1
    assert panel.slider.max == last and panel.slider.value == last
    back = next(i for i in range(last - 1, -1, -1) if sched.history.checkpoint(i) is not None)
    panel.slider.value = back  # scrubbing back: the slider's observer re-renders
    assert f"snapshot {back + 1} of {last + 1}" in panel.slider_label.value
    assert not panel.buttons["Restore"].disabled
    step = sched.history[back].step
    panel.on_restore()
    assert panel.error.value == "" and panel.notice.value.startswith(f"Restore: restored step {step}")
    assert sched.step_index == step
