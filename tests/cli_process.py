"""``python -m workbench.cli ARGS`` in a new process, as a user runs the command (the tests of
the CLI, the benchmark commands and ``info``)."""

from __future__ import annotations

import subprocess
import sys


def run_workbench(*args: str, timeout_s: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the command to its end; returns its exit code and text output (``stdout``, ``stderr``).

    Raises:
        subprocess.TimeoutExpired: after ``timeout_s`` seconds.
    """
    return subprocess.run(
        [sys.executable, "-m", "workbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
