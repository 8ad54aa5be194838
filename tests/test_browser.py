"""The teaching notebook in a real browser: JupyterLab (headless, localhost) and Debian's
Chromium driven by Playwright. Runs every cell, clicks the panel's Step button and checks
that the step label and the mask image change. Screenshots go to ``test-output/browser/``.

Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``) and the dev extra
(``playwright``, ``jupyterlab``, ``ipywidgets``). In CI (``WORKBENCH_REQUIRE_BROWSER=1``,
set by ``.ci/run``, which installs Chromium) a missing Chromium is a failure; on a machine
that has only Python and pip (the README's test command) the test is skipped with that
reason. Browser downloads (``playwright install``) are never used.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.browser_lab import CHROMIUM, KERNEL_IDLE_JS, notebook_page, start_lab, stop_lab

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "02_join_evict.ipynb"
OUT_DIR = REPO / "test-output" / "browser"
IMAGE_SCALES_JS = """() => Array.from(document.querySelectorAll(
    '.wb-mask-image, .wb-attention-image, .wb-timeline-image, .wb-kv-image'))
  .map(img => [img.classList[img.classList.length - 1], img.clientWidth / img.naturalWidth])"""
MASK_SHA256_JS = """async () => {
  const img = document.querySelector('.wb-mask-image');
  const bytes = await (await fetch(img.src)).arrayBuffer();
  const digest = await crypto.subtle.digest('SHA-256', bytes);
  return Array.from(new Uint8Array(digest)).map(b => b.toString(16).padStart(2, '0')).join('');
}"""

# from the top of the Submit row to the bottom of the rows' text (below the images), in CSS px
PANEL_SPAN_JS = """() => {
  const top = document.querySelector('.wb-status').closest('.widget-vbox').getBoundingClientRect().top;
  const bottom = Math.max(...Array.from(document.querySelectorAll('.wb-kv-image, .wb-timeline-image, .wb-rows'))
    .map(img => img.getBoundingClientRect().bottom));
  return bottom - top;
}"""
# the same with the latency view toggled on: its images and text replace the four
LATENCY_SPAN_JS = PANEL_SPAN_JS.replace(".wb-kv-image, .wb-timeline-image", ".wb-itl-image, .wb-latency-text")
LATENCY_SCALES_JS = IMAGE_SCALES_JS.replace(
    ".wb-mask-image, .wb-attention-image, .wb-timeline-image, .wb-kv-image",
    ".wb-ttft-image, .wb-rates-image, .wb-itl-image",
)
RATES_SHA256_JS = MASK_SHA256_JS.replace(".wb-mask-image", ".wb-rates-image")
NOTEBOOK_AREA_PX = 770  # JupyterLab's notebook area in a 1400 x 900 window (its bars take the rest)

pytestmark = pytest.mark.browser


@pytest.fixture
def chromium() -> Path:
    """Debian's Chromium; in CI a failure when it is missing, elsewhere a skip."""
    if not CHROMIUM.exists():
        message = "Debian's chromium is missing: run `apt-get install -y chromium` (.ci/run does)"
        if os.environ.get("WORKBENCH_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@pytest.fixture
def lab_server(tmp_path):
    """``(base_url, served_dir)`` of a JupyterLab serving a copy of the notebook (so the
    repo's stored outputs are never autosaved over); stopped by PID afterwards."""
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(NOTEBOOK, served / NOTEBOOK.name)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for old in OUT_DIR.glob("*.png"):
        old.unlink()
    try:
        proc, base = start_lab(served, tmp_path, OUT_DIR / "jupyterlab.log")
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield base, served
    finally:
        stop_lab(proc)


def _settled(text: str, before: str) -> str:
    """The status label once the panel is done: ``before`` while it still says " — ... …" (busy)."""
    return before if " — " in text else text


def _wait_for_change(read, old, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while (new := read()) == old and time.monotonic() < deadline:
        time.sleep(0.25)
    return new


def test_clicking_step_in_the_notebook_panel_changes_the_step_label_and_the_mask_image(chromium, lab_server):
    base, _ = lab_server
    with notebook_page(chromium, base, NOTEBOOK.name, OUT_DIR / "failure.png") as page:
        step = page.locator(".jupyter-widgets button:text-is('Step')")
        step.wait_for(timeout=120_000)
        page.wait_for_function(KERNEL_IDLE_JS, timeout=120_000)
        status = page.locator(".wb-status")
        status.scroll_into_view_if_needed()
        label, mask = status.inner_text(), page.evaluate(MASK_SHA256_JS)
        assert label.startswith("engine now: step "), label
        # shown at their own size, the images' smallest text is >= 9 px (tests/views: the
        # panel's figures at IMAGE_DPI); shrunk to half a row it was about 6 px
        scales = page.evaluate(IMAGE_SCALES_JS)
        assert len(scales) == 4 and all(scale >= 0.99 for _, scale in scales), scales
        span = page.evaluate(PANEL_SPAN_JS)  # buttons, both rows of images and the rows fit a 900 px window
        assert span <= NOTEBOOK_AREA_PX, f"panel from its buttons to its rows text: {span:.0f} px tall"
        page.screenshot(path=str(OUT_DIR / "before_step.png"))

        step.click()
        new_label = _wait_for_change(lambda: _settled(status.inner_text(), label), label, 60)
        new_mask = _wait_for_change(lambda: page.evaluate(MASK_SHA256_JS), mask, 30)
        page.screenshot(path=str(OUT_DIR / "after_step.png"))
        status.locator("xpath=..").screenshot(path=str(OUT_DIR / "panel.png"))

        page.locator(".wb-view button:text-is('latency')").click()  # the latency view, live
        page.wait_for_function(
            "() => document.querySelector('.wb-itl-image').naturalWidth > 0 && "
            "document.querySelector('.wb-mask-image').offsetParent === null",
            timeout=60_000,
        )
        latency_span, latency_scales = (
            page.evaluate(LATENCY_SPAN_JS),
            page.evaluate(LATENCY_SCALES_JS),
        )
        rates = page.evaluate(RATES_SHA256_JS)
        page.screenshot(path=str(OUT_DIR / "latency_view.png"))
        step.click()
        new_rates = _wait_for_change(lambda: page.evaluate(RATES_SHA256_JS), rates, 60)
        page.screenshot(path=str(OUT_DIR / "latency_after_step.png"))
    step_before, step_after = int(label.split()[3]), int(new_label.split()[3])  # "engine now: step N · ..."
    assert step_after == step_before + 1, (label, new_label)
    assert new_mask != mask, "the mask image did not change after Step"
    assert latency_span <= NOTEBOOK_AREA_PX, f"the latency view: {latency_span:.0f} px tall"
    assert len(latency_scales) == 3 and all(scale >= 0.99 for _, scale in latency_scales), latency_scales
    assert new_rates != rates, "the tok/s image did not change after Step in the latency view"
