"""Report.to_csv / to_parquet: the events and per-request frames written and read back; the
summary line."""

from __future__ import annotations

import pandas as pd
import pytest

import workbench as wb


@pytest.fixture(scope="module")
def report(bundled):
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=2)
    sched.submit(wb.Request(prompt="def add(a, b):", max_tokens=5, stop=["\n\n"]))
    sched.submit(wb.Request(prompt=[401, 17, 9], max_tokens=3))
    sched.submit(wb.Request(prompt=[5, 6], max_tokens=2, sampler=lambda lp: 1 / 0))  # an error row: a message
    return sched.run()


def test_to_csv_writes_events_and_requests_that_read_back_equal(report, tmp_path):
    paths = report.to_csv(tmp_path / "out")
    assert paths == {"events": tmp_path / "out" / "events.csv", "requests": tmp_path / "out" / "requests.csv"}
    events = pd.read_csv(paths["events"], keep_default_na=False)
    requests = pd.read_csv(paths["requests"], keep_default_na=False)
    assert list(events.columns) == list(report.events.columns) and len(events) == len(report.events)
    assert events.kind.tolist() == report.events.kind.tolist()
    assert requests.uid.tolist() == [0, 1, 2] and requests.text.tolist() == report.requests.text.tolist()
    assert "error" in requests.finish_reason.tolist()


def test_to_parquet_keeps_the_frames_and_their_column_types(report, tmp_path):
    paths = report.to_parquet(tmp_path)
    assert {p.name for p in paths.values()} == {"events.parquet", "requests.parquet"}
    pd.testing.assert_frame_equal(pd.read_parquet(paths["events"]), report.events)
    pd.testing.assert_frame_equal(pd.read_parquet(paths["requests"]), report.requests)


def test_to_parquet_without_pyarrow_names_the_parquet_extra(report, tmp_path, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=r"\.\[parquet\]"):
        report.to_parquet(tmp_path / "none")
    assert not (tmp_path / "none").exists()  # nothing written before the error


def test_summary_writes_every_latency_in_ms_with_one_decimal_like_the_latency_tables(report):
    import re

    text = report.summary()
    latencies = re.findall(r"(?:p50|p95) ([0-9.]+) ms", text)
    assert len(latencies) == 4, text  # TTFT and TPOT, p50 and p95
    assert all(re.fullmatch(r"[0-9]+\.[0-9]", v) for v in latencies), text
