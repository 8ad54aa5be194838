"""The test command's configuration (pyproject's ``[tool.pytest.ini_options]``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_skipped_test_prints_its_reason_in_the_summary(tmp_path):
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n@pytest.mark.skip(reason='no chromium at /usr/bin/chromium')\ndef test_x():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
                           "-q", str(tmp_path / "test_skips.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SKIPPED [1]" in proc.stdout and "no chromium at /usr/bin/chromium" in proc.stdout


def test_a_failed_test_and_an_error_are_named_in_the_short_summary(tmp_path):
    (tmp_path / "test_fails.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef broken():\n    raise RuntimeError('fixture broke')\n\n"
        "def test_fails():\n    assert 1 == 2\n\ndef test_errors(broken):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
                           "-q", str(tmp_path / "test_fails.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = proc.stdout.split("short test summary info")[-1]
    assert "FAILED test_fails.py::test_fails" in summary, proc.stdout
    assert "ERROR test_fails.py::test_errors" in summary, proc.stdout


def _selected(marker_expr, *paths):
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marker_expr, *paths],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_the_quick_check_leaves_out_notebooks_the_real_model_and_the_browser():
    paths = ["notebooks/02_join_evict.ipynb", "tests/verify/test_real_model.py", "tests/test_browser.py",
             "tests/test_pytest_config.py"]
    everything, quick = _selected("", *paths), _selected("not slow", *paths)
    assert any(t.startswith("notebooks/") for t in everything) and any("test_real_model" in t for t in everything)
    assert quick and all(t.startswith("tests/test_pytest_config.py::") for t in quick), quick


def test_every_test_listed_as_slow_exists_so_a_rename_cannot_move_it_into_the_quick_check():
    from tests.conftest import slow_tests

    collected = {t.split("[")[0] for t in _selected("", "tests")}
    listed = slow_tests()
    assert len(listed) > 50 and listed <= collected, sorted(listed - collected)
    quick = {t.split("[")[0] for t in _selected("not slow", "tests")}
    assert quick and not quick & listed
