"""Replays on wall and virtual clocks: exact virtual times, identical tables run to run,
arrivals honoured, configs checked against the Scheduler."""

import pandas as pd
import pytest

import workbench as wb
from tests.sim.replays import small_workload
from workbench.runtime.modelref import ModelRef
from workbench.sim.clocks import VirtualClock, WallClock
from workbench.sim.costmodel import CostModel
from workbench.sim.replay import SAMPLE_COLUMNS, check_config, replay, scheduler_options
from workbench.workloads.workload import Workload

COST = CostModel(
    prefill_s_per_chunk=0.01, prefill_s_per_token=0.001, decode_s_per_step=0.1, decode_s_per_row=0.01
)


@pytest.fixture(scope="module")
def standin():
    return ModelRef(standin=True).load()


def test_the_virtual_clock_moves_only_when_told_and_pins_reads():
    c = VirtualClock()
    c.advance(0.25)
    c.jump_to(0.1)
    assert c() == 0.25
    c.wait_until(2.0)
    with c.pinned(1.5):
        assert c() == 1.5
    assert c() == 2.0
    with c.measuring():
        pass
    assert c() >= 2.0
    with pytest.raises(ValueError):
        c.advance(-1.0)
    w = WallClock()
    w.wait_until(0.02)
    assert w() >= 0.02


def test_one_request_on_the_cost_clock_has_exactly_the_modelled_latencies(standin):
    work = Workload(((1.0, wb.Request(prompt=[5, 6, 7, 8, 9], max_tokens=3, stop_ids=[])),))
    run = replay(work, *standin, cost_model=COST)
    r = run.report.requests.iloc[0]
    # admit at 1.0: prefill 4 tokens (0.01 + 0.004) + join of 1 row (0.1 + 0.01) = 0.124,
    # then each decode step of 1 row costs 0.11 and its token is stamped at the step's end.
    assert r.queue_s == 0.0
    assert r.ttft_s == pytest.approx(0.124 + 0.11, abs=1e-12)
    assert r.tpot_s == pytest.approx(0.11, abs=1e-12)
    assert r.e2e_s == pytest.approx(0.124 + 3 * 0.11, abs=1e-12)
    assert run.mode == "cost" and list(run.samples.columns) == SAMPLE_COLUMNS
    assert run.samples.batch_size.tolist() == [1, 1, 1]


def test_a_cost_clock_replay_gives_identical_tables_every_run(standin):
    work = small_workload(standin[1])
    a = replay(work, *standin, {"max_batch": 3, "prefill_step_size": 8}, cost_model=COST)
    b = replay(work, *standin, {"max_batch": 3, "prefill_step_size": 8}, cost_model=COST)
    pd.testing.assert_frame_equal(a.report.events, b.report.events)
    pd.testing.assert_frame_equal(a.report.requests, b.report.requests)
    pd.testing.assert_frame_equal(a.samples, b.samples)


def test_the_stand_in_gives_the_same_table_as_the_bundled_model_on_the_cost_clock(bundled, standin):
    work = small_workload(standin[1], n=6)
    real = replay(work, *bundled, {"max_batch": 2}, cost_model=COST).report.requests.drop(columns="text")
    sim = replay(work, *standin, {"max_batch": 2}, cost_model=COST).report.requests.drop(columns="text")
    pd.testing.assert_frame_equal(real, sim)


def test_submits_carry_arrival_times_even_when_the_engine_was_busy(standin):
    work = small_workload(standin[1])
    run = replay(work, *standin, {"max_batch": 1}, cost_model=COST)
    sub = run.report.events[run.report.events.kind == "submit"]
    assert sub.time_s.tolist() == [t for t, _ in work]
    assert (run.report.requests.finish_reason == "length").all()


