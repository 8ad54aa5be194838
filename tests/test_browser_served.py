"""The Panel follows a served engine in a real browser (issue 41): JupyterLab (headless,
localhost) and Debian's Chromium driven by Playwright. A notebook serves a scheduler
(``wb.serve(sched, port=0)``), shows ``wb.views.Panel(server)``, starts the repo's load client
(``python -m workbench.serving.replay``) in a subprocess, waits for it and stops the server. In
the page: the Step button is off and the follow label on while served, the status line's step
advances while the client sends requests, and once the server stops the buttons come back.
Screenshots go to ``test-output/browser/`` (docs/screenshots/panel_served.png is one of them).

Needs what ``tests/test_browser.py`` needs (``/usr/bin/chromium``, the dev extra).
"""

from __future__ import annotations

import re
import time

import nbformat
import pytest

from tests.browser_lab import notebook_page, start_lab, stop_lab
from tests.test_browser import OUT_DIR, chromium  # noqa: F401 - the fixture

pytestmark = pytest.mark.browser

CELLS = [
    """import json, subprocess, sys
import workbench as wb
from workbench.serving.trace import mooncake_lines
from workbench.workloads.workload import synthetic

model, tok = wb.load()
sched = wb.Scheduler(model, tok, max_batch=4)
server = wb.serve(sched, port=0)
panel = wb.views.Panel(server, follow_s=0.3)
panel""",
    """work = synthetic(tok, n_requests=10, rate_per_s=4.0, seed=0, prompt_tokens=24, output_tokens=48)
with open("load.jsonl", "w") as f:
    f.writelines(json.dumps(line) + "\\n" for line in mooncake_lines(work, "tiny-code"))
client = subprocess.Popen([sys.executable, "-m", "workbench.serving.replay", "load.jsonl",
                           "--url", server.url, "--out", "measured.json"])""",
    """client.wait(120)
server.stop()
print("client exit", client.returncode)""",
]


@pytest.fixture
def served_lab(tmp_path):
    """``base_url`` of a JupyterLab serving a notebook of :data:`CELLS`; stopped by PID afterwards."""
    served = tmp_path / "served"
    served.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, served / "served.ipynb")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    try:
        proc, base = start_lab(served, tmp_path, OUT_DIR / "jupyterlab-served.log", cwd=served)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield base
    finally:
        stop_lab(proc)


def test_the_panel_follows_a_served_engine_in_jupyterlab_while_a_client_sends_requests(chromium, served_lab):  # noqa: F811
    steps: list[int] = []
    with notebook_page(chromium, served_lab, "served.ipynb", OUT_DIR / "served_failure.png") as page:
        follow = page.locator(".wb-follow")
        follow.wait_for(timeout=120_000)
        step = page.locator(".jupyter-widgets button:text-is('Step')")
        served_disabled = step.is_disabled()
        follow_text = follow.inner_text()
        status = page.locator(".wb-status")
        deadline = time.monotonic() + 200  # past the notebook's own client.wait(120), on a loaded machine
        shot = False
        while time.monotonic() < deadline and step.is_disabled():  # until server.stop()
            found = re.match(r"engine now: step (\d+)", status.inner_text())
            if found:
                steps.append(int(found.group(1)))
            if not shot and len(set(steps)) >= 3:
                page.screenshot(path=str(OUT_DIR / "panel_served.png"))
                shot = True
            time.sleep(0.2)
        step_enabled_after = step.is_enabled()
        page.screenshot(path=str(OUT_DIR / "panel_served_stopped.png"))
    assert served_disabled and "following http://127.0.0.1:" in follow_text, follow_text
    distinct = sorted(set(steps))
    assert len(distinct) >= 3 and steps == sorted(steps), f"the status line's step did not advance: {steps}"
    assert step_enabled_after, "the Step button stayed off after server.stop()"
    assert shot, "no screenshot while the step advanced"
