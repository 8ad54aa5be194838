"""The test command's configuration (pyproject's ``[tool.pytest.ini_options]``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


SUMMARY_TESTS = """import pytest

@pytest.mark.skip(reason='no chromium at /usr/bin/chromium')
def test_x():
    pass

@pytest.fixture
def broken():
    raise RuntimeError('fixture broke')

def test_fails():
    assert 1 == 2

def test_errors(broken):
    pass
"""


@pytest.fixture(scope="module")
def summary_run(tmp_path_factory):
    """One run of pytest, configured by pyproject.toml, over a skipped, a failing and an
    erroring test."""
    folder = tmp_path_factory.mktemp("summary")
    (folder / "test_summary.py").write_text(SUMMARY_TESTS)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(folder),
            "-q",
            str(folder / "test_summary.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
    )


def test_a_skipped_test_prints_its_reason_in_the_summary(summary_run):
    assert "SKIPPED [1]" in summary_run.stdout and "no chromium at /usr/bin/chromium" in summary_run.stdout


def test_a_failed_test_and_an_error_are_named_in_the_short_summary(summary_run):
    assert summary_run.returncode == 1, summary_run.stdout + summary_run.stderr
    summary = summary_run.stdout.split("short test summary info")[-1]
    assert "FAILED test_summary.py::test_fails" in summary, summary_run.stdout
    assert "ERROR test_summary.py::test_errors" in summary, summary_run.stdout


# A plugin for one --collect-only run: it prints every item `-m` kept and every one it deselected.
COLLECT_PLUGIN = """
def pytest_deselected(items):
    for item in items:
        print("DESELECTED", item.nodeid)


def pytest_collection_finish(session):
    for item in session.items:
        print("SELECTED", item.nodeid)
"""


@pytest.fixture(scope="module")
def quick_collection(tmp_path_factory):
    """``(selected, deselected)`` node ids of one ``pytest --collect-only -m "not slow"`` over
    the tests and a notebook: the quick check, and what it leaves out (one collection, not
    one per marker expression: each imports the whole suite)."""
    plugin_dir = tmp_path_factory.mktemp("plugin")
    (plugin_dir / "collect_plugin.py").write_text(COLLECT_PLUGIN)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(plugin_dir), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "collect_plugin",
            "-m",
            "not slow",
            "tests",
            "notebooks/02_join_evict.ipynb",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    return (
        [line.split(" ", 1)[1] for line in lines if line.startswith("SELECTED ")],
        [line.split(" ", 1)[1] for line in lines if line.startswith("DESELECTED ")],
    )


def test_the_quick_check_leaves_out_notebooks_the_real_model_and_the_browser(quick_collection):
    paths = (
        "notebooks/02_join_evict.ipynb",
        "tests/verify/test_real_model.py",
        "tests/test_browser.py",
        "tests/test_pytest_config.py",
    )
    selected, deselected = quick_collection
    quick = [t for t in selected if t.startswith(paths)]
    everything = quick + [t for t in deselected if t.startswith(paths)]
    assert any(t.startswith("notebooks/") for t in everything) and any(
        "test_real_model" in t for t in everything
    )
    assert quick and all(t.startswith("tests/test_pytest_config.py::") for t in quick), quick


def test_every_test_listed_as_slow_exists_so_a_rename_cannot_move_it_into_the_quick_check(quick_collection):
    from tests.conftest import slow_tests

    selected, deselected = quick_collection
    collected = {t.split("[")[0] for t in selected + deselected}
    listed = slow_tests()
    assert len(listed) > 50 and listed <= collected, sorted(listed - collected)
    quick = {t.split("[")[0] for t in selected}
    assert quick and not quick & listed
