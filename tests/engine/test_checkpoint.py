"""Checkpoint, restore and fork: the whole engine state captured without copying tensors,
returned to exactly, and branched into an independent scheduler on the same weights."""

from __future__ import annotations

import mlx.core as mx
import pytest

import workbench as wb
from tests.engine.interrupts import FACTS_WITH_LOGPROB, facts_of

pytestmark = pytest.mark.model


def event_facts(events):
    """Events without their times (and NaN log-probs as None), for equality."""
    return facts_of(events, FACTS_WITH_LOGPROB)


def outcome(sched, since=0):
    """Tokens and finish reason of every request, and the event facts from ``since`` on."""
    per_uid = {u: (sched.tokens(u), sched.finish_reason(u)) for u in sched.requests}
    return per_uid, event_facts(sched.events[since:])


def busy_scheduler(make_sched, prompt, unit_bytes):
    """A scheduler mid-run with everything a checkpoint must hold: greedy, seeded and
    drawn-seed sampled rows, a chunked prefill in progress, a prompt cache with an entry,
    a KV budget that will preempt a low-priority row, and requests still queued."""
    # rows as mlx-lm allocates them (256-token growth steps; bounds of about 256-280
    # positions a row with a prompt cache): three running and one prefilling fit in 1,200
    # positions, the urgent fifth does not
    sched = make_sched(
        max_batch=5, prefill_step_size=4, prompt_cache=4, kv_budget_bytes=1200 * unit_bytes, seed=7
    )
    sched.submit(wb.Request(prompt=prompt(6, 0), max_tokens=3, stop_ids=[]))
    sched.run()  # finished: its cache is now in the prompt cache
    sched.submit(
        wb.Request(prompt=prompt(6, 0) + prompt(3, 40), max_tokens=9, stop_ids=[])
    )  # a prompt-cache hit
    sched.submit(wb.Request(prompt=prompt(9, 100), max_tokens=12, temperature=0.9, seed=3, stop_ids=[]))
    sched.submit(wb.Request(prompt=prompt(5, 200), max_tokens=10, temperature=1.0, stop_ids=[]))  # drawn seed
    for _ in range(4):
        sched.admit(), sched.step(), sched.filter()
    sched.submit(wb.Request(prompt=prompt(7, 400), max_tokens=5, temperature=0.7, stop_ids=[]))
    sched.admit()  # starts a chunked prefill (4-token chunks): caught mid-prefill
    return sched


def continue_run(sched, prompt):
    """The same continuation every time: a high-priority arrival two steps on (it preempts
    a running row under the KV budget), then until idle."""
    urgent = wb.Request(prompt=prompt(11, 300), max_tokens=6, priority=2, stop_ids=[])
    sched.run(arrivals=[(sched.step_index + 2, urgent)])


@pytest.fixture
def unit_bytes(bundled):
    from workbench.engine.kv.profile import kv_profile, projected_bytes

    return projected_bytes(kv_profile(bundled[0]), 1)  # KV bytes per token


def test_continuing_from_a_restored_checkpoint_repeats_tokens_and_events(make_sched, prompt, unit_bytes):
    sched = busy_scheduler(make_sched, prompt, unit_bytes)
    assert sched.snapshot().prefilling, "the checkpoint should catch a prefill in progress"
    cp = sched.checkpoint()
    n = len(sched.events)
    continue_run(sched, prompt)
    first = outcome(sched, n)
    kinds = {f[0] for f in first[1]}
    assert {"preempt", "join", "evict", "token", "prefill"} <= kinds
    assert any(f[7] > 0 for f in event_facts(sched.events) if f[0] == "admit"), "a prompt-cache hit happened"
    for _ in range(2):  # a checkpoint stays valid for another restore
        sched.restore(cp)
        assert len(sched.events) == n and sched.step_index == cp.step
        continue_run(sched, prompt)
        assert outcome(sched, n) == first


def test_restore_returns_the_snapshot_and_request_states_exactly(make_sched, prompt, unit_bytes):
    sched = busy_scheduler(make_sched, prompt, unit_bytes)
    before = sched.snapshot()
    states = {u: (s.status, list(s.tokens), s.fed) for u, s in sched.requests.items()}
    cp = sched.checkpoint()
    for _ in range(5):
        sched.admit(), sched.step(), sched.filter()
    sched.submit(wb.Request(prompt=prompt(4, 500), max_tokens=2))
    sched.restore(cp)
    after = sched.snapshot()
    assert after.text() == before.text() and after.kv_bytes == before.kv_bytes
    assert {u: (s.status, list(s.tokens), s.fed) for u, s in sched.requests.items()} == states


