"""Pacing in the packed layout: each packed forward's prefill tokens capped so its predicted
time stays within the time budget (beside max_num_batched_tokens), checked from the engine's
own snapshots on a cost clock; every row equal to its run alone; prefill progresses when the
budget fits none; the prior corrected by measured forwards and the fit learned without one;
forks, checkpoints and the views keep the setting; bad settings name the field."""

import math

import pytest

import workbench as wb
from tests.engine.test_packed import staggered as packed_staggered
from workbench.engine.levers.cost import CostModel
from workbench.engine.levers.pacing import Pacing
from workbench.engine.levers.packed_pacing import PacedForward, PackedPacer, packed_features
from workbench.engine.packed.plan import Want, plan_chunks
from workbench.observe.packed import Chunk, budget_rows
from workbench.sim.clocks import VirtualClock
from workbench.sim.costmodel import CostedModel
from workbench.verify import oracle
from workbench.views.packed import budget_text, packed_text, render_token_budget
from workbench.workloads.workload import prompt_of_length

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("solo_references_once")]

# p_chunk, p_token, p_pair, d_step, d_row, d_kv: a decode step of 4 rows ~5 ms, a prefill token 0.1 ms
COST = CostModel(0.002, 0.0001, 1e-6, 0.004, 0.0003, 1e-6)
SPECS = ((3, 12), (60, 9), (17, 14), (1, 5), (33, 10), (9, 16))  # (prompt tokens, max_tokens)
BUDGET = 64  # max_num_batched_tokens


def on_cost_clock(model, tok, pacing, charged=COST, **settings):
    """A packed scheduler whose every forward advances a virtual clock by ``charged``'s
    ``packed_s`` (not pipelined: each forward is charged when built, then read)."""
    clock = VirtualClock()
    costed = CostedModel(model, clock, charged)
    cfg = dict(layout="packed", max_batch=4, page_size=4, max_num_batched_tokens=BUDGET, pipeline=False)
    sched = wb.Scheduler(costed, tok, clock=clock, history_size=500, pacing=pacing, **(cfg | settings))
    return sched, costed


def staggered(sched, costed, tok, specs=SPECS, every=2):
    """One request every ``every`` steps (``tests/engine/test_packed.py``'s driver, the books
    checked after each call), every forward charged on the cost clock."""
    with costed.charging():
        return packed_staggered(sched, tok, specs, every)


def paced_rows(sched):
    return [r for r in budget_rows(sched.history) if r.paced_tokens is not None]


def test_paced_packed_rows_equal_their_solo_runs_and_every_forward_stays_in_its_budget(bundled):
    model, tok = bundled
    pacing = Pacing(itl_target_steps=2.0, cost_model=COST, min_chunk_tokens=4)
    sched, costed = on_cost_clock(model, tok, pacing)
    uids = staggered(sched, costed, tok)
    check = oracle.solo_check(model, sched, uids, atol=1e-4)
    assert check.ok, check.text()
    rows = paced_rows(sched)
    assert rows and all(r.decode_tokens + r.prefill_tokens <= min(r.paced_tokens, BUDGET) for r in rows)
    for r in rows:  # within the time budget, or the progress floor (4 prefill tokens) over it
        assert r.predicted_s <= r.time_budget_s or r.prefill_tokens <= pacing.min_chunk_tokens, r
    capped = [r for r in rows if r.paced_tokens < BUDGET]
    assert capped and any(r.decode_tokens and r.prefill_tokens for r in capped), (
        "some mixed forward was capped"
    )
    # the budget is 2 x the decode rows' forward: a capped forward's predicted time is close to it
    assert all(r.predicted_s > 0.8 * r.time_budget_s for r in capped if r.prefill_tokens > 4)
    # on the cost clock the prediction is what the forward cost: the prior, uncorrected
    err = sched.pacer.prediction_errors()
    assert set(err.kind) == {"packed"} and err.error.abs().max() < 1e-9


