"""Screenshots of notebook outputs as JupyterLab shows them at 100% zoom, in Debian's
Chromium driven by Playwright (the same set-up as ``tests/test_browser.py``; see there for
what it needs). Used to check that figures and text forms are readable (issue 13).

Usage::

    python scripts/notebook_screenshots.py OUT NOTEBOOK[:run] CELLS [NOTEBOOK[:run] CELLS ...]

``CELLS`` is a comma-separated list of cell indices (0-based, markdown cells counted),
``panel`` (the live Panel's box) and ``window`` (the whole window with the Panel scrolled to
its top: does it fit the screen). A notebook is shown with its stored outputs, or with
``:run`` after Run All Cells (needed for widgets). For every cell it writes
``OUT/<notebook>-cell<i>.png`` and prints what decides readability: the output area's width,
each image's own and shown width (px), and for text outputs the ``<pre>``'s width, scroll
width (wider than shown means a line would overflow), white-space rule and font size, and
for every ``<pre>`` of the cell ``wraps``: [longest line (characters), lines, lines as
rendered]; more rendered lines than lines means JupyterLab wrapped some (``pre-wrap``: at a
1400 px window a 960 px ``<pre>`` at 13 px holds about 122 characters).
Environment: ``VW`` / ``VH`` set the window size (default 1400 x 1000; a tall ``VH`` puts
the whole Panel in one shot). The notebooks are copied: their stored outputs are never
overwritten.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, KERNEL_IDLE_JS, _free_port, _write_settings  # noqa: E402

VISIBLE = ".jp-NotebookPanel:not(.lm-mod-hidden)"
CELL = f"{VISIBLE} .jp-Notebook .jp-Cell"
RUNNING_JS = f"""() => {{
  const prompts = Array.from(document.querySelectorAll('{VISIBLE} .jp-InputPrompt'));
  return prompts.length > 0 && !prompts.some(p => /\\*/.test(p.textContent));
}}"""
CELL_INFO_JS = f"""(i) => {{
  const c = document.querySelectorAll('{CELL}')[i];
  const area = c.querySelector('.jp-OutputArea-output');
  const pre = c.querySelector('.jp-OutputArea-output pre');
  return {{area_px: area && area.clientWidth,
          images: Array.from(c.querySelectorAll('img')).map(m => [m.naturalWidth, m.clientWidth]),
          pre: pre && {{width_px: pre.clientWidth, scroll_px: pre.scrollWidth,
                        white_space: getComputedStyle(pre).whiteSpace, font: getComputedStyle(pre).fontSize}},
          wraps: Array.from(c.querySelectorAll('.jp-OutputArea-output pre')).map(p => {{
            const lines = p.textContent.replace(/\\n$/, '').split('\\n');
            return [Math.max(...lines.map(l => l.length)), lines.length,
                    Math.round(p.clientHeight / parseFloat(getComputedStyle(p).lineHeight))];
          }})}};
}}"""
PANEL_INFO_JS = """() => Array.from(document.querySelectorAll(
    '.wb-mask-image, .wb-attention-image, .wb-timeline-image, .wb-kv-image'))
  .map(i => [i.classList[i.classList.length - 1], i.naturalWidth, i.clientWidth])"""


def lab(served: Path, settings: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    """A JupyterLab on ``served`` (no token, localhost), and its base URL once it answers."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            f"--port={port}",
            "--ServerApp.token=",
            "--ServerApp.password=",
            "--ServerApp.ip=127.0.0.1",
            "--allow-root",
            f"--ServerApp.root_dir={served}",
            f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={settings.parent / 'workspaces'}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        stdout=open(log_path, "w"),
        stderr=subprocess.STDOUT,
        cwd=REPO / "notebooks",
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status", timeout=2)
            return proc, base
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not start; see {log_path}") from None
            time.sleep(0.5)


def shoot(page, base: str, name: str, run: bool, cells: list[str], out: Path) -> None:
    """Open ``name``, optionally run all cells, and screenshot the requested cells."""
    page.goto(f"{base}/lab/tree/{name}")
    page.wait_for_selector(CELL, timeout=60_000)
    page.wait_for_function(KERNEL_IDLE_JS, timeout=90_000)
    if run:
        page.locator(CELL).first.click()
        page.locator(".lm-MenuBar-itemLabel:text-is('Run')").click()
        page.locator(
            ".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel:text-is('Run All Cells')"
        ).click()
        time.sleep(5)
        page.wait_for_function(RUNNING_JS, timeout=500_000)
    time.sleep(2)
    stem = Path(name).stem
    for spec in cells:
        if spec == "window":  # the whole window, the Panel's first row of buttons at its top
            box = page.locator(".wb-status").locator("xpath=../..")
            box.evaluate("e => e.scrollIntoView({block: 'start'})")
            time.sleep(0.5)
            print(f"{name} window: panel box {box.bounding_box()}, images {page.evaluate(PANEL_INFO_JS)}")
            page.screenshot(path=str(out / f"{stem}-window.png"))
            continue
        if spec == "panel":
            box = page.locator(".wb-status").locator("xpath=..")
            box.scroll_into_view_if_needed()
            print(f"{name} panel images [class, own px, shown px]: {page.evaluate(PANEL_INFO_JS)}")
            box.screenshot(path=str(out / f"{stem}-panel.png"))
            continue
        cell = page.locator(CELL).nth(int(spec))
        cell.scroll_into_view_if_needed()
        cell.locator(".jp-OutputArea-output").first.wait_for(timeout=30_000)
        time.sleep(0.5)
        print(f"{name} cell {spec}: {page.evaluate(CELL_INFO_JS, int(spec))}")
        cell.locator(".jp-Cell-outputWrapper").screenshot(path=str(out / f"{stem}-cell{spec}.png"))


def main(argv: list[str]) -> None:
    if len(argv) < 3 or len(argv) % 2 == 0:
        raise SystemExit(__doc__)
    from playwright.sync_api import sync_playwright

    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp())
    served = work / "served"
    served.mkdir()
    _write_settings(work / "settings")
    jobs = []
    for spec, cells in zip(argv[1::2], argv[2::2]):
        path, _, mode = spec.partition(":")
        shutil.copy(path, served / Path(path).name)
        jobs.append((Path(path).name, mode == "run", cells.split(",")))
    proc, base = lab(served, work / "settings", out / "jupyterlab.log")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(
                    viewport={
                        "width": int(os.environ.get("VW", 1400)),
                        "height": int(os.environ.get("VH", 1000)),
                    }
                )
                page.route(
                    "**/*",
                    lambda route: (
                        route.continue_()
                        if route.request.url.startswith("http://127.0.0.1")
                        else route.abort()
                    ),
                )
                for name, run, cells in jobs:
                    shoot(page, base, name, run, cells, out)
            finally:
                browser.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
