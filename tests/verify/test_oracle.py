"""The numerics-aware comparison of workbench.verify.oracle on hand-built token traces:
the step of a divergence, the reference's top-2 margin there, the measured log-prob
noise, and the cause (near-tie, near-tie under reduced precision, log-prob noise, real
divergence); and the solo oracle of a row ended by a stop string (bundled model)."""

import pytest

import workbench as wb
from workbench.verify import oracle
from workbench.verify.oracle import TokenTrace, compare_row, compare_traces

REF = TokenTrace([1, 2, 3], [-0.1, -0.2, -0.3], [1.0, 0.0015, 1.0])


def test_equal_traces_match_with_zero_noise():
    row = compare_row(0, TokenTrace([1, 2, 3], [-0.1, -0.2, -0.3]), REF)
    assert row.match and row.cause == oracle.MATCH and row.noise == 0.0


def test_a_match_writes_its_log_prob_difference_without_e_notation():
    exact = compare_row(3, TokenTrace([1, 2, 3], [-0.1, -0.2, -0.3]), REF)
    assert exact.describe() == "uid 3: match (3 tokens, max |dlogprob| 0)"
    near = compare_row(3, TokenTrace([1, 2, 3], [-0.1, -0.2 + 2.5e-6, -0.3]), REF, atol=1e-4)
    assert near.match and near.describe().endswith("max |dlogprob| 2.5×10⁻⁶)")


def test_equal_tokens_with_tf32_sized_logprob_differences_are_log_prob_noise():
    row = compare_row(0, TokenTrace([1, 2, 3], [-0.1, -0.2008, -0.3]), REF)
    assert not row.match and row.cause == oracle.LOGPROB_NOISE and abs(row.noise - 8e-4) < 1e-9
    assert "MISMATCH (log-prob noise)" in row.describe()


def test_a_flip_within_four_times_the_noise_is_a_near_tie_under_reduced_precision():
    ours = TokenTrace([1, 5, 3], [-0.1004, -0.2001, -0.3])  # noise 4e-4 before step 1, margin 1.5e-3 there
    row = compare_row(7, ours, REF)
    assert (row.first_divergence_step, row.ours, row.theirs) == (1, 5, 2)
    assert not row.match and row.cause == oracle.PRECISION_NEAR_TIE
    assert abs(row.noise - 4e-4) < 1e-9 and row.ref_margin == 0.0015
    assert "at step 1" in row.describe() and "measured log-prob noise 4.00e-04" in row.describe()


def test_a_flip_far_above_the_noise_is_a_real_divergence():
    ref = TokenTrace([1, 2, 3], [-0.1, -0.2, -0.3], [1.0, 0.5, 1.0])
    row = compare_row(0, TokenTrace([1, 5, 3], [-0.1, -0.2, -0.3]), ref)
    assert not row.match and row.cause == oracle.DIVERGENCE


def test_a_flip_below_the_tolerance_is_an_accepted_near_tie():
    ref = TokenTrace([1, 2], [-0.1, -0.2], [1.0, 5e-5])
    row = compare_row(0, TokenTrace([1, 5], [-0.1, -0.2]), ref)
    assert row.match and row.tie_accepted and row.cause == oracle.NEAR_TIE


def test_a_shorter_trace_is_a_divergence_and_the_report_counts_causes():
    report = compare_traces(
        {0: TokenTrace([1, 2], [-0.1, -0.2]), 1: TokenTrace([1, 2, 3], [-0.1, -0.2, -0.3])}, {0: REF, 1: REF}
    )
    assert [r.cause for r in report.rows] == [oracle.DIVERGENCE, oracle.MATCH]
    assert report.causes() == {oracle.DIVERGENCE: 1, oracle.MATCH: 1} and report.noise == 0.0


@pytest.mark.model
def test_a_row_ended_by_a_stop_string_equals_its_solo_run_stopped_by_the_same_string(make_sched, prompt):
    free = make_sched()
    u = free.submit(wb.Request(prompt=prompt(9, 40), max_tokens=24, stop_ids=[]))
    free.run()
    tokens = free.tokens(u)
    stop = free.tokenizer.decode(tokens[4:6])  # completed by token 5 at the latest
    assert stop.strip(), stop
    sched = make_sched(max_batch=2)
    uid = sched.submit(wb.Request(prompt=prompt(9, 40), max_tokens=24, stop_ids=[], stop=[stop]))
    sched.admit()
    sched.step()
    other = sched.submit(wb.Request(prompt=prompt(5, 3), max_tokens=10, stop_ids=[]))  # joins mid-decode
    sched.run()
    assert sched.finish_reason(uid) == "stop" and len(sched.tokens(uid)) <= 6
    check = oracle.solo_check(sched.model, sched, [uid, other])
    assert check.ok and check.n_match == 2, check.text()
    valid = sched.request_of(uid)
    ref = oracle.solo_reference(sched.model, oracle.ref_request(valid), tokenizer=sched.tokenizer)
    assert ref.tokens == sched.tokens(uid)  # the reference stopped on the same token
    without = oracle.RefRequest(valid.prompt_ids, 24, valid.stop_ids)  # no stop strings: runs on
    assert oracle.solo_reference(sched.model, without).tokens == tokens
    with pytest.raises(ValueError, match="needs the tokenizer"):
        oracle.solo_reference(sched.model, oracle.ref_request(valid))
