"""Screenshots of notebook outputs as JupyterLab shows them at 100% zoom, in Debian's
Chromium driven by Playwright (the set-up of ``tests/test_browser.py``, shared in
``tests/browser_lab.py``: see there for what it needs). Used to check that figures and text
forms are readable (issue 13).

Usage::

    python scripts/notebook_screenshots.py OUT NOTEBOOK[:run] CELLS [NOTEBOOK[:run] CELLS ...]

``CELLS`` is a comma-separated list of cell indices (0-based, markdown cells counted),
``panel`` (the live Panel's box) and ``window`` (the whole window with the Panel scrolled to
its top: does it fit the screen); ``<i>+`` shoots cell ``i`` whole, its input included (a
collapsed solution cell, a markdown cell). A notebook is shown with its stored outputs, or with
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
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.browser_lab import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    local_only,
    open_notebook,
    run_all_cells,
    start_lab,
    stop_lab,
)

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


def shoot(page, base: str, name: str, run: bool, cells: list[str], out: Path) -> None:
    """Open ``name``, optionally run all cells, and screenshot the requested cells."""
    open_notebook(page, base, name, CELL)
    if run:
        run_all_cells(page, CELL)
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
        if spec.endswith("+"):  # the whole cell: a collapsed input shows as its ellipsis
            cell = page.locator(CELL).nth(int(spec[:-1]))
            cell.scroll_into_view_if_needed()
            time.sleep(0.5)
            cell.screenshot(path=str(out / f"{stem}-cell{spec[:-1]}-whole.png"))
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
    jobs = []
    for spec, cells in zip(argv[1::2], argv[2::2]):
        path, _, mode = spec.partition(":")
        shutil.copy(path, served / Path(path).name)
        jobs.append((Path(path).name, mode == "run", cells.split(",")))
    proc, base = start_lab(served, work, out / "jupyterlab.log", cwd=REPO / "notebooks")
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
                page.route("**/*", local_only)
                for name, run, cells in jobs:
                    shoot(page, base, name, run, cells, out)
            finally:
                browser.close()
    finally:
        stop_lab(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
