"""The comparison table and its views: documented columns, exact numbers on hand-built
runs, deterministic text forms."""

import math

import pandas as pd
import pytest
from matplotlib.figure import Figure

import workbench as wb
from tests.cost_models import SIM_COST as COST
from tests.observe.event_logs import event_log
from workbench.observe.metrics import SLO
from workbench.runtime.modelref import ModelRef
from workbench.sim.compare import COMPARE_COLUMNS, comparison_text, replay_many, summarize, summary_row
from workbench.views.replay import latency_cdf_text, occupancy_text, render_latency_cdfs, render_occupancy
from workbench.workloads.workload import Workload

from .replays import hand_replay


def _hand_run(name="hand"):
    # uid 0: submit 0, admit 0, join 0, tokens at 1, 2, 3 s; uid 1: submit 1, admit 2, tokens at 3, 4 s
    ev = event_log(
        """
        submit 0 0 0.0 n_tokens=4
        admit 0 0 0.0
        join 0 0 0.0
        submit 1 0 1.0 n_tokens=2
        token 0 0 1.0 token=1
        admit 1 1 2.0
        join 1 1 2.0
        token 0 1 2.0 token=1
        token 0 2 3.0 token=1
        finish 0 2 3.0 finish_reason=length
        token 1 2 3.0 token=1
        evict 0 3 3.0
        token 1 3 4.0 token=1
        finish 1 3 4.0 finish_reason=length
        evict 1 4 4.0
        """
    )
    samples = [
        (0.0, 0, 1, 1, 0, 100, 4, 4, 0),
        (2.0, 1, 2, 0, 0, 300, 6, 12, 3),
        (3.0, 3, 1, 0, 0, 200, 3, 3, 0),
        (4.0, 4, 0, 0, 0, 0, 0, 0, 0),
    ]
    return hand_replay(ev, samples, name)


def test_a_summary_row_has_exact_latencies_rates_kv_and_padding():
    row = summary_row(_hand_run(), SLO(ttft_s=1.5))
    assert list(row) == COMPARE_COLUMNS
    assert (row["requests"], row["finished"]) == (2, 2)
    assert row["ttft_p50_s"] == 1.5 and row["ttft_p99_s"] == pytest.approx(1.99)  # ttft 1 and 2 s
    assert row["tpot_p50_s"] == 1.0 and row["e2e_p50_s"] == 3.0
    assert row["throughput_tok_per_s"] == 5 / 4.0 and row["makespan_s"] == 4.0
    assert row["goodput_req_per_s"] == 1 / 4.0 and row["slo_attainment"] == 0.5
    assert (row["peak_kv_bytes"], row["peak_kv_tokens"]) == (300, 12)
    assert row["padding_waste"] == pytest.approx(3 / 19)
    assert row["mean_batch_size"] == pytest.approx(4 / 3)


def test_compare_runs_each_config_on_the_same_workload_and_returns_the_documented_columns():
    standin = ModelRef(standin=True)
    tok = standin.load()[1]
    work = wb.synthetic(
        tok,
        8,
        rate_per_s=20.0,
        seed=1,
        prompt_tokens=wb.workloads.distributions.Uniform(2, 30),
        output_tokens=4,
    )
    configs = {
        "fcfs": {"max_batch": 2},
        "spf": {"max_batch": 2, "policy": "shortest-prompt-first"},
        "wide": {"max_batch": 8},
    }
    table = wb.compare(work, configs, standin, cost_model=COST, slo=SLO(ttft_s=0.5))
    assert list(table.columns) == COMPARE_COLUMNS and table.config.tolist() == ["fcfs", "spf", "wide"]
    assert (table.requests == 8).all() and (table.finished == 8).all()
    assert table.peak_kv_tokens.iloc[2] >= table.peak_kv_tokens.iloc[0]
    runs = replay_many(work, configs, standin, cost_model=COST)
    pd.testing.assert_frame_equal(summarize(runs, SLO(ttft_s=0.5)), table)
    text = comparison_text(table)
    assert text.splitlines()[0].split() == ["config", "fcfs", "spf", "wide"] and "TTFT p95 (ms)" in text
    assert text == comparison_text(wb.compare(work, configs, standin, cost_model=COST, slo=SLO(ttft_s=0.5)))


def test_the_latency_cdf_text_reads_each_run_at_fixed_quantiles():
    runs = {"a": _hand_run("a"), "b": _hand_run("b")}
    assert latency_cdf_text(runs, "ttft_s", quantiles=(0, 50, 100)) == (
        "               p0     p50    p100\n"
        "TTFT (ms)                        \n"
        "a          1000.0  1500.0  2000.0\n"
        "b          1000.0  1500.0  2000.0"
    )


def test_the_occupancy_text_gives_queue_and_batch_size_at_even_times():
    text = occupancy_text({"a": _hand_run()}, n_times=5)
    assert text.splitlines()[0].split() == ["0.00", "1.00", "2.00", "3.00", "4.00"]
    assert text.splitlines()[2].split() == ["a", "0", "1", "0", "0", "0"]  # queued: uid 1 waits from 1 to 2 s
    assert text.splitlines()[-1].split() == ["a", "1", "1", "2", "1", "0"]  # rows in the batch


def test_the_figures_have_one_panel_per_latency_and_two_for_occupancy():
    runs = {"a": _hand_run()}
    assert isinstance(render_latency_cdfs(runs), Figure) and len(render_latency_cdfs(runs).axes) == 3
    assert len(render_occupancy(runs, title="t").axes) == 2  # one batch-size lane per run, the queue


def test_an_empty_run_summarizes_to_nans_not_errors():
    run = hand_replay(name="empty")
    row = summary_row(run)
    assert row["requests"] == 0 and math.isnan(row["ttft_p50_s"]) and row["peak_kv_bytes"] == 0
    assert math.isnan(row["slo_attainment"]) and math.isnan(row["goodput_req_per_s"])
    assert Workload(()).text() == "workload: 0 requests"
