"""Pacing (a per-iteration time budget): the planner's arithmetic on a known cost model,
what it learns from measurements, its options' errors, the age-bounded shortest-first
policy, and that pacing changes no token."""

import math

import pytest

import workbench as wb
from tests.cost_models import PACING_COST as COST
from workbench.engine.admission import Queued, ShortestPromptFirst
from workbench.engine.levers.cost import CostModel
from workbench.engine.levers.pacing import Iteration, Pacer, Pacing, pacing_from


def test_the_chunk_is_the_most_tokens_whose_predicted_time_fits_the_budget_in_powers_of_two():
    pacer = Pacer(Pacing(cost_model=COST), prefill_step_size=512)
    # one row, no pair cost: 0.002 + 0.001 k <= 0.0205 -> k = 18, run as 16 (a power of two)
    assert pacer.chunk_tokens(0.0205, 1, 0, 1000, first=False) == 16
    assert COST.prefill_s(18, 0, 1) <= 0.0205 < COST.prefill_s(19, 0, 1)
    assert pacer.chunk_tokens(0.0705, 1, 0, 1000, first=False) == 64  # 68 fit
    assert pacer.chunk_tokens(0.0705, 1, 0, 40, first=False) == 40  # a prompt's last tokens, exactly
    # two rows cost twice per token: 0.002 + 0.002 k <= 0.020 -> k = 9, below the 16-token floor
    assert pacer.chunk_tokens(0.020, 2, 0, 1000, first=False) == 0
    assert pacer.chunk_tokens(0.020, 2, 0, 1000, first=True) == 16  # an idle iteration still progresses
    assert pacer.chunk_tokens(0.020, 1, 0, 5, first=False) == 5  # what remains, if it fits
    assert pacer.chunk_tokens(math.inf, 1, 0, 5000, first=False) == 512  # no running row: the cap


def test_the_budget_is_the_target_minus_the_predicted_decode_step():
    pacer = Pacer(Pacing(itl_target_steps=3.0, cost_model=COST), 512)
    step = COST.decode_s(4, 100)
    assert pacer.target_s(4, 100) == pytest.approx(3 * step)
    assert pacer.prefill_budget_s(4, 100) == pytest.approx(2 * step)
    assert pacer.prefill_budget_s(0, 0) == math.inf
    fixed = Pacer(Pacing(itl_target_s=0.05, cost_model=COST), 512)
    assert fixed.prefill_budget_s(4, 100) == pytest.approx(0.05 - step)


def test_measurements_correct_a_prior_that_is_off_by_a_factor():
    pacer = Pacer(Pacing(cost_model=COST), 512)
    for k in (16, 32, 64):  # the machine is twice as slow as the prior says
        pacer.observe_prefill(1, k, 0, 2 * COST.prefill_s(k, 0, 1))
        pacer.observe_decode(4, 100, 2 * COST.decode_s(4, 100))
    assert pacer.prefill_s(1, 40, 0) == pytest.approx(2 * COST.prefill_s(40, 0, 1))
    assert pacer.decode_s(4, 100) == pytest.approx(2 * COST.decode_s(4, 100))


def test_without_a_prior_the_costs_are_fitted_from_measured_chunks():
    pacer = Pacer(Pacing(), 512)
    assert pacer.prefill_s(1, 10, 0) is None
    assert pacer.chunk_tokens(0.5, 1, 0, 100, first=True) == 16  # a probe chunk
    assert pacer.chunk_tokens(0.5, 1, 0, 100, first=False) == 0
    truth = lambda b, k: 0.003 + 0.0005 * b * k  # noqa: E731
    for b, k in ((1, 16), (1, 64), (2, 32), (1, 128)):
        pacer.observe_prefill(b, k, 0, truth(b, k))
    assert pacer.prefill_s(1, 200, 0) == pytest.approx(truth(1, 200), rel=1e-6)
    for s in (0.010, 0.012, 0.011):
        pacer.observe_decode(3, 50, s)
    assert pacer.decode_s(3, 50) == pytest.approx(0.011)


def test_an_efficient_chunk_runs_over_the_budget_when_the_fixed_cost_dominates():
    gpu_like = CostModel(prefill_s_per_chunk=0.005, prefill_s_per_token=0.00002, decode_s_per_step=0.005)
    pacer = Pacer(Pacing(cost_model=gpu_like), 512)
    assert pacer.efficient_tokens(1, 0) == 250  # 250 tokens cost as much as the forward's fixed part
    # the budget fits 50 tokens, mostly fixed cost: wait, or (nothing ran yet) run 256 over it
    assert pacer.chunk_tokens(0.006, 1, 0, 1000, first=False) == 0
    assert pacer.chunk_tokens(0.006, 1, 0, 1000, first=True) == 256


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(itl_target_s=0), "itl_target_s"),
        (dict(itl_target_steps=1.0), "itl_target_steps"),
        (dict(min_chunk_tokens=0), "min_chunk_tokens"),
        (dict(cost_model="x"), "cost_model"),
    ],
)
def test_bad_pacing_options_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        Pacing(**bad)


