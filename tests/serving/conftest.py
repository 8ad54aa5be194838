"""A served bundled model on loopback (``wb.serve(sched, port=0)``) and openai clients for it."""

from __future__ import annotations

import json
import time

import httpx
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


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str):
    """``text`` parsed as strict JSON: ``NaN`` / ``Infinity`` / ``-Infinity`` raise ``ValueError``
    (Python's ``json`` accepts them; OpenAI's clients in other languages do not)."""
    return json.loads(text, parse_constant=_not_json)


def strict_stream(url: str, body: dict) -> list[dict]:
    """POST ``body`` with ``stream: true`` to ``url``; every ``data:`` chunk before ``[DONE]``
    parsed by :func:`strict_json` (fails on a chunk that is not strict JSON)."""
    with httpx.Client(timeout=60) as h, h.stream("POST", url, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", lines[-1:]
    return [strict_json(line) for line in lines[:-1]]
