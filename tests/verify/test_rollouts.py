"""The rollout oracles of :mod:`workbench.verify.rollouts` on the bundled model: they hold
for rows that equal their run alone and fail for one that does not."""

import dataclasses

import workbench as wb
from workbench.verify.rollouts import drafted_uids, equals_alone, prefilled_tokens


def test_each_rollout_equals_its_seed_alone_and_not_another_seed(make_sched, prompt):
    sched = make_sched(max_batch=4)
    rollout = wb.Request(prompt=prompt(6), max_tokens=6, temperature=0.8, seed=3, top_logprobs=3, stop_ids=[])
    uids = sched.submit_n(rollout, 2)
    sched.run()
    assert equals_alone(sched, uids[0], rollout)
    assert equals_alone(sched, uids[1], dataclasses.replace(rollout, seed=4))
    assert not equals_alone(sched, uids[1], rollout)  # another seed's tokens
    assert not equals_alone(sched, uids[0], dataclasses.replace(rollout, max_tokens=5))  # one token short
    assert prefilled_tokens(sched.events, uids) == 5  # one prefill; the last prompt token feeds the join


def test_a_speculating_row_equals_itself_without_speculation_and_only_it_drafted(make_sched, bundled):
    _, tok = bundled
    sched = make_sched(max_batch=2, speculative="prompt-lookup", num_draft_tokens=3)
    copy = wb.Request(
        prompt=tok.encode("x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,"), max_tokens=8, stop_ids=[]
    )
    greedy = sched.submit(copy)
    no_drafts = sched.submit(dataclasses.replace(copy, top_logprobs=2))  # asks top-k: takes no drafts
    sched.run()
    assert drafted_uids(sched.events) == [greedy]
    assert equals_alone(sched, greedy, copy, speculative=None)
    assert equals_alone(sched, no_drafts, dataclasses.replace(copy, top_logprobs=2))
    assert not equals_alone(sched, no_drafts, dataclasses.replace(copy, top_logprobs=3))  # 2 ids, not 3
