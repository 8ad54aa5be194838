"""A real SIGINT ("Kernel → Interrupt") landing in ``sched.run()`` leaves the engine
intact: the child process (:mod:`tests.engine.interrupted_run`) catches the
KeyboardInterrupt, its ``check()`` is ok, and continuing ``run()`` gives every request the
tokens of an uninterrupted run (issue 18)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
SIGNALS = 3


def read_line(child: subprocess.Popen, deadline_s: float) -> str:
    line = child.stdout.readline()
    if not line:
        child.wait(timeout=max(1.0, deadline_s - time.monotonic()))
        pytest.fail(f"child ended (rc {child.returncode}) without a line; stderr:\n{child.stderr.read()}")
    return line.strip()


def test_real_sigints_during_run_leave_the_engine_intact_and_continuing_gives_the_same_tokens():
    env = dict(os.environ, WORKBENCH_BLAS=os.environ.get("WORKBENCH_BLAS", "off"))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.engine.interrupted_run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline_s = time.monotonic() + 120
    try:
        kind, duration_s = read_line(child, deadline_s).split()
        assert kind == "READY", kind
        interrupts = []
        for _ in range(SIGNALS):  # spread over the first ~60% of a run as long as the reference
            time.sleep(float(duration_s) * 0.2)
            child.send_signal(signal.SIGINT)
            line = read_line(child, deadline_s)
            if line.startswith("RESULT"):  # the run ended before this signal arrived
                break
            kind, payload = line.split(" ", 1)
            assert kind == "INTERRUPTED", line
            interrupts.append(json.loads(payload))
        else:
            line = read_line(child, deadline_s)
        assert child.wait(timeout=max(1.0, deadline_s - time.monotonic())) == 0, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert interrupts, "no SIGINT landed inside run()"
    print("interrupts at steps", [s["step"] for s in interrupts])
    for seen in interrupts:
        assert seen["ok"], seen["report"]
    assert [s["step"] for s in interrupts] == sorted(s["step"] for s in interrupts)  # work done is kept
    kind, payload = line.split(" ", 1)
    assert kind == "RESULT", line
    result = json.loads(payload)
    assert result["ok"], result["report"]
    assert set(result["finish"].values()) == {"length"}
    assert result["tokens"] == result["reference"]
