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