def test_a_checkpoint_copies_no_tensor(make_sched, prompt):
    sched = make_sched(max_batch=8, history_size=0)
    for i in range(8):
        sched.submit(wb.Request(prompt=prompt(200, 10 * i), max_tokens=50, stop_ids=[]))
    sched.admit(), sched.step()
    mx.eval([c.state for c in sched.batch.caches])
    kv_bytes = sched.snapshot().kv_bytes
    before = mx.get_active_memory()
    cp = sched.checkpoint()
    mx.eval([c.state for c in cp.state.batch.caches])
    assert mx.get_active_memory() - before < kv_bytes / 100, "a checkpoint must share the cache buffers"


def test_restoring_another_schedulers_or_models_checkpoint_is_refused_and_changes_nothing(
    make_sched, prompt, random_llama
):
    a, b = make_sched(), make_sched()
    for s in (a, b):
        s.submit(wb.Request(prompt=prompt(5), max_tokens=4))
        s.admit(), s.step()
    other_model = wb.Scheduler(*random_llama)
    facts, text = event_facts(a.events), a.snapshot().text()
    with pytest.raises(ValueError, match="belongs to scheduler"):
        a.restore(b.checkpoint())
    with pytest.raises(ValueError, match="another model"):
        a.restore(other_model.checkpoint())
    with pytest.raises(ValueError, match="must be a workbench Checkpoint"):
        a.restore({"step": 1})
    assert event_facts(a.events) == facts and a.snapshot().text() == text
    a.run()
    assert a.finish_reason(0) is not None


def test_a_fork_is_independent_shares_the_weights_and_continues_identically(make_sched, prompt, unit_bytes):
    sched = busy_scheduler(make_sched, prompt, unit_bytes)
    n = len(sched.events)
    text = sched.snapshot().text()
    fork = sched.fork()
    assert fork.model is sched.model and fork.id != sched.id
    continue_run(fork, prompt)
    assert sched.snapshot().text() == text and len(sched.events) == n, "running the fork changed the original"
    continue_run(sched, prompt)
    assert outcome(sched, n) == outcome(fork, n)


def test_a_fork_may_change_the_admission_policy_only(make_sched, prompt):
    sched = make_sched(max_batch=1)
    for i, n in enumerate([12, 3]):
        sched.submit(wb.Request(prompt=prompt(n, 50 * i), max_tokens=2))
    spf = sched.fork(policy="shortest-prompt-first")
    assert [e.uid for e in sched.admit() if e.kind == "join"] == [0]
    assert [e.uid for e in spf.admit() if e.kind == "join"] == [1]
    with pytest.raises(ValueError, match="cannot change.*max_kv_size"):
        sched.fork(max_kv_size=8)


def test_a_fork_with_max_batch_below_the_rows_it_would_hold_is_refused_naming_both(make_sched, prompt):
    """A break-it pass (2026-12-07): ``fork(max_batch=1)`` of a scheduler with 3 running rows
    decoded on with 3 rows, above its limit; it sheds no row, so it is refused."""
    sched = make_sched(max_batch=4, prefill_step_size=4)
    for i in range(3):
        sched.submit(wb.Request(prompt=prompt(4, 30 * i), max_tokens=6, stop_ids=[]))
    sched.admit()  # three rows join
    sched.submit(wb.Request(prompt=prompt(12, 100), max_tokens=6, stop_ids=[]))
    sched.admit()  # the fourth prefills its first 4-token chunk of 12
    assert len(sched.batch.rows) == 3 and sched.state.prefilling is not None
    n = len(sched.events)
    for max_batch in (1, 3):
        with pytest.raises(
            ValueError,
            match=rf"fork: max_batch={max_batch} is below the 4 rows this scheduler holds \(3 in the batch "
            r"unfinished, 0 finished until filter\(\), 1 prefilling\)",
        ):
            sched.fork(max_batch=max_batch)
    assert len(sched.events) == n and len(sched.batch.rows) == 3  # nothing changed
    fork = sched.fork(max_batch=4)
    fork.run()
    assert all(len(fork.tokens(u)) == 6 for u in fork.requests)


def test_a_fork_that_keeps_checkpoints_keeps_one_of_the_state_it_starts_from(make_sched, prompt):
    sched = make_sched(max_batch=2, history_size=16)  # keeps no checkpoint itself
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=8, stop_ids=[]))
    sched.admit()
    sched.step()
    sched.step()
    assert sched.history.checkpoint(-1) is None and sched.fork().history.checkpoint(-1) is None
    fork = sched.fork(history_checkpoints=4)
    start = fork.history.checkpoint(-1)  # with the inherited latest snapshot: the state it forked
    assert start is not None and start.scheduler_id == fork.id and fork.history[-1].step == 2
    assert all(fork.history.checkpoint(i) is None for i in range(len(fork.history) - 1))
    tokens, n_history = fork.tokens(0), len(fork.history)
    fork.step()
    fork.step()
    fork.restore(start)
    assert fork.step_index == 2 and fork.tokens(0) == tokens and len(fork.history) == n_history
    assert sched.step_index == 2  # the original is untouched
