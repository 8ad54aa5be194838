"""A JupyterLab (headless, localhost, no token) for Debian's Chromium driven by Playwright: the
set-up shared by ``tests/test_browser.py`` and ``scripts/notebook_screenshots.py``.

Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``) and the dev extra
(``playwright``, ``jupyterlab``, ``ipywidgets``). Browser downloads (``playwright install``)
are never used; pages reach nothing but the local server (:func:`local_only`).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# JupyterLab user settings: no news fetching (its toast covers the page), every cell in the DOM.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}
KERNEL_IDLE_JS = """() => {
  const name = document.querySelector('.jp-Notebook-toolbarKernelName, .jp-KernelName');
  const state = document.querySelector('.jp-Notebook-ExecutionIndicator');
  return name && !/No Kernel/.test(name.textContent) && state && state.dataset.status === 'idle';
}"""
START_TIMEOUT_S = 90  # JupyterLab answers /api/status within this, or start_lab fails


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_settings(settings_dir: Path) -> None:
    """Write :data:`LAB_SETTINGS` as JupyterLab user settings under ``settings_dir``."""
    for rel, value in LAB_SETTINGS.items():
        path = settings_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


def start_lab(
    served: Path, work: Path, log_path: Path, cwd: Path | None = None
) -> tuple[subprocess.Popen, str]:
    """A JupyterLab serving ``served``, its user settings (:func:`write_settings`) and
    workspaces under ``work``, its output in ``log_path``; returns the process and its base
    URL once ``/api/status`` answers.

    Raises:
        RuntimeError: the server exited or did not answer within :data:`START_TIMEOUT_S` (it is stopped).
    """
    write_settings(work / "settings")
    port = free_port()
    with open(log_path, "w") as log:  # the child keeps its own copy of the descriptor
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
                f"--LabApp.user_settings_dir={work / 'settings'}",
                f"--LabApp.workspaces_dir={work / 'workspaces'}",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status", timeout=2)
            return proc, base
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_lab(proc)
                raise RuntimeError(f"JupyterLab did not start; see {log_path}") from None
            time.sleep(0.5)


def stop_lab(proc: subprocess.Popen) -> None:
    """SIGTERM (the server shuts its kernels down), then kill after 30 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def local_only(route) -> None:
    """A Playwright route handler: requests to 127.0.0.1 go through, every other is aborted."""
    if route.request.url.startswith("http://127.0.0.1"):
        route.continue_()
    else:
        route.abort()


def open_notebook(page, base: str, name: str, cell_selector: str) -> None:
    """Open notebook ``name`` of the server at ``base`` and wait for its cells and an idle kernel."""
    page.goto(f"{base}/lab/tree/{name}")
    page.wait_for_selector(cell_selector, timeout=60_000)
    page.wait_for_function(KERNEL_IDLE_JS, timeout=90_000)


def run_all_cells(page, cell_selector: str) -> None:
    """Focus the notebook (click its first cell) and choose Run > Run All Cells."""
    page.locator(cell_selector).first.click()
    page.locator(".lm-MenuBar-itemLabel:text-is('Run')").click()
    page.locator(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel:text-is('Run All Cells')").click()


@contextmanager
def notebook_page(
    chromium: Path, base: str, name: str, failure_png: Path, cell_selector: str = ".jp-Notebook .jp-Cell"
):
    """A Chromium page (1400 x 1000, :func:`local_only`) on notebook ``name`` of the server at
    ``base``, its cells run (:func:`open_notebook`, :func:`run_all_cells`); a failure inside the
    block saves a screenshot to ``failure_png``; the browser is closed afterwards."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.route("**/*", local_only)
            try:
                open_notebook(page, base, name, cell_selector)
                run_all_cells(page, cell_selector)
                yield page
            except Exception:
                page.screenshot(path=str(failure_png))
                raise
        finally:
            browser.close()
