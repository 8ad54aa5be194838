"""The Azure LLM inference trace loader: a hand-made CSV, exact length fitting, and the
real traces from ../shared/data/ when they are there."""

import numpy as np
import pytest

from workbench.workloads.traces import (
    CONV_LIMITS,
    TRACE_DIR_ENV,
    TRACE_FILES,
    conv_window_or_standin,
    fit_lengths,
    read_azure_trace,
    trace_dir,
    trace_missing,
    trace_path,
    trace_workload,
    window,
)

CSV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:47.1805900,3000,300
2023-11-16 18:15:50.6805900,91,16
2023-11-16 18:15:46.9805900,10,5
"""


@pytest.fixture
def small_trace(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(CSV)
    return path


def test_a_trace_csv_becomes_sorted_arrival_seconds_and_lengths(small_trace):
    t = read_azure_trace(small_trace)
    assert list(t.columns) == ["arrival_s", "prompt_tokens", "output_tokens"]
    assert t.arrival_s.tolist() == pytest.approx([0.0, 0.3, 0.5, 4.0])
    assert t.prompt_tokens.tolist() == [374, 10, 3000, 91] and t.output_tokens.tolist() == [44, 5, 300, 16]


def test_a_csv_without_the_trace_columns_is_refused(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("time,tokens\n1,2\n")
    with pytest.raises(
        ValueError, match=r"missing column\(s\) \['ContextTokens', 'GeneratedTokens', 'TIMESTAMP'\]"
    ):
        read_azure_trace(path)


def test_a_window_is_shifted_to_zero_and_time_scaled(small_trace):
    w = window(read_azure_trace(small_trace), start_s=0.2, duration_s=1.0, time_scale=0.5)
    assert w.arrival_s.tolist() == pytest.approx([0.05, 0.15]) and w.prompt_tokens.tolist() == [10, 3000]
    with pytest.raises(ValueError):
        window(read_azure_trace(small_trace), time_scale=0)


def test_lengths_are_scaled_then_capped_then_fit_the_context():
    p, o = fit_lengths([1500, 10, 4, 3000], [300, 5, 1, 3000], context_tokens=1024)
    assert p.tolist() == [724, 10, 4, 1] and o.tolist() == [300, 5, 1, 1023]
    p, o = fit_lengths(
        [1500, 10, 1], [300, 5, 1], length_scale=0.25, max_prompt_tokens=200, max_output_tokens=50
    )
    assert p.tolist() == [200, 2, 1] and o.tolist() == [50, 1, 1]
    with pytest.raises(ValueError, match="length_scale"):
        fit_lengths([1], [1], length_scale=0)
    with pytest.raises(ValueError, match="context_tokens"):
        fit_lengths([1], [1], context_tokens=1)


def test_a_trace_workload_has_the_fitted_lengths_and_never_stops_early(small_trace, bundled):
    w = trace_workload(small_trace, bundled[1], seed=0, length_scale=0.5, context_tokens=1024, max_requests=3)
    f = w.frame()
    assert f.prompt_tokens.tolist() == [187, 5, 874] and f.max_tokens.tolist() == [22, 2, 150]
    assert f.arrival_s.tolist() == pytest.approx([0.0, 0.3, 0.5])
    assert all(r.stop_ids == [] for _, r in w)
    assert w == trace_workload(
        small_trace, bundled[1], seed=0, length_scale=0.5, context_tokens=1024, max_requests=3
    )


def test_the_trace_folder_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path))
    assert trace_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match=TRACE_DIR_ENV):
        trace_path("conv")
    with pytest.raises(ValueError, match="conv"):
        trace_path("chat")


def test_without_the_trace_the_conv_window_falls_back_to_a_labelled_synthetic_stand_in(
    monkeypatch, tmp_path, bundled
):
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path))
    missing = trace_missing("conv")
    assert TRACE_DIR_ENV in missing and str(tmp_path) in missing
    assert all(len(line.replace(str(tmp_path), "")) <= 100 for line in missing.splitlines())  # no wrap
    w = conv_window_or_standin(bundled[1])
    assert w.name == "synthetic stand-in for conv 10:00+12 s" and len(w) == 59
    f = w.frame()
    assert f.prompt_tokens.max() <= CONV_LIMITS["max_prompt_tokens"]
    assert f.max_tokens.max() <= CONV_LIMITS["max_output_tokens"]
    assert 100 < f.prompt_tokens.median() < 500 and 15 < f.max_tokens.median() < 90
    assert w == conv_window_or_standin(bundled[1])  # seeded


def test_with_the_trace_the_conv_window_is_the_real_one(monkeypatch, tmp_path, small_trace, bundled):
    (tmp_path / TRACE_FILES["conv"]).write_text(small_trace.read_text())
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path))
    assert trace_missing("conv") is None
    w = conv_window_or_standin(bundled[1], name="real")
    assert w.name == "real"  # the hand-made trace has nothing at minute 10: an empty window
    assert len(w) == 0


def _real(name):
    try:
        return trace_path(name)
    except FileNotFoundError as e:
        pytest.skip(f"shared Azure trace absent ({e})")


@pytest.mark.parametrize("name, n_requests", [("conv", 19366), ("code", 8819)])
def test_the_real_azure_traces_load_as_an_hour_of_requests(name, n_requests):
    t = read_azure_trace(_real(name))
    assert len(t) == n_requests and t.arrival_s.iloc[0] == 0.0 and t.arrival_s.is_monotonic_increasing
    assert 3400 < t.arrival_s.iloc[-1] < 3600
    assert (t.prompt_tokens >= 1).all() and (t.output_tokens >= 1).all()


def test_a_real_trace_window_fits_the_bundled_context(bundled):
    w = trace_workload(_real("conv"), bundled[1], start_s=600, duration_s=20, length_scale=0.5)
    f = w.frame()
    assert len(f) > 50 and f.arrival_s.max() < 20
    assert ((f.prompt_tokens + f.max_tokens) <= 2048).all() and np.all(f.prompt_tokens >= 1)
