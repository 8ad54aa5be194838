"""The checkpoint-file fuzzer (``tests/engine/checkpoint_fuzz.py``) on real checkpoints of
four cache families (full attention, sliding window, hybrid linear attention, SSM; two under
a KV budget): random byte and field edits may only be refused with a ValueError or load and
run to completion with ``check()`` ok. It runs in a subprocess with ``faulthandler``, so a
segfault or a hang fails this test naming the edit. Bounded here (40 edits per family, slow tier);
``--long`` runs 2,000 edits per family, and the module runs alone as a command (its
docstring)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model  # slow: tests/slow_tests.txt
ROOT = Path(__file__).resolve().parents[2]
FAMILIES = (
    "tiny-llama",
    "tiny-gemma3+budget",
    "tiny-qwen3-next",
    "tiny-mamba2+budget",
)  # +budget: a KV budget


def test_random_edits_to_checkpoint_files_are_refused_by_name_or_load_and_run(request):
    long = request.config.getoption("--long")
    limits = ["--examples", "2000"] if long else ["--examples", "40"]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    )
    command = [sys.executable, "-X", "faulthandler", "-m", "tests.engine.checkpoint_fuzz"]
    command += ["--family", ",".join(FAMILIES), "--seed", "42", *limits]
    try:
        out = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=None if long else 300
        )
    except subprocess.TimeoutExpired as exc:
        tried = [line for line in (exc.stdout or b"").decode().splitlines() if line.startswith("TRY")]
        pytest.fail(f"the fuzzer hung (a wedge) at: {tried[-1:] or 'start-up'}")
    tried = [line for line in out.stdout.splitlines() if line.startswith("TRY")]
    assert out.returncode == 0, f"exit {out.returncode} at {tried[-1:] or 'start-up'}:\n{out.stderr[-3000:]}"
    counts = json.loads(out.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    assert set(counts) == set(FAMILIES)
    for family, c in counts.items():
        assert c["refused"] >= 5 and c["loaded and ran"] >= 2, (
            f"{family}: {c} (too few edits of each outcome)"
        )
