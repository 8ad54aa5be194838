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
