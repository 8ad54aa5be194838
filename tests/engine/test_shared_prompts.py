"""Samples of one ``submit_n`` that join in later groups (``max_batch`` or a KV budget below
``n``) start from the first group's prefilled prompt (``workbench.engine.shared_prompts``):
the prompt runs through prefill forwards once (counted from the engine's ``prefill``
events), every sample equals ``Request(seed=seed + i)`` alone, on every cache family; the
held prompt counts against the KV budget and goes once no sample waits for it; abort,
preemption and checkpoint / restore keep every sample's tokens."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.engine import shared_prompts
from workbench.engine.kv.ledger import alone_bytes
from workbench.runtime.loading import DATA_DIR
from workbench.workloads.workload import prompt_of_length

from .alone import row_record
from .test_submit_n import admitted_groups, prefill_tokens, sample_alone

pytestmark = pytest.mark.model


def sampled(ids, n_tokens=5, seed=5, temperature=0.9):
    return wb.Request(prompt=ids, max_tokens=n_tokens, temperature=temperature, seed=seed, stop_ids=[])


def join(sched, uid):
    """Admit until ``uid`` runs (one prefill chunk per ``admit()`` with interleaved prefill)."""
    while sched.status(uid) is not wb.Status.RUNNING:
        sched.admit()


def assert_each_sample_alone(sched, uids, ids, n_tokens=5, seed=5, temperature=0.9, **settings):
    model, tok = sched.model, sched.tokenizer
    for i, u in enumerate(uids):
        alone = sample_alone(model, tok, ids, n_tokens, temperature, seed + i, **settings)
        assert row_record(sched, u) == alone, f"sample {i} differs from Request(seed={seed + i}) alone"


@pytest.mark.parametrize("folder", ["tiny-code", "tiny-gemma3", "tiny-mamba2", "tiny-qwen3-next"])
def test_samples_joining_later_are_not_prefilled_again_and_equal_each_seed_alone(folder):
    model, tok = wb.load(DATA_DIR / "models" / folder)
    ids = prompt_of_length(tok, 41, 3)
    settings = dict(max_batch=2, prefill_step_size=16)
    sched = wb.Scheduler(model, tok, history_size=64, **settings)
    uids = sched.submit_n(sampled(ids), 5)
    join(sched, uids[0])
    assert set(sched.state.shared_prompts) == {uids[0]}  # held: samples 2, 3, 4 wait
    held = sched.state.shared_prompts[uids[0]]
    assert held.tokens == tuple(ids[:-1]) and sched.snapshot().shared_prompt_bytes == held.nbytes > 0
    sched.run()
    assert len(admitted_groups(sched, uids)) >= 3
    assert sum(prefill_tokens(sched, uids).values()) == len(ids) - 1  # one prompt's prefill, not three
    assert [e.n_cached for e in sched.events if e.kind == "admit"][2:] == [len(ids) - 1] * 3
    assert sched.state.shared_prompts == {} and sched.snapshot().shared_prompt_bytes == 0
    assert_each_sample_alone(sched, uids, ids, **settings)
    assert sched.check().ok


@pytest.mark.parametrize("room_tokens", [64, 0])
def test_a_kv_budget_counts_the_held_prompt_and_holds_none_that_does_not_fit(bundled, room_tokens):
    model, tok = bundled
    ids = prompt_of_length(tok, 60, 9)
    probe = wb.Scheduler(model, tok)
    budget = 2 * alone_bytes(model, 60, 5) + room_tokens * probe.ledger.base.full_token_bytes
    sched = wb.Scheduler(model, tok, max_batch=8, kv_budget_bytes=budget, history_size=256)
    uids = sched.submit_n(sampled(ids), 4)
    sched.run()
    groups = admitted_groups(sched, uids)
    assert len(groups) > 1
    assert all(s.held_bytes <= budget for s in sched.history)
    shared = max(s.shared_prompt_bytes for s in sched.history)
    if room_tokens:
        assert shared > 0 and sum(prefill_tokens(sched, uids).values()) == len(ids) - 1
    else:  # no room beside two rows: the later samples prefill again
        assert shared == 0 and sum(prefill_tokens(sched, uids).values()) == len(groups) * (len(ids) - 1)
    assert_each_sample_alone(sched, uids, ids)


def test_aborting_the_waiting_samples_drops_the_held_prompt(bundled):
    model, tok = bundled
    ids = prompt_of_length(tok, 30, 50)
    sched = wb.Scheduler(model, tok, max_batch=1)
    uids = sched.submit_n(sampled(ids), 3)
    sched.admit()
    assert set(sched.state.shared_prompts) == {uids[0]}
    sched.abort(uids[1])
    assert set(sched.state.shared_prompts) == {uids[0]}  # uid 2 still waits for it
    sched.abort(uids[2])
    assert sched.state.shared_prompts == {} and sched.snapshot().shared_prompt_bytes == 0
    sched.run()
    assert sched.finish_reason(uids[0]) == "length" and sched.idle


def test_restore_and_fork_with_a_held_prompt_repeat_the_same_samples_and_events(bundled):
    model, tok = bundled
    ids = prompt_of_length(tok, 50, 20)
    sched = wb.Scheduler(model, tok, max_batch=2, prefill_step_size=16)
    uids = sched.submit_n(sampled(ids, n_tokens=6, seed=40), 5)
    join(sched, uids[0])
    sched.step()
    cp, fork = sched.checkpoint(), sched.fork()
    assert sched.state.shared_prompts
    sched.run()
    first = ({u: row_record(sched, u) for u in uids}, [(e.kind, e.uid, e.n_tokens) for e in sched.events])
    sched.restore(cp)
    sched.run()
    again = ({u: row_record(sched, u) for u in uids}, [(e.kind, e.uid, e.n_tokens) for e in sched.events])
    assert again == first
    fork.run()
    assert {u: row_record(fork, u) for u in uids} == first[0]
    assert sum(prefill_tokens(sched, uids).values()) == len(ids) - 1
    assert_each_sample_alone(sched, uids, ids, n_tokens=6, seed=40, max_batch=2, prefill_step_size=16)


def test_an_interrupted_admit_keeps_the_held_prompt_and_the_queue(bundled, monkeypatch):
    model, tok = bundled
    ids = prompt_of_length(tok, 20, 70)
    sched = wb.Scheduler(model, tok, max_batch=1)
    uids = sched.submit_n(sampled(ids), 3)
    sched.admit()
    sched.run(max_steps=5)  # uid 0 finished and evicted: uid 1 is next
    held = dict(sched.state.shared_prompts)
    assert set(held) == {uids[0]} and sched.queue == (uids[1], uids[2])

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(sched.runner), "join_forward", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sched.admit()
    assert sched.state.shared_prompts == held and sched.queue == (uids[1], uids[2])
    monkeypatch.undo()
    sched.run()
    assert sum(prefill_tokens(sched, uids).values()) == len(ids) - 1
    assert_each_sample_alone(sched, uids, ids, max_batch=1)


def test_a_preempted_sample_prefills_its_own_tokens_and_the_waiting_ones_still_share(bundled):
    model, tok = bundled
    ids = prompt_of_length(tok, 25, 130)
    sched = wb.Scheduler(model, tok, max_batch=2)
    uids = sched.submit_n(sampled(ids, n_tokens=8, seed=70), 4)
    sched.admit(), sched.step(), sched.step()
    sched.preempt(uids[1])  # resumes from its prompt and its 2 tokens: not what is held
    sched.run()
    ran = prefill_tokens(sched, uids)
    assert ran[uids[0]] == len(ids) - 1 and ran[uids[1]] == len(ids) - 1 + 2
    assert ran[uids[2]] == ran[uids[3]] == 0
    assert_each_sample_alone(sched, uids, ids, n_tokens=8, seed=70, max_batch=2)


def test_held_prompts_are_pruned_to_what_a_queued_sample_can_use():
    class State:  # a request state as far as the module reads one
        def __init__(self, group, inputs):
            self.sample_group, self.inputs = group, inputs

    held = {0: shared_prompts.HeldPrompt((1, 2), [], 10), 5: shared_prompts.HeldPrompt((7,), [], 3)}
    queue = [State(0, [1, 2, 3]), State(5, [7, 9, 4])]  # uid 5's group waits with its own tokens
    assert set(shared_prompts.prune(held, queue)) == {0}
    assert shared_prompts.held_bytes(held) == 13
    assert shared_prompts.take(held, State(0, [1, 2, 9])) == []  # the held prefix, whatever the last
    assert shared_prompts.take(held, State(0, [1, 3])) is None
