"""Run a script in a child process that loads OpenBLAS (the suite itself runs on the reference
BLAS, ``WORKBENCH_BLAS=off``, which rounds alike paths that OpenBLAS rounds apart)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from workbench.runtime.blas import find_blas


def run_with_openblas(monkeypatch: pytest.MonkeyPatch, script: str, timeout_s: float = 900) -> str:
    """The stdout of ``python -c script`` with OpenBLAS loaded; skips (with the reason) where
    this machine has no optimized BLAS; fails the test with the child's output if it exits non-zero."""
    monkeypatch.delenv("WORKBENCH_BLAS", raising=False)
    if not find_blas():
        pytest.skip("no optimized BLAS here (.ci/run installs Debian's libopenblas0-pthread)")
    child = subprocess.run(
        [sys.executable, "-c", script],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert child.returncode == 0, child.stdout + child.stderr
    return child.stdout