def test_the_time_budget_cuts_the_running_rows_gaps_at_the_same_tokens(bundled):
    model, tok = bundled
    gaps, tokens = {}, {}
    for name, pacing in (("off", None), ("paced", Pacing(itl_target_steps=2.0, cost_model=COST))):
        sched, costed = on_cost_clock(model, tok, pacing)
        uids = staggered(sched, costed, tok)
        tokens[name] = [sched.tokens(u) for u in uids]
        times = {}
        for e in sched.events:
            if e.kind == "token":
                times.setdefault(e.uid, []).append(e.time_s)
        gaps[name] = max(b - a for t in times.values() for a, b in zip(t, t[1:]))
    assert tokens["paced"] == tokens["off"]
    assert gaps["paced"] < gaps["off"]


def test_a_budget_that_fits_no_prefill_still_moves_prefill_by_the_floor(bundled):
    model, tok = bundled
    pacing = Pacing(itl_target_s=1e-6, cost_model=COST, min_chunk_tokens=1)  # below any forward
    sched, costed = on_cost_clock(model, tok, pacing)
    uids = staggered(sched, costed, tok, every=1)
    assert all(sched.finish_reason(u) == "length" for u in uids)  # nobody starved
    mixed = [r for r in paced_rows(sched) if r.decode_tokens and r.prefill_tokens]
    assert mixed and all(r.prefill_tokens == 1 for r in mixed)  # one token of progress a forward
    assert oracle.solo_check(model, sched, uids, atol=1e-4).ok


def test_measured_forwards_correct_a_prior_that_is_off_by_a_factor(bundled):
    model, tok = bundled
    slow = CostModel(*(2 * v for v in (0.002, 0.0001, 1e-6, 0.004, 0.0003, 1e-6)))  # the machine: 2x
    sched, costed = on_cost_clock(model, tok, Pacing(itl_target_steps=2.0, cost_model=COST), charged=slow)
    staggered(sched, costed, tok)
    err = sched.pacer.prediction_errors()
    assert err.prior_error.to_numpy() == pytest.approx(-0.5)  # the prior is 2x optimistic
    assert err.error.iloc[0] == pytest.approx(-0.5) and err.error.iloc[1:].abs().max() < 1e-9
    rows = paced_rows(sched)
    assert all(r.predicted_s <= r.time_budget_s or r.prefill_tokens <= 16 for r in rows)


def test_pipelined_paced_rows_on_the_wall_clock_equal_their_solo_runs(bundled):
    model, tok = bundled
    sched = wb.Scheduler(
        model, tok, layout="packed", max_batch=4, page_size=4, max_num_batched_tokens=32, pacing=True
    )
    uids = [
        sched.submit(wb.Request(prompt=prompt_of_length(tok, n, 13 * i), max_tokens=m, stop_ids=[]))
        for i, (n, m) in enumerate(SPECS)
    ]
    sched.run()
    check = oracle.solo_check(model, sched, uids, atol=1e-4)
    assert check.ok, check.text()
    assert isinstance(sched.pacer, PackedPacer) and len(sched.pacer.packed_samples) > 5


def test_forks_and_checkpoints_keep_the_pacing(bundled):
    model, tok = bundled
    pacing = Pacing(itl_target_steps=2.0, cost_model=COST, min_chunk_tokens=4)
    sched, costed = on_cost_clock(model, tok, pacing)
    uids = [
        sched.submit(wb.Request(prompt=prompt_of_length(tok, n, 13 * i), max_tokens=m, stop_ids=[]))
        for i, (n, m) in enumerate(SPECS)
    ]
    for _ in range(5):
        with costed.charging():
            sched._iterate()
    cp, fork = sched.checkpoint(), sched.fork()
    assert fork.pacing == pacing and isinstance(fork.pacer, PackedPacer)
    assert fork.snapshot().packed.paced_tokens == sched.snapshot().packed.paced_tokens
    with costed.charging():
        sched.run()
    first = {u: sched.tokens(u) for u in uids}
    sched.restore(cp)
    assert sched.snapshot().packed.paced_tokens is not None
    with costed.charging():
        sched.run()
    assert {u: sched.tokens(u) for u in uids} == first
    fork.run()
    assert {u: fork.tokens(u) for u in uids} == first
    plans = lambda s: [(r.step, r.decode_tokens, r.prefill_tokens, r.paced_tokens) for r in paced_rows(s)]  # noqa: E731
    assert plans(fork) == plans(sched)  # the same caps: the fork plans with the same pacing


