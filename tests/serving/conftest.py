"""A served bundled model on loopback (``wb.serve(sched, port=0)``) and openai clients for it."""

from __future__ import annotations

import time

import pytest

import workbench as wb

openai = pytest.importorskip("openai", reason="the dev extra installs openai (tests/serving)")


@pytest.fixture(scope="module")
def server(bundled):
    """A server on a free loopback port over a fresh ``Scheduler(max_batch=64)``; stopped after the module."""
    model, tokenizer = bundled
    srv = wb.serve(wb.Scheduler(model, tokenizer, max_batch=64), port=0)
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    """A synchronous ``openai.OpenAI`` client of ``server`` (bounded: 60 s a call, no retries)."""
    return openai.OpenAI(base_url=server.url, api_key="-", timeout=60, max_retries=0)


def wait_until(condition, timeout_s: float = 30.0, what: str = "") -> None:
    """Poll ``condition()`` until true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)
