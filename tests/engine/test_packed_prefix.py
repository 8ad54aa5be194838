"""Prefix caching in the packed layout (``prompt_cache=N``): requests whose prompts begin
with the same whole pages of tokens share those pages (counted once), a finished request's
full pages stay cached for a repeat prompt (LRU under the page budget), ``submit_n``
samples share one prefill and copy the shared last page on their first write; every row
equals its run alone (mlx-lm, tokens and log-probs within 1e-4), and the readings (prefill
tokens from the ``prefill`` events, bytes from the snapshot) drop by what was shared."""

from dataclasses import replace

import pytest

import workbench as wb
from tests.engine.alone import run_alone
from tests.engine.interrupts import Injector, wrapped_layers
from tests.engine.test_packed import check_books, packed
from workbench.verify import oracle
from workbench.workloads.workload import prompt_of_length

pytestmark = pytest.mark.model


def prefill_tokens(sched, uid):
    """Prompt tokens the engine prefilled for ``uid``, from its ``prefill`` events."""
    return sum(e.n_tokens for e in sched.events if e.kind == "prefill" and e.uid == uid)


def admitted_cached(sched, uid):
    """``n_cached`` of ``uid``'s admit events, in order."""
    return [e.n_cached for e in sched.events if e.kind == "admit" and e.uid == uid]


def drive(sched, until=None, record=None):
    """``admit(); step(); filter()`` with the books checked after each call, until idle or
    ``until()``; ``record(snapshot)`` after each step."""
    while not sched.idle and not (until and until()):
        for call in (sched.admit, sched.step, sched.filter):
            call()
            check_books(sched)
            if record and call == sched.step:
                record(sched.snapshot())


def submit(sched, prompt, max_tokens=8, **fields):
    return sched.submit(wb.Request(prompt=prompt, max_tokens=max_tokens, stop_ids=[], **fields))