@pytest.mark.parametrize(
    "pacing, field",
    [
        ("fast", "pacing must be None, True"),
        (-1, "pacing=-1"),
        (dict(min_chunk_tokens=0), "Pacing.min_chunk_tokens"),
        (dict(itl_target_steps=0.5), "Pacing.itl_target_steps"),
        (dict(itl_target_s=-2.0), "Pacing.itl_target_s"),
    ],
)
def test_bad_pacing_in_the_packed_layout_names_the_field(bundled, pacing, field):
    model, tok = bundled
    with pytest.raises(ValueError, match=field):
        spec = Pacing(**pacing) if isinstance(pacing, dict) else pacing
        wb.Scheduler(model, tok, layout="packed", pacing=spec)


def test_the_views_show_each_forwards_cap_and_time_budget(bundled):
    model, tok = bundled
    sched, costed = on_cost_clock(model, tok, Pacing(itl_target_steps=2.0, cost_model=COST))
    staggered(sched, costed, tok, SPECS[:3])
    lines = budget_text(sched.history).splitlines()
    assert lines[0] == "step  decode  prefill  budget  paced  predicted_ms  budget_ms"
    assert lines[1].split()[-1] == "inf"  # the first forward: no running row, no time budget
    capped = next(r for r in paced_rows(sched) if r.paced_tokens < BUDGET)
    assert f"{capped.predicted_s * 1e3:.2f}" in budget_text(sched.history)
    assert "paced: at most 64 tokens, predicted" in packed_text(sched.snapshot())
    ax = render_token_budget(sched.history).axes[0]
    assert "time budget's cap" in [t.get_text() for t in ax.get_legend().get_texts()]


def plan_of(wants):
    return lambda tokens: plan_chunks(wants, tokens)


def test_choose_takes_the_most_tokens_whose_predicted_forward_fits():
    pacer = PackedPacer(Pacing(itl_target_s=0.010, cost_model=COST, min_chunk_tokens=8), token_budget=256)
    wants = [Want(0, 99, 100, True), Want(1, 0, 500, False)]
    full = plan_chunks(wants, 256)
    paced = pacer.choose(plan_of(wants), full, now_s=3.0)
    # 0.004 + 0.0003 + 100e-6 + 0.0001 k + 1e-6 k (k + 1) / 2 <= 0.010 -> k = 45
    assert paced.chunks == (Chunk(0, 99, 1, "decode"), Chunk(1, 0, 45, "prefill", samples=False))
    assert paced.token_cap == 46 and paced.budget_s == 0.010 and paced.started_s == 3.0
    assert paced.predicted_s == pytest.approx(COST.packed_s([100], [(45, 0)]))
    assert COST.packed_s([100], [(45, 0)]) <= 0.010 < COST.packed_s([100], [(46, 0)])
    tight = PackedPacer(Pacing(itl_target_s=0.001, cost_model=COST, min_chunk_tokens=8), 256)
    floor = tight.choose(plan_of(wants), full, 0.0)  # nothing fits: the progress floor, over budget
    assert floor.token_cap == 9 and floor.chunks[1].n_tokens == 8 and floor.over_budget
    no_rows = pacer.choose(plan_of(wants[1:]), plan_chunks(wants[1:], 256), 0.0)
    assert no_rows.token_cap == 256 and math.isinf(no_rows.budget_s)  # no running row waits


def observed(pacer, decode, prefill, seconds):
    """``pacer`` measures one forward: decode rows attending ``decode`` keys, prefill chunks
    ``(tokens, start)``, ``seconds`` long."""
    chunks = [Chunk(i, w - 1, 1, "decode") for i, w in enumerate(decode)]
    chunks += [Chunk(10 + i, s, k, "prefill") for i, (k, s) in enumerate(prefill)]
    pacer.observe(PacedForward(tuple(chunks), 512, None, math.inf, 0.0), seconds)


