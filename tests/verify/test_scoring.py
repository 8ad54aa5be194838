"""The scoring oracle of workbench.verify.scoring on the bundled model: one forward per row
gives the solo oracle's traces and verdicts, and finds a changed token, a row cut short and
a row run past its stop string."""

import pytest

import workbench as wb
from workbench.verify import oracle, scoring

pytestmark = pytest.mark.model


@pytest.fixture
def joined(make_sched, prompt):
    """A finished run: a row ended by a stop string, rows joining it mid-decode."""
    free = make_sched()
    u = free.submit(wb.Request(prompt=prompt(9, 40), max_tokens=24, stop_ids=[]))
    free.run()
    stop = free.tokenizer.decode(free.tokens(u)[4:6])
    sched = make_sched(max_batch=2)
    uids = [sched.submit(wb.Request(prompt=prompt(9, 40), max_tokens=24, stop_ids=[], stop=[stop]))]
    sched.admit()
    sched.step()
    uids += [sched.submit(wb.Request(prompt=prompt(n, 3 * n), max_tokens=8, stop_ids=[])) for n in (5, 12)]
    sched.run()
    return sched, uids


def test_scoring_a_batched_run_gives_the_solo_runs_tokens_log_probs_and_verdict(joined):
    sched, uids = joined
    for u in uids:
        req = oracle.ref_request(sched.request_of(u))
        solo = oracle.solo_reference(sched.model, req, tokenizer=sched.tokenizer)
        scored = scoring.scored_reference(sched.model, req, sched.tokens(u), sched.tokenizer)
        assert scored.tokens == solo.tokens == sched.tokens(u)
        assert max(abs(a - b) for a, b in zip(scored.logprobs, solo.logprobs)) <= oracle.DEFAULT_ATOL
        assert max(abs(a - b) for a, b in zip(scored.margins, solo.margins)) <= oracle.DEFAULT_ATOL
    check = scoring.score_check(sched.model, sched)
    assert [r.uid for r in check.rows] == uids and check.ok and check.n_match == 3, check.text()
    assert sched.finish_reason(uids[0]) == "stop" and len(sched.tokens(uids[0])) <= 6


def test_a_changed_token_is_a_divergence_at_its_step(joined):
    sched, uids = joined
    ours = oracle.scheduler_trace(sched, uids[1])
    ours.tokens[2] = (ours.tokens[2] + 1) % sched.model.args.vocab_size
    req = oracle.ref_request(sched.request_of(uids[1]))
    ref = scoring.scored_reference(sched.model, req, ours.tokens, sched.tokenizer)
    row = oracle.compare_row(uids[1], ours, ref)
    assert not row.match and row.first_divergence_step == 2 and row.theirs == sched.tokens(uids[1])[2]


def test_a_row_cut_short_or_run_past_its_stop_string_is_a_divergence(joined):
    sched, uids = joined
    short = oracle.scheduler_trace(sched, uids[1])
    del short.tokens[3:], short.logprobs[3:]  # max_tokens 8: the request alone goes on
    req = oracle.ref_request(sched.request_of(uids[1]))
    row = oracle.compare_row(
        0, short, scoring.scored_reference(sched.model, req, short.tokens, sched.tokenizer)
    )
    assert not row.match and row.first_divergence_step == 3 and row.ours is None
    stopped = sched.request_of(uids[0])  # ended by its stop string: a longer row ran past it
    longer = oracle.solo_reference(sched.model, oracle.RefRequest(stopped.prompt_ids, 24, stopped.stop_ids))
    ref = scoring.scored_reference(sched.model, oracle.ref_request(stopped), longer.tokens, sched.tokenizer)
    assert ref.tokens == sched.tokens(uids[0]) and len(longer.tokens) > len(ref.tokens)
    assert not oracle.compare_row(0, longer, ref).match


def test_scoring_refuses_what_one_forward_cannot_check(make_sched, prompt):
    sched = make_sched(kv_bits=8, kv_group_size=32)
    with pytest.raises(ValueError, match="kv_bits"):
        scoring.score_check(sched.model, sched)
    req = oracle.RefRequest(tuple(prompt(4)), 4, frozenset(), ("\n",))
    with pytest.raises(ValueError, match="needs the tokenizer"):
        scoring.scored_reference(sched.model, req, [])
    gemma, _ = wb.load("data/models/tiny-gemma3")  # sliding-window layers: rotating caches
    with pytest.raises(ValueError, match="RotatingKVCache"):
        scoring.scored_reference(gemma, oracle.RefRequest(tuple(prompt(4)), 4, frozenset()), [])
