"""The packed bench compares the engines at equal capacity: mlx-lm's adapter can cap its
requests in flight at the workbench's ``max_batch`` (``MlxLmEngine(max_in_flight=...)``), the
bench runs it beside mlx-lm as shipped and measures the latency goals against it, saying so."""

import pandas as pd
import pytest

from workbench.bench.engines import Arrival, MlxLmEngine, drive
from workbench.bench.packed import (
    MAX_BATCH,
    MLX_LM,
    MLX_LM_EQUAL,
    PACKED,
    PADDED,
    PackedBenchResult,
    decode_table,
    factories,
    goal_lines,
    goal_reference,
    kv_table,
    summary,
)
from workbench.bench.packed_cost import COST_MODEL, cost_factories, run_on_cost_clock
from workbench.observe.events import events_frame
from workbench.observe.metrics import request_metrics
from workbench.sim.costmodel import CostModel
from workbench.workloads.workload import prompt_of_length

# 3 rows: two finish together while a prefilled prompt waits, so mlx-lm as shipped holds 4
# requests at once (tests/bench/test_latency_goals.py)
LENGTHS = (6, 3, 3, 8, 8, 8, 5)


def arrivals(tok):
    return [Arrival(tuple(prompt_of_length(tok, 5 + i, 3 * i)), m) for i, m in enumerate(LENGTHS)]


@pytest.mark.model
def test_mlx_lm_capped_at_max_batch_holds_no_more_and_gives_every_request_its_tokens(bundled):
    model, tok = bundled
    shipped, capped = MlxLmEngine(model, 3, 64), MlxLmEngine(model, 3, 64, max_in_flight=3)
    drive(shipped, arrivals(tok))
    drive(capped, arrivals(tok))
    assert shipped.peak_rows == 4  # the arrivals do make mlx-lm pass max_batch
    assert capped.peak_rows == 3
    tokens = lambda e: events_frame(e.events).query("kind == 'token'").groupby("uid").token.apply(list)  # noqa: E731
    got, want = tokens(capped), tokens(shipped)
    assert [len(got[u]) for u in range(len(LENGTHS))] == list(LENGTHS)
    assert list(got.index) == list(range(len(LENGTHS)))  # the adapter's uids, in submit order
    # greedy rows in the same BatchGenerator: the first token of each is its prompt's argmax
    assert [got[u][0] for u in got.index] == [want[u][0] for u in want.index]


@pytest.mark.model
def test_the_cap_takes_a_held_prompt_in_the_iteration_a_row_ends_as_mlx_lm_does(bundled):
    # 2 rows, 3 requests: the third joins when the second ends, and mlx-lm as shipped never
    # holds more than 2 here, so the cap must change nothing: the same tokens at the same
    # iterations (a cap that inserted only after the ending row left would start its prefill
    # one iteration later)
    model, tok = bundled
    work = [Arrival(tuple(prompt_of_length(tok, 6 + i, 5 * i)), m) for i, m in enumerate((10, 3, 4))]
    shipped, capped = MlxLmEngine(model, 2, 64), MlxLmEngine(model, 2, 64, max_in_flight=2)
    drive(shipped, work)
    drive(capped, work)
    assert shipped.peak_rows == 2 and capped.peak_rows == 2
    steps = lambda e: [(x.kind, x.uid, x.step, x.token) for x in e.events]  # noqa: E731
    assert steps(capped) == steps(shipped)


@pytest.mark.model
def test_a_held_request_waits_in_the_adapter_and_its_ttft_counts_the_wait(bundled):
    model, tok = bundled
    engine = MlxLmEngine(model, 2, 64, max_in_flight=1)
    drive(engine, [Arrival(tuple(prompt_of_length(tok, 8, s)), 4) for s in (0, 1, 2)])
    ev = events_frame(engine.events)
    submit = ev[ev.kind == "submit"].set_index("uid").time_s
    first = ev[ev.kind == "token"].groupby("uid").time_s.min()
    finish = ev[ev.kind == "finish"].set_index("uid").time_s
    assert engine.peak_rows == 1
    assert first[1] > finish[0] and first[2] > finish[1]  # one at a time, in submit order
    assert submit[2] < finish[0]  # submitted at once: the wait is inside its TTFT
    ttft = request_metrics(ev).set_index("uid").ttft_s
    assert ttft[2] == pytest.approx(first[2] - submit[2]) and ttft[2] > finish[0] - submit[0]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_a_bad_max_in_flight_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=r"max_in_flight must be an int >= 1 .*got"):
        MlxLmEngine(None, 8, 512, max_in_flight=bad)


