"""n samples of one prompt (``Scheduler.submit_n``): one prefill shared by the samples
(counted from the engine's own prefill events), sample ``i`` equal to
``Request(seed=seed + i)`` run alone, greedy samples equal to each other and to mlx-lm
alone; with the prompt cache, checkpoint / restore / fork, aborting one sample, preemption
and plain rows beside them."""

from __future__ import annotations

import math

import pytest

import workbench as wb
from workbench.engine.siblings import MAX_SAMPLES, shared_rows
from workbench.engine.state import RequestState
from workbench.verify import oracle

from .alone import row_record, run_alone


def prefill_tokens(sched, uids) -> dict[int, int]:
    """Prompt tokens each uid ran through prefill forwards (its ``prefill`` events)."""
    return {u: sum(e.n_tokens for e in sched.events if e.kind == "prefill" and e.uid == u) for u in uids}


def admitted_groups(sched, uids) -> list[list[int]]:
    """The samples of each prefilling group: runs of consecutive ``admit`` events (one
    group's admissions are logged together)."""
    groups, run = [], []
    for e in sched.events:
        if e.kind == "admit" and e.uid in uids:
            run.append(e.uid)
        elif e.kind == "admit" or run and e.kind != "submit":
            groups, run = groups + [run] if run else groups, []
    return groups + [run] if run else groups


def sample_alone(model, tok, ids, max_tokens, temperature, seed, **settings):
    """A sampled request of prompt ``ids`` run alone (:func:`run_alone`): its row record."""
    request = wb.Request(prompt=ids, max_tokens=max_tokens, temperature=temperature, seed=seed, stop_ids=[])
    return run_alone(model, tok, request, **settings)


@pytest.mark.parametrize("n", [0, MAX_SAMPLES + 1, 2.0, True, None])
def test_a_bad_n_is_refused_naming_it_and_nothing_is_queued(make_sched, n):
    sched = make_sched()
    with pytest.raises(ValueError, match=r"submit_n: n must be an int in \[1, 1024\]"):
        sched.submit_n(wb.Request(prompt=[1, 2, 3]), n)
    assert not sched.requests


def test_a_bad_request_queues_no_sample(make_sched):
    sched = make_sched()
    with pytest.raises(ValueError, match="max_tokens"):
        sched.submit_n(wb.Request(prompt=[1, 2, 3], max_tokens=0), 4)
    assert not sched.requests and sched.state.next_uid == 0


def test_shared_rows_point_each_sample_at_its_groups_first_member_with_the_same_inputs(bundled):
    model, tok = bundled
    sched = wb.Scheduler(model, tok)
    sched.submit_n(wb.Request(prompt=[5, 6, 7]), 3)
    sched.submit(wb.Request(prompt=[5, 6, 7]))  # the same prompt, not a sample: its own prefill
    states: list[RequestState] = [sched.requests[u] for u in range(4)]
    assert shared_rows(states) == [0, 0, 0, 3]
    states[1].tokens.append(9)  # a resumed sample's inputs include its tokens
    assert shared_rows(states) == [0, 1, 0, 3]


@pytest.mark.parametrize(
    "options",
    [
        dict(max_batch=8),
        dict(max_batch=8, prefill_step_size=16),
        dict(max_batch=3, prefill_step_size=32, pipeline=False),
    ],
)
def test_sampled_samples_draw_as_seed_plus_i_alone_and_the_prompt_is_prefilled_once_per_group(
    bundled, prompt, options
):
    model, tok = bundled
    ids = prompt(70, 5)
    sched = wb.Scheduler(model, tok, **options)
    plain = sched.submit(wb.Request(prompt=prompt(20, 300), max_tokens=6, stop_ids=[]))
    request = wb.Request(
        prompt=ids, max_tokens=8, temperature=0.9, top_p=0.95, seed=11, stop_ids=[], top_logprobs=3
    )
    uids = sched.submit_n(request, 6)
    assert uids == list(range(1, 7)) and [sched.requests[u].seed for u in uids] == list(range(11, 17))
    sched.run()
    for i, uid in enumerate(uids):
        alone = run_alone(model, tok, wb.Request(**{**vars(request), "seed": 11 + i}), **options)
        assert row_record(sched, uid) == alone, f"sample {i} differs from Request(seed={11 + i}) alone"
    assert len({tuple(sched.tokens(u)) for u in uids}) > 1, "different seeds draw different samples"
    groups = admitted_groups(sched, uids)  # 8 rows take all six at once; 3 rows take them as rows free up
    assert len(groups) == 1 if options["max_batch"] == 8 else 1 < len(groups) < 6
    ran = prefill_tokens(sched, uids)  # later groups start from the first group's prompt (shared_prompts)
    assert sum(ran.values()) == len(ids) - 1, (ran, groups)
    assert [u for u in uids if ran[u]] == [uids[0]], "only the first sample is prefilled"
    chunk = options.get("prefill_step_size", 2048)
    n_chunks = sum(1 for e in sched.events if e.kind == "prefill" and e.uid in uids)
    assert n_chunks == math.ceil((len(ids) - 1) / chunk)
    cached = [e.n_cached for e in sched.events if e.kind == "admit" and e.uid in uids]
    assert cached == [0] * len(groups[0]) + [len(ids) - 1] * (len(uids) - len(groups[0]))
    assert row_record(sched, plain) == run_alone(model, tok, sched.request_of(plain).request, **options)