def test_a_policy_is_configuration_shortest_prompt_first_reorders_a_queue(standin):
    reqs = [wb.Request(prompt=[3] * n, max_tokens=2, stop_ids=[]) for n in (30, 20, 2)]
    work = Workload(((0.0, reqs[0]), (0.01, reqs[1]), (0.02, reqs[2])))
    first_tokens = {}
    for policy in ("fcfs", "shortest-prompt-first", "priority"):
        w = work.with_priorities([0, 0, 1]) if policy == "priority" else work
        ev = replay(w, *standin, {"policy": policy, "max_batch": 1}, cost_model=COST).report.events
        first_tokens[policy] = ev[ev.kind == "token"].drop_duplicates("uid").uid.tolist()
    assert first_tokens == {"fcfs": [0, 1, 2], "shortest-prompt-first": [0, 2, 1], "priority": [0, 2, 1]}


def test_prefill_first_stalls_a_running_row_longer_than_decode_first_and_serves_the_joiner_sooner(standin):
    runner = wb.Request(prompt=[3, 4], max_tokens=12, stop_ids=[])
    joiner = wb.Request(prompt=[5] * 200, max_tokens=2, stop_ids=[])
    work = Workload(((0.0, runner), (0.3, joiner)))
    out = {}
    for name, cfg in {
        "decode-first": {"prefill_step_size": 32},
        "prefill-first": {"interleave_prefill": False},
    }.items():
        ev = replay(work, *standin, cfg, cost_model=COST).report.events
        gaps = ev[(ev.kind == "token") & (ev.uid == 0)].time_s.diff().max()
        ttft = ev[(ev.kind == "token") & (ev.uid == 1)].time_s.min() - 0.3
        out[name] = (gaps, ttft)
    assert out["prefill-first"][0] > out["decode-first"][0]  # the runner waits through the whole prompt
    assert (
        out["prefill-first"][1] < out["decode-first"][1]
    )  # the joiner's chunks do not wait for decode steps


def test_measured_mode_skips_idle_time_and_counts_only_engine_calls(standin):
    reqs = [wb.Request(prompt=[4, 5, 6], max_tokens=2, stop_ids=[]) for _ in range(2)]
    run = replay(Workload(((0.0, reqs[0]), (100.0, reqs[1]))), *standin, mode="measured")
    r = run.report.requests
    assert run.mode == "measured" and run.wall_s < 30
    assert run.report.events[run.report.events.kind == "submit"].time_s.tolist() == [0.0, 100.0]
    assert (r.ttft_s > 0).all() and (r.ttft_s < 30).all()


def test_wall_mode_submits_each_request_when_its_arrival_time_passes(standin):
    reqs = [wb.Request(prompt=[4, 5, 6, 7], max_tokens=3, stop_ids=[]) for _ in range(3)]
    run = replay(Workload(((0.0, reqs[0]), (0.15, reqs[1]), (0.3, reqs[2]))), *standin, mode="wall")
    ev = run.report.events
    assert ev[ev.kind == "submit"].time_s.tolist() == [0.0, 0.15, 0.3]
    first = ev[ev.kind == "token"].groupby("uid").time_s.min()
    assert (first.to_numpy() > [0.0, 0.15, 0.3]).all() and run.wall_s >= 0.3


def test_configs_are_checked_against_the_scheduler_signature(standin):
    assert {"policy", "max_batch", "prefill_step_size", "interleave_prefill", "prompt_concurrency"} <= set(
        scheduler_options()
    )
    assert "clock" not in scheduler_options()
    if "kv_budget_bytes" in scheduler_options():  # the engine's KV budget, once it has one
        assert check_config({"kv_budget_bytes": 10**9}) == {"kv_budget_bytes": 10**9}
    else:
        with pytest.raises(ValueError, match="kv_budget_bytes.*accepted"):
            check_config({"kv_budget_bytes": 10**9})
    with pytest.raises(ValueError, match=r"\['max_batchsize'\] are not Scheduler options"):
        check_config({"max_batchsize": 4})
    with pytest.raises(ValueError, match="clock"):
        check_config({"clock": None})
    with pytest.raises(ValueError, match="needs a cost_model"):
        replay(Workload(()), *standin, mode="cost")
    with pytest.raises(ValueError, match="mode must be one of"):
        replay(Workload(()), *standin, mode="virtual")
