"""A seeded row's token t depends only on its seed, t and its context: not on max_tokens,
neighbours, preemption, checkpoint/restore or stop conditions (issue 14, item 3)."""

import pytest

import workbench as wb
from workbench.engine.sampling import token_key

pytestmark = pytest.mark.model
PROMPT = list(range(10, 18))


def seeded(make_sched, max_tokens=24, stop_ids=(), neighbour=False, preempt_at=None, restore_at=None):
    sched = make_sched(max_batch=3)
    uid = sched.submit(
        wb.Request(prompt=PROMPT, max_tokens=max_tokens, temperature=1.0, seed=42, stop_ids=list(stop_ids))
    )
    if neighbour:
        sched.submit(wb.Request(prompt=[5, 6, 7], max_tokens=30, temperature=0.7, stop_ids=[]))
    sched.admit()
    for i in range(max_tokens + 2):
        if i == preempt_at and sched.status(uid) is wb.Status.RUNNING:
            sched.preempt(uid)
        if i == restore_at:
            cp = sched.checkpoint()
            sched.run(max_steps=3)
            sched.restore(cp)
        sched.admit(), sched.step(), sched.filter()
    sched.run()
    return sched.tokens(uid)


def test_a_seeded_rows_tokens_do_not_depend_on_max_tokens_neighbours_preemption_restore_or_stops(make_sched):
    reference = seeded(make_sched)
    assert seeded(make_sched, max_tokens=16) == reference[:16]
    assert seeded(make_sched, neighbour=True) == reference
    assert seeded(make_sched, preempt_at=5) == reference
    assert seeded(make_sched, restore_at=4) == reference
    stop = reference[10]
    first = reference.index(stop)
    assert seeded(make_sched, stop_ids=[stop]) == reference[: first + 1]


def test_token_keys_depend_on_seed_and_index_only():
    assert token_key(42, 3).tolist() == token_key(42, 3).tolist()
    assert token_key(42, 3).tolist() != token_key(42, 4).tolist() != token_key(43, 3).tolist()