def test_greedy_samples_equal_each_other_and_the_prompt_alone_through_mlx_lm(bundled, prompt):
    model, tok = bundled
    sched = wb.Scheduler(model, tok, max_batch=4, prefill_step_size=8)
    first = sched.submit(wb.Request(prompt=prompt(9, 40), max_tokens=10, stop_ids=[]))
    sched.admit(), sched.step(), sched.step()
    uids = sched.submit_n(
        wb.Request(prompt=prompt(25, 7), max_tokens=9, stop_ids=[]), 3
    )  # join a running batch
    sched.run()
    assert len({tuple(sched.tokens(u)) for u in uids}) == 1
    assert [len(sched.tokens(u)) for u in uids] == [9, 9, 9]
    check = oracle.solo_check(model, sched, [first, *uids], atol=1e-4)
    assert check.ok, check.text()


def test_samples_with_a_prompt_cache_checkpoint_restore_and_fork_continue_with_the_same_tokens(
    bundled, prompt
):
    model, tok = bundled
    ids = prompt(40, 11)
    sched = wb.Scheduler(model, tok, max_batch=4, prefill_step_size=16, prompt_cache=4)
    warm = sched.submit(wb.Request(prompt=ids, max_tokens=3, stop_ids=[]))
    sched.run()  # the prompt is in the prompt cache now
    uids = sched.submit_n(wb.Request(prompt=ids, max_tokens=7, temperature=0.8, seed=3, stop_ids=[]), 4)
    sched.admit()
    cached = [e.n_cached for e in sched.events if e.kind == "admit" and e.uid in uids]
    assert cached == [cached[0]] * 4 and cached[0] >= 30, cached  # one prompt-cache hit, shared
    cp = sched.checkpoint()
    other = sched.fork()
    sched.run()
    first = {u: row_record(sched, u) for u in uids}
    sched.restore(cp)
    sched.run()
    assert {u: row_record(sched, u) for u in uids} == first
    other.run()
    assert {u: row_record(other, u) for u in uids} == first
    for i, u in enumerate(uids):
        assert first[u] == run_alone(
            model,
            tok,
            wb.Request(prompt=ids, max_tokens=7, temperature=0.8, seed=3 + i, stop_ids=[]),
            max_batch=4,
            prefill_step_size=16,
        )
    assert sched.finish_reason(warm) == "length"


@pytest.mark.parametrize("when", ["prefilling", "running"])
def test_aborting_one_sample_leaves_the_others_running_to_their_own_tokens(bundled, prompt, when):
    model, tok = bundled
    ids = prompt(30, 90)
    sched = wb.Scheduler(model, tok, max_batch=4, prefill_step_size=8)
    uids = sched.submit_n(wb.Request(prompt=ids, max_tokens=6, temperature=0.7, seed=20, stop_ids=[]), 4)
    sched.admit()  # one chunk of the shared prefill
    if when == "running":
        while sched.status(uids[0]) is not wb.Status.RUNNING:
            sched.admit()
        sched.step()
    sched.abort(uids[0])  # the sample whose prefill the others copy
    sched.run()
    assert sched.finish_reason(uids[0]) == "abort"
    for i, u in enumerate(uids[1:], 1):
        assert sched.finish_reason(u) == "length"
        assert row_record(sched, u) == sample_alone(
            model, tok, ids, 6, 0.7, 20 + i, max_batch=4, prefill_step_size=8
        )
    assert sched.check().ok


def test_a_preempted_sample_resumes_from_its_own_tokens(bundled, prompt):
    model, tok = bundled
    ids = prompt(12, 60)
    sched = wb.Scheduler(model, tok, max_batch=3)
    uids = sched.submit_n(wb.Request(prompt=ids, max_tokens=8, temperature=1.0, seed=7, stop_ids=[]), 3)
    sched.admit(), sched.step(), sched.step(), sched.step()
    sched.preempt(uids[1])
    sched.run()
    for i, u in enumerate(uids):
        assert row_record(sched, u) == sample_alone(model, tok, ids, 8, 1.0, 7 + i, max_batch=3)
    assert prefill_tokens(sched, [uids[1]])[uids[1]] == len(ids) - 1 + 3, "resumed: prompt and its 3 tokens"


def test_a_seedless_request_draws_one_seed_for_its_samples(make_sched):
    sched = make_sched()
    uids = sched.submit_n(wb.Request(prompt=[3, 4, 5], temperature=0.5), 3)
    seeds = [sched.requests[u].seed for u in uids]
    assert seeds == [seeds[0], seeds[0] + 1, seeds[0] + 2]


@pytest.mark.realmodel
@pytest.mark.usefixtures("solo_references_once")  # the three greedy samples: one mlx-lm solo run
def test_samples_on_the_real_model_equal_each_seed_alone_and_greedy_ones_equal_solo():
    from tests.real_model import chat_ids, dense_real_model

    model, tok = dense_real_model()
    ids = chat_ids(tok, "Write a haiku about rain.")
    sched = wb.Scheduler(model, tok, max_batch=6)
    sampled = sched.submit_n(wb.Request(prompt=ids, max_tokens=6, temperature=0.8, seed=1, stop_ids=[]), 3)
    greedy = sched.submit_n(wb.Request(prompt=ids, max_tokens=6, stop_ids=[]), 3)
    sched.run()
    assert sum(prefill_tokens(sched, sampled + greedy).values()) == 2 * (len(ids) - 1)
    for i, u in enumerate(sampled):
        assert row_record(sched, u) == sample_alone(model, tok, ids, 6, 0.8, 1 + i, max_batch=6)
    assert len({tuple(sched.tokens(u)) for u in greedy}) == 1
    check = oracle.solo_check(model, sched, greedy, atol=1e-4)
    assert check.ok, check.text()