def test_a_shared_prompt_prefix_is_prefilled_once_and_counted_once(bundled):
    model, tok = bundled
    sched = packed(model, tok, prompt_cache=0)
    A = prompt_of_length(tok, 30, 0)
    B = A[:24] + prompt_of_length(tok, 7, 500)  # A's first 6 pages of 4, then its own tail
    C = prompt_of_length(tok, 4, 700) + A[4:24]  # A's pages 1..5 at other positions: no page shared
    a = submit(sched, A, 12)
    drive(sched, until=lambda: sched.requests[a].status is wb.Status.RUNNING)
    b, c = submit(sched, B), submit(sched, C)
    seen = []
    drive(sched, record=seen.append)
    assert admitted_cached(sched, b) == [24] and admitted_cached(sched, c) == [0]
    assert prefill_tokens(sched, a) == 30 and prefill_tokens(sched, b) == 31 - 24
    assert prefill_tokens(sched, c) == 24
    first = next(s for s in seen if {a, b, c} <= dict(s.packed.pages).keys())  # c: pages of its own
    pages, held = dict(first.packed.pages), dict(first.packed.held_tokens)
    assert pages[b][:6] == pages[a][:6] and set(first.packed.shared_pages) == set(pages[a][:6])
    assert not set(pages[c]) & set(pages[a])
    need = sum(-(-held[u] // 4) for u in pages) - 6  # each row's pages from its tokens, the 6 shared once
    assert first.kv_bytes == need * first.packed.page_bytes
    assert "*" in first.packed.text() and "cached pages" in first.packed.text()
    check = oracle.solo_check(model, sched, [a, b, c], atol=1e-4)
    assert check.ok, check.text()


def test_a_repeat_prompt_after_its_first_run_prefills_only_its_uncached_tail(bundled):
    model, tok = bundled
    sched = packed(model, tok, prompt_cache=64)
    p = prompt_of_length(tok, 37, 100)
    first = submit(sched, p, 6)
    sched.run()
    snap = sched.snapshot()
    cached = snap.packed.cached_pages
    assert snap.kv_bytes == 0 and len(cached) == (37 + 5) // 4  # the fed tokens' full pages
    assert snap.prompt_cache_bytes == len(cached) * snap.packed.page_bytes
    again = submit(sched, p, 6)
    turn = submit(sched, p + sched.tokens(first)[:5] + prompt_of_length(tok, 3, 800), 4)
    sched.run()
    assert admitted_cached(sched, again) == [36] and prefill_tokens(sched, again) == 1
    assert admitted_cached(sched, turn) == [40] and prefill_tokens(sched, turn) == 45 - 40  # generated too
    assert sched.tokens(again) == sched.tokens(first)
    metrics = sched.report().requests.set_index("uid")
    assert metrics.loc[again, "cached_tokens"] == 36
    check = oracle.solo_check(model, sched, [first, again, turn], atol=1e-4)
    assert check.ok, check.text()


def test_cached_pages_are_evicted_least_recently_used_first_under_the_page_budget(bundled):
    model, tok = bundled
    probe = packed(model, tok)
    budget = 2 * probe.ledger.alone_bytes(20, 4)  # 12 pages of 4
    sched = packed(model, tok, max_batch=1, prompt_cache=64, kv_budget_bytes=budget)
    prompts = [prompt_of_length(tok, 20, 200 * i) for i in range(3)]
    uids = [submit(sched, q, 4) for q in prompts]
    drive(sched)
    assert sched.snapshot().packed.capacity_pages <= 12
    newest, oldest = submit(sched, prompts[2], 4), submit(sched, prompts[0], 4)
    drive(sched)
    assert admitted_cached(sched, newest) == [16]  # (20 - 1) // 4 pages
    assert admitted_cached(sched, oldest)[0] < 16  # its tail pages were evicted first
    snap = sched.snapshot()
    assert snap.held_bytes <= budget and snap.packed.capacity_pages <= 12
    check = oracle.solo_check(model, sched, uids + [newest, oldest], atol=1e-4)
    assert check.ok, check.text()


def test_preemption_abort_checkpoint_restore_and_fork_with_shared_pages_keep_rows_equal_to_solo(bundled):
    model, tok = bundled
    sched = packed(model, tok, max_num_batched_tokens=8, prompt_cache=16)
    uids = [submit(sched, prompt_of_length(tok, 30, 0), 6)]
    drive(sched, until=lambda: sched.requests[uids[0]].status is wb.Status.RUNNING)
    uids += [
        submit(sched, prompt_of_length(tok, n, 0), m) for n, m in ((22, 9), (41, 5), (9, 7))
    ]  # its prefixes
    drive(sched, until=lambda: sched.step_index >= 6)
    running = [r.uid for r in sched.batch.rows if r.status is wb.Status.RUNNING]
    sched.preempt(running[0])  # its pages stay shared by the others or go to the cached pages
    check_books(sched)
    cp, fork = sched.checkpoint(), sched.fork()
    drive(sched, until=lambda: sched.step_index >= 9)
    joining = [r.uid for r in sched.batch.rows if r.status is wb.Status.PREFILLING]
    if joining:
        sched.abort(joining[-1])
    late = submit(sched, prompt_of_length(tok, 26, 0), 6)
    drive(sched)
    first = {u: sched.tokens(u) for u in sched.requests}
    assert admitted_cached(sched, running[0])[-1] > 0  # resumed from its own cached pages
    assert admitted_cached(sched, late)[0] > 0
    sched.restore(cp)
    drive(sched, until=lambda: sched.step_index >= 9)
    if joining:
        sched.abort(joining[-1])
    submit(sched, prompt_of_length(tok, 26, 0), 6)
    drive(sched)
    assert {u: sched.tokens(u) for u in sched.requests} == first
    drive(fork)
    assert all(fork.tokens(u) == first[u] for u in uids if u not in joining)
    done = [u for u in sched.requests if sched.finish_reason(u) == "length"]
    check = oracle.solo_check(model, sched, done, atol=1e-4)
    assert check.ok, check.text()
    assert sched.snapshot().packed.used_pages == 0


@pytest.mark.parametrize("abort_leader", [False, True])
def test_submit_n_samples_share_one_prefill_and_copy_the_shared_page_on_write(bundled, abort_leader):
    model, tok = bundled
    # not pipelined: the step that joins the samples would already launch their first writes
    settings = dict(layout="packed", max_batch=4, page_size=4, max_num_batched_tokens=10, pipeline=False)
    sched = wb.Scheduler(model, tok, **settings)
    req = wb.Request(prompt=prompt_of_length(tok, 22, 0), max_tokens=6, temperature=0.8, seed=5, stop_ids=[])
    uids = sched.submit_n(req, 3)
    sched.admit()
    sched.step()  # the leader's first 10 prompt tokens: page 2 half full
    if abort_leader:
        sched.abort(uids[0])
    drive(sched, until=lambda: all(sched.requests[u].status is not wb.Status.PREFILLING for u in uids))
    state = sched.snapshot().packed
    pages = dict(state.pages)
    live = uids[1:] if abort_leader else uids
    assert all(pages[u] == pages[live[0]] for u in live)  # one prefill, its pages shared by every sample
    assert sum(prefill_tokens(sched, u) for u in uids) == 22
    sched.step()  # each sample writes its own token: the shared last page is copied first
    pages = dict(sched.snapshot().packed.pages)
    assert len({pages[u][-1] for u in live}) == len(live) and all(
        pages[u][:5] == pages[live[0]][:5] for u in live
    )
    check_books(sched)
    drive(sched)
    for i, u in enumerate(uids):
        if u in live:
            alone = run_alone(model, tok, replace(req, seed=5 + i), **settings)
            assert sched.tokens(u) == list(alone[0])
            assert max(abs(x - y) for x, y in zip(sched.logprobs(u), alone[1])) < 1e-4


def test_a_step_interrupted_after_overwriting_evicted_cached_pages_leaves_no_stale_hit(bundled):
    """The savepoint shares the pools, written in place: a cached page the interrupted step
    handed out again holds another request's KV now, so a later lookup must miss it."""
    model, tok = bundled
    budget = packed(model, tok).ledger.alone_bytes(20, 4)  # 6 pages of 4: one request at a time
    sched = packed(model, tok, max_batch=1, prompt_cache=64, kv_budget_bytes=budget)
    A = prompt_of_length(tok, 20, 0)
    first = submit(sched, A, 4)
    sched.run()
    other = submit(sched, prompt_of_length(tok, 20, 300), 4)
    sched.admit()
    before, injector = sched.snapshot().packed, Injector()
    assert before.cached_pages == (4, 3, 2, 1, 0) and before.free_pages == (5,)
    with wrapped_layers(model, injector):
        injector.arm(3)  # layer 1's entry: layer 0 wrote pages 5, 4, 3, 2 (the last three evicted)
        with pytest.raises(KeyboardInterrupt):
            sched.step()
    assert sched.snapshot().packed == before and sched.check().ok
    sched.abort(other)
    sched.filter()
    again = submit(sched, A, 4)
    sched.run()
    assert admitted_cached(sched, again) == [8]  # pages 0 and 1 only: 2, 3, 4 were written again
    check = oracle.solo_check(model, sched, [first, again], atol=1e-4)
    assert check.ok, check.text()
