"""``python -m workbench.serving.replay``: the small fixed-schedule load client, against the served
bundled model; and ``server.between``, how other threads read the served scheduler."""

from __future__ import annotations

import asyncio
import threading

import pytest

import workbench as wb
from workbench.serving.replay import replay
from workbench.serving.trace import mooncake_lines
from workbench.workloads.workload import Workload


def test_the_replay_client_sends_each_payload_at_its_time_and_one_bad_request_ends_only_its_row(
    server, bundled
):
    tok = bundled[1]
    prompt = tok.encode("def add(a, b):")
    work = Workload(
        [(0.0, wb.Request(prompt=prompt, max_tokens=6)), (0.3, wb.Request(prompt=prompt, max_tokens=9))]
    )
    lines = mooncake_lines(work, "tiny-code")
    bad = {"timestamp": 100, "payload": {**lines[0]["payload"], "max_tokens": 0}}
    records = asyncio.run(replay([*lines, bad], server.url))
    assert [r["error"] for r in records[:2]] == ["", ""]
    assert [r["completion_tokens"] for r in records[:2]] == [6, 9]  # ignore_eos: exactly max_tokens
    assert all(r["ttft_s"] > 0 and r["finish_reason"] == "length" for r in records[:2])
    assert records[1]["at_s"] == pytest.approx(0.3) and len(records[1]["itl_s"]) >= 1
    assert records[2]["error"].startswith("HTTP 400") and "max_tokens" in records[2]["error"]
    with pytest.raises(ValueError, match="line 1: no payload"):
        asyncio.run(replay(mooncake_lines(work, "tiny-code", mode="lengths"), server.url))


def test_between_runs_on_the_engine_thread_and_hands_back_the_result_or_the_exception(server):
    assert server.serving
    assert server.between(lambda s: threading.current_thread().name).result(10) == "workbench-engine"
    assert server.between(lambda s: s.idle).result(10) is True
    with pytest.raises(KeyError):
        server.between(lambda s: s.request_of(10**9)).result(10)


def test_between_after_stop_runs_at_once_on_the_callers_thread(bundled):
    srv = wb.serve(wb.Scheduler(*bundled), port=0)
    srv.stop()
    assert not srv.serving
    here = threading.current_thread().name
    assert srv.between(lambda s: threading.current_thread().name).result(1) == here
