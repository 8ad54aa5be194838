"""The pacing frontier on a cost clock (deterministic): a paced engine keeps every
running row's inter-token gap near its target while the fixed-chunk engine does not,
tokens are the same in every engine, the summary's numbers come from the runs, and the
floors are the cost of each prompt alone, which no engine beats."""

import pandas as pd
import pytest

import workbench as wb
from tests.cost_models import PACING_COST as COST
from workbench.bench.engines import Arrival
from workbench.bench.pacing import FIXED, floor_verdicts, frontier_runs, frontier_summary, paced_name, versus
from workbench.bench.scenarios import MLX_LM
from workbench.observe.metrics import SLO
from workbench.workloads.workload import prompt_of_length

LENGTHS = (24, 300, 8, 160, 40, 200, 16, 64)


@pytest.fixture(scope="module")
def runs():
    model, tok = wb.load("tiny-llama")  # times come from COST (mode="cost"): the smallest bundled model
    arrivals = [
        Arrival(tuple(prompt_of_length(tok, n, 31 * i)), 12, at_s=0.03 * i) for i, n in enumerate(LENGTHS)
    ]
    return frontier_runs(
        model, tok, arrivals, 4, 512, (2, 4), 1, mode="cost", cost_model=COST, echo=lambda s: None
    )


def test_a_paced_engine_keeps_running_rows_gaps_near_the_target(runs):
    requests, gaps = runs
    step = COST.decode_s(4, 0)
    worst = gaps.groupby("engine").gap_s.max()
    assert worst[FIXED] > 20 * step  # a 300-token prompt in one chunk stalls every running row
    for t in (2, 4):
        # the target (t x the step) plus what its prediction cannot see: a join's [n, 1] forward
        # and the width term; never a whole prompt
        assert worst[paced_name(t)] <= (t + 1.5) * COST.decode_s(4, 400), t
    assert worst[paced_name(2)] <= worst[paced_name(4)] < worst[FIXED] / 5


def test_every_engine_gives_every_request_the_same_tokens(runs):
    requests, _ = runs
    assert set(requests.engine) == {MLX_LM, FIXED, paced_name(2), paced_name(4)}
    by_engine = {e: r.sort_values("uid").text.tolist() for e, r in requests.groupby("engine")}
    assert all(r.finish_reason.eq("length").all() for _, r in requests.groupby("engine"))
    assert by_engine[FIXED] == by_engine[paced_name(2)] == by_engine[paced_name(4)]
    assert requests.groupby("engine").generated_tokens.sum().nunique() == 1


def test_the_summary_is_computed_from_the_runs(runs):
    requests, gaps = runs
    table = frontier_summary(requests, gaps, SLO(ttft_s=5.0, tpot_s=0.5)).set_index("engine")
    fixed = requests[requests.engine == FIXED]
    assert table.loc[FIXED, "ttft_p95_s"] == pytest.approx(fixed.ttft_s.quantile(0.95))
    assert table.loc[FIXED, "itl_max_s"] == pytest.approx(gaps[gaps.engine == FIXED].gap_s.max())
    assert (
        table.loc[paced_name(2), "target"] == 2 and table.loc[MLX_LM, "target"] != table.loc[MLX_LM, "target"]
    )
    ratios = versus(table.reset_index()).set_index("engine")
    floors = ["ttft_floor_p95_s", "itl_floor_p95_s"]  # against mlx-lm's measured p95, not its floor
    assert table.goodput_req_per_s.gt(0).all() and ratios.loc[MLX_LM].drop(floors).eq(1.0).all()
    assert ratios.loc[FIXED, "itl_max_s"] == pytest.approx(
        table.loc[FIXED, "itl_max_s"] / table.loc[MLX_LM, "itl_max_s"]
    )


def test_the_ttft_floor_is_each_prompt_alone_and_no_engine_beats_it(runs):
    requests, gaps = runs
    # alone, in either engine: the first n - 1 prompt tokens in one chunk, then the last
    # token's [1, 1] forward and the first step's (both engines launch it before reading
    # the first token, and the cost clock charges a forward when it is launched)
    alone_s = {n: COST.prefill_s(n - 1, 0, 1) + 2 * COST.decode_s(1, 0) for n in LENGTHS}
    for _, r in requests.iterrows():
        assert r.ttft_floor_s == pytest.approx(alone_s[r.prompt_tokens])
        assert r.ttft_s >= r.ttft_floor_s - 1e-9, (r.engine, r.uid)
    assert gaps.itl_floor_s.to_numpy() == pytest.approx(COST.decode_s(4, 0))  # one [4, 1] step


def test_the_summary_reports_the_floors_p95_against_mlx_lms_p95(runs):
    requests, gaps = runs
    table = frontier_summary(requests, gaps, SLO(ttft_s=5.0, tpot_s=0.5)).set_index("engine")
    floor_p95 = pd.Series([COST.prefill_s(n - 1, 0, 1) + 2 * COST.decode_s(1, 0) for n in LENGTHS]).quantile(
        0.95
    )
    assert table.ttft_floor_p95_s.to_numpy() == pytest.approx(floor_p95)
    assert table.itl_floor_p95_s.to_numpy() == pytest.approx(COST.decode_s(4, 0))
    assert (table.ttft_p95_s >= table.ttft_floor_p95_s).all()
    ratios = versus(table.reset_index()).set_index("engine")
    mlx = table.loc[MLX_LM]
    assert ratios.ttft_floor_p95_s.to_numpy() == pytest.approx(floor_p95 / mlx.ttft_p95_s)
    assert ratios.itl_floor_p95_s.to_numpy() == pytest.approx(COST.decode_s(4, 0) / mlx.itl_p95_s)
    verdicts = floor_verdicts(table.reset_index()).set_index("measure")
    assert verdicts.loc["ttft", "floor_ratio"] == pytest.approx(floor_p95 / mlx.ttft_p95_s)
    assert verdicts.loc["ttft", "reachable"] == (floor_p95 / mlx.ttft_p95_s <= 0.6)
    assert verdicts.goal_ratio.tolist() == [0.6, 1.0]


def test_runs_stored_without_floors_still_summarize(runs):
    requests, gaps = runs
    table = frontier_summary(
        requests.drop(columns="ttft_floor_s"), gaps.drop(columns="itl_floor_s"), SLO(ttft_s=5.0, tpot_s=0.5)
    )
    assert table.ttft_floor_p95_s.isna().all() and table.itl_floor_p95_s.isna().all()
    assert not floor_verdicts(table).reachable.any()
    assert versus(table).ttft_p95_s.notna().all()


def test_a_cost_clock_frontier_needs_a_cost_model():
    with pytest.raises(ValueError, match="cost_model"):
        frontier_runs(None, None, [], 4, 512, (2,), 1, mode="cost")
    with pytest.raises(ValueError, match="floor_repeats"):
        frontier_runs(None, None, [], 4, 512, (2,), 1, mode="cost", cost_model=COST, floor_repeats=-1)