def test_pacing_accepts_a_flag_a_target_or_options_and_refuses_the_rest(bundled):
    assert pacing_from(None) is None and pacing_from(False) is None
    assert pacing_from(True) == Pacing() and pacing_from(0.25) == Pacing(itl_target_s=0.25)
    with pytest.raises(ValueError, match="pacing"):
        pacing_from("fast")
    with pytest.raises(ValueError, match="pacing"):
        wb.Scheduler(*bundled, pacing="fast")


def test_shortest_first_serves_a_request_that_waited_too_long_first():
    q = [
        Queued(0, 300, 0, 0, waited_s=5.0),
        Queued(1, 8, 0, 1, waited_s=1.0),
        Queued(2, 40, 0, 2, waited_s=0.5),
        Queued(3, 500, 0, 3, waited_s=4.0),
    ]
    assert ShortestPromptFirst().order(q) == [1, 2, 0, 3]
    assert ShortestPromptFirst(max_wait_s=3.0).order(q) == [0, 3, 1, 2]  # the late ones by arrival
    with pytest.raises(ValueError, match="max_wait_s"):
        ShortestPromptFirst(max_wait_s=0)


def test_an_age_bound_ends_the_starvation_of_a_long_prompt(bundled, prompt):
    """Short prompts keep arriving; without a bound the long one waits for all of them."""

    def admitted_at(policy):
        now = [0.0]
        sched = wb.Scheduler(*bundled, max_batch=1, policy=policy, clock=lambda: now[0])
        long_uid = sched.submit(wb.Request(prompt=prompt(40), max_tokens=2))
        order = []
        for i in range(6):
            sched.submit(wb.Request(prompt=prompt(3, 7 * i), max_tokens=2))
            now[0] += 1.0
            order += [e.uid for e in sched.admit() if e.kind == "admit"]
            sched.step(), sched.step(), sched.step()
            sched.filter()
        return order.index(long_uid) if long_uid in order else None

    assert admitted_at(ShortestPromptFirst()) is None  # starved for all six rounds
    assert admitted_at(ShortestPromptFirst(max_wait_s=2.5)) == 2


def test_paced_runs_give_the_same_tokens_as_fixed_chunks(run_specs):
    fixed, fixed_lp, _, _ = run_specs(prefill_step_size=16)
    for pacing in (True, Pacing(itl_target_s=1e-4, min_chunk_tokens=5)):
        paced, paced_lp, _, sched = run_specs(prefill_step_size=16, pacing=pacing)
        assert paced == fixed
        for a, b in zip(paced_lp, fixed_lp):
            assert a == pytest.approx(b, abs=1e-4)
        assert sched.pacer.prefill_samples  # it measured its chunks


def test_the_pacer_reports_each_prediction_against_what_was_measured():
    pacer = Pacer(Pacing(cost_model=COST), 512)
    pacer.observe_prefill(1, 32, 0, 2 * COST.prefill_s(32, 0, 1))  # first: only the prior (ratio 1)
    pacer.observe_prefill(1, 64, 0, 2 * COST.prefill_s(64, 0, 1))  # second: corrected by the first
    err = pacer.prediction_errors()
    assert err.kind.tolist() == ["prefill", "prefill"]
    assert err.prior_error.tolist() == pytest.approx([-0.5, -0.5])  # the prior is 2x optimistic
    assert err.error.tolist() == pytest.approx([-0.5, 0.0])  # the correction removes it


def test_the_pacer_learns_the_decode_time_between_two_admits_one_step_apart():
    pacer = Pacer(Pacing(cost_model=COST), 512)
    pacer.begin_iteration(0.0, 0, 0, 0)  # nothing ran before: nothing learned
    pacer.observe_prefill(1, 32, 0, 0.3)
    pacer.end_iteration(0.5)
    assert pacer.last_iteration == Iteration(0.0, 0.5, 0.3) and not pacer.decode_samples
    pacer.begin_iteration(0.7, 1, 1, 32)  # it ran prefill: from its end, 0.2 s
    pacer.end_iteration(0.8)  # no prefill this time
    pacer.begin_iteration(1.2, 2, 1, 33)  # from its start: 0.5 s
    pacer.end_iteration(1.3)
    pacer.begin_iteration(2.0, 4, 1, 35)  # two steps in between: not one iteration
    assert list(pacer.decode_samples) == [(1, 32, pytest.approx(0.2)), (1, 33, pytest.approx(0.5))]


@pytest.mark.parametrize("spec", [-1, 0, 0.0])
def test_a_nonpositive_pacing_target_names_pacing(spec):
    from workbench.engine.levers.pacing import pacing_from

    with pytest.raises(ValueError, match=rf"pacing={spec!r}: a target in seconds must be > 0"):
        pacing_from(spec)