def test_without_a_prior_the_forwards_cost_is_medians_of_measured_forwards():
    pacer = PackedPacer(Pacing(min_chunk_tokens=4), token_budget=64)
    wants = [Want(0, 20, 21, True), Want(1, 0, 100, False)]
    assert pacer.forward_s(plan_chunks(wants, 64)) is None
    first = pacer.choose(plan_of(wants), plan_chunks(wants, 64), 0.0)
    assert first.token_cap == 5 and first.predicted_s is None  # a probe: the floor
    for decode, prefill, seconds in [
        ((10, 40), [], 0.004),
        ((11,), [], 0.003),
        ((12, 30, 5), [], 0.005),
        ((3,), [(30, 0)], 0.010),  # (0.010 - D) / 30 per token
        ((), [(64, 0)], 0.020),
        ((7, 9), [(2, 50)], 0.0045),
    ]:
        observed(pacer, decode, prefill, seconds)
    d = 0.004  # the median of the forwards without prefill
    # with prefill (30, 0.010), (64, 0.020), (2, 0.0045): the median of the three pairs' slopes
    c = sorted([0.010 / 34, 0.0055 / 28, 0.0155 / 62])[1]
    fixed = sorted([0.010 - 30 * c, 0.020 - 64 * c, 0.0045 - 2 * c])[1]
    assert pacer.measured_rates() == pytest.approx((d, max(fixed, d), c))
    probe = [Chunk(0, 20, 1, "decode"), Chunk(1, 0, 33, "prefill")]
    assert pacer.forward_s(probe) == pytest.approx(max(fixed, d) + 33 * c)
    assert pacer.forward_s(probe[:1]) == pytest.approx(d)
    assert packed_features(probe).tolist() == [1, 1, 21, 33, 33 * 34 / 2]


def test_two_measured_forwards_size_the_next_chunk_where_a_fit_would_still_probe():
    # one decode-only forward of 4 rows (4 ms) and one prefill of 200 tokens alone (40 ms):
    # D = 4 ms, c = 0.18 ms a token (one token count: (40 - 4) / 200), F = D. A 300-token
    # joiner beside 4 running rows at a budget of 4 x D = 16 ms gets (16 - 4) / 0.18 = 66
    # tokens now, not the 16-token probe the five-term fit ran until five forwards of enough
    # different shapes determined it.
    pacer = PackedPacer(Pacing(itl_target_steps=4.0), token_budget=512)
    observed(pacer, (30, 31, 32, 33), [], 0.004)
    observed(pacer, (), [(200, 0)], 0.040)
    wants = [Want(i, 29 + i, 30 + i, True) for i in range(4)] + [Want(9, 0, 300, False)]
    paced = pacer.choose(plan_of(wants), plan_chunks(wants, 512), 0.0)
    assert paced.budget_s == pytest.approx(0.016)
    assert [c.n_tokens for c in paced.chunks if c.kind == "prefill"] == [66]
    assert paced.predicted_s <= paced.budget_s and not paced.over_budget


def test_a_forward_slowed_by_other_work_on_the_machine_does_not_move_the_prediction():
    pacer = PackedPacer(Pacing(itl_target_steps=4.0), token_budget=512)
    for seconds in (0.004, 0.004, 0.040, 0.004, 0.0041, 0.004):  # one 10x: the machine busy
        observed(pacer, (30, 31), [], seconds)
    for k in (100, 120, 80, 60, 140):  # 4 ms + 0.18 ms a token, but the 120-token one 20x
        observed(pacer, (30, 31), [(k, 0)], 0.4 if k == 120 else 0.004 + 0.00018 * k)
    d, fixed, c = pacer.measured_rates()
    assert d == pytest.approx(0.004) and fixed == pytest.approx(0.004) and c == pytest.approx(0.00018)