@pytest.mark.model
def test_the_bench_runs_mlx_lm_at_the_workbench_capacity(bundled):
    model, tok = bundled
    engine = factories(model, tok, [MLX_LM_EQUAL])[MLX_LM_EQUAL]()
    try:
        assert engine.max_in_flight == MAX_BATCH
    finally:
        engine.close()


def result(with_equal=True):
    engines = [(PADDED, 2.0, 0.2, 8), (PACKED, 1.0, 0.1, 8), (MLX_LM, 1.0, 0.05, 12)]
    engines += [(MLX_LM_EQUAL, 2.0, 0.2, 8)] if with_equal else []
    decode = pd.DataFrame([dict(engine=e, B=8, pair=0, tok_per_s=100.0) for e in (PADDED, PACKED, MLX_LM)])
    lat = pd.DataFrame(
        [
            dict(scenario="azure", engine=e, round=0, ttft_p95_s=t, itl_p95_s=i, peak_rows=p)
            for e, t, i, p in engines
        ]
    )
    kv = pd.DataFrame(
        [
            dict(
                scenario="azure",
                engine=PACKED,
                round=0,
                peak_held_bytes=1,
                peak_token_bytes=1,
                peak_allocated_bytes=1,
            )
        ]
    )
    return PackedBenchResult(decode, lat, kv, {})


def test_the_goals_are_measured_against_mlx_lm_at_equal_capacity_and_say_so():
    r = result()
    s = summary(r)
    assert goal_reference(s) == MLX_LM_EQUAL
    packed = s.set_index("engine").loc[PACKED]
    assert packed.ttft_p95_vs_mlx_lm_equal == 0.5 and packed.ttft_p95_vs_mlx_lm == 1.0  # both kept
    lines = goal_lines(s, kv_table(r), decode_table(r))
    assert (
        lines[0].startswith(f"- reference for the latency goals: {MLX_LM_EQUAL}")
        and "equal capacity" in lines[0]
    )
    assert lines[1].startswith(f"- azure, workbench, packed: TTFT p95 0.50x {MLX_LM_EQUAL}") and lines[
        1
    ].endswith(": met")
    assert lines[3].endswith("both goals at once: met")
    shipped = [x for x in lines if "against mlx-lm as shipped" in x]
    assert shipped == [
        "- azure, workbench, packed: against mlx-lm as shipped, TTFT p95 1.00x, ITL p95 2.00x "
        "(1000.0 / 50.0 ms): both goals missed"
    ]
    peak = next(x for x in lines if "requests in flight at most" in x)
    assert f"mlx-lm 12, {MLX_LM_EQUAL} 8, the workbench 8" in peak


def test_a_run_without_the_equal_capacity_engine_says_its_reference_is_mlx_lm_as_shipped():
    r = result(with_equal=False)
    s = summary(r)
    assert goal_reference(s) == MLX_LM and "ttft_p95_vs_mlx_lm_equal" not in s
    lines = goal_lines(s, kv_table(r), decode_table(r))
    assert "mlx-lm as shipped (this run has no equal-capacity mlx-lm)" in lines[0]
    assert lines[1].startswith("- azure, workbench, packed: TTFT p95 1.00x mlx-lm (")
    assert not [x for x in lines if "against mlx-lm as shipped" in x]


@pytest.mark.model
def test_the_cost_clock_runs_mlx_lm_at_equal_capacity_and_reports_its_requests_in_flight(bundled):
    model, tok = bundled
    fac = cost_factories(model, tok, CostModel.load(COST_MODEL), (16,), paced_steps=())
    work = [Arrival(tuple(prompt_of_length(tok, 8 + i, 7 * i)), 3 + i % 4, at_s=0.001 * i) for i in range(12)]
    shipped, _, _ = run_on_cost_clock(fac[MLX_LM], work)
    equal, _, _ = run_on_cost_clock(fac[MLX_LM_EQUAL], work)
    assert shipped.attrs["peak_rows"] > MAX_BATCH  # 12 requests at once: mlx-lm as shipped passes 8
    assert equal.attrs["peak_rows"] == MAX_BATCH
    assert (
        (equal.kind == "token").sum() == (shipped.kind == "token").sum() == sum(3 + i % 4 for i in range(12))
    )
