"""The Azure trace as AIPerf ``mooncake_trace`` lines: timestamps in ms, and payloads the
server runs to exactly their trace output length."""

from __future__ import annotations

import json

import httpx
import pytest

import workbench as wb
from workbench.serving.trace import main, mooncake_lines
from workbench.workloads.traces import trace_missing


def test_payload_lines_carry_the_workloads_token_ids_and_the_server_runs_each_to_its_length(server, bundled):
    work = wb.Workload(
        (
            (0.0, wb.Request(prompt=[5, 6, 7], max_tokens=9, stop_ids=[])),
            (0.25, wb.Request(prompt=[8, 9], max_tokens=3, stop_ids=[])),
        )
    )
    lines = mooncake_lines(work, "tiny-code")
    assert [r["timestamp"] for r in lines] == [0, 250]
    assert lines[1]["payload"]["prompt"] == [8, 9] and lines[1]["payload"]["ignore_eos"] is True
    for line in lines:
        body = {**line["payload"], "stream": False}
        body.pop("stream_options")
        out = httpx.post(f"{server.url}/completions", json=body, timeout=60).json()
        assert out["usage"]["completion_tokens"] == line["payload"]["max_tokens"]
    lengths = mooncake_lines(work, "m", mode="lengths")
    assert lengths[0] == {"timestamp": 0, "input_length": 3, "output_length": 9, "hash_ids": []}
    with pytest.raises(ValueError, match="mode must be"):
        mooncake_lines(work, "m", mode="csv")


@pytest.mark.skipif(trace_missing("conv") is not None, reason="the Azure 2023 trace is absent")
def test_the_command_writes_the_conv_window(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert main(["--out", str(out), "--max-requests", "5", "--mode", "lengths"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5 and rows == sorted(rows, key=lambda r: r["timestamp"])
    assert all(r["input_length"] >= 1 and 1 <= r["output_length"] <= 128 for r in rows)
    assert "5 requests" in capsys.readouterr().out
