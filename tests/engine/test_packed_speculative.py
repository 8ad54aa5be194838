"""Speculative decoding in the packed layout (``workbench.engine.packed.verify``): a verify
forward is more tokens of the same request in the ``[1, T]`` forward, the rejected drafts
leave the row's pages. Every row equals the same request alone in the same settings (bit-equal
on the CPU; on a GPU, where matmuls round by shape, the same tokens and log-probs within the
oracle's 1e-4: :mod:`tests.engine.alone`), its greedy tokens equal the padded layout's with
speculation and plain greedy decoding (speculation with greedy acceptance changes no token),
and its log-probs equal its run alone through mlx-lm within the oracle's 1e-4; under staggered arrivals that mix verify
and prefill chunks in one forward, small token budgets, preemption and abort in the middle,
``submit_n`` samples sharing pages (copy-on-write before a trim), prefix caching,
checkpoint / restore / fork, sampled rows and ``max_tokens`` inside accepted drafts."""

from __future__ import annotations

import pytest

import workbench as wb
from tests.engine import drafting
from tests.engine.alone import row_record, run_alone
from tests.engine.test_speculative import CODE
from workbench.engine.packed.pages import PageTable
from workbench.engine.packed.verify import cap_drafts, observed_chunks, sampling_groups, verify_chunks
from workbench.observe.packed import Chunk, mask_text
from workbench.verify import oracle
from workbench.verify.compose import check_pair

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("solo_references_once")]


@pytest.fixture(scope="module")
def noisy_draft():
    """A draft model whose drafts the bundled model accepts in part (:mod:`tests.engine.drafting`)."""
    return drafting.noisy_draft()


def method_of(name, model, noisy):
    return {"prompt-lookup": "prompt-lookup", "noisy draft": noisy, "same model": model}[name]


def packed_spec(model, tok, **settings):
    base = dict(layout="packed", max_batch=3, page_size=4, max_num_batched_tokens=24)
    base |= dict(speculative="prompt-lookup", num_draft_tokens=4)
    return wb.Scheduler(model, tok, **(base | settings))


def books(sched):
    """The scheduler's own check, and each row's pages exactly those its held tokens need
    (a rejected draft's page went back)."""
    report = sched.check()
    assert report.ok, str(report)
    state = sched.snapshot().packed
    held = dict(state.held_tokens)
    for uid, pages in state.pages:
        assert len(pages) == -(-held[uid] // state.page_size), (uid, pages, held[uid])
    assert sum(c.n_tokens for c in state.last_chunks) <= sched.config.token_budget


def drive(sched, arrivals, every=2, each=None, stop=None):
    """Submit ``arrivals`` one every ``every`` steps (or when idle), ``admit(); step();
    filter()`` until idle (or ``stop`` steps), :func:`books` after each call; returns the uids
    and the chunks of every forward."""
    uids, pending, forwards = [], list(arrivals), []
    while (pending or not sched.idle) and (stop is None or sched.step_index < stop):
        while pending and (sched.step_index >= every * len(uids) or sched.idle):
            uids.append(sched.submit(pending.pop(0)))
        for call in (sched.admit, sched.step, sched.filter):
            call()
            books(sched)
        forwards.append(sched.snapshot().packed.last_chunks)
        if each is not None:
            each(sched, uids)
    return uids, forwards


def records(sched, uids):
    """Each row's :func:`~tests.engine.alone.row_record`: ``==`` is bit equality on the CPU, tokens
    exact and log-probs within 1e-4 on a GPU."""
    return [row_record(sched, u) for u in uids]


def alone(model, tok, request, settings):
    return run_alone(model, tok, request, **settings)


def arrivals_of(n=7):
    return [wb.Request(prompt=CODE[i % 4] * (1 + i % 2), max_tokens=9 + 7 * (i % 3)) for i in range(n)]


# -- pure functions -------------------------------------------------------------------
def test_drafts_are_cut_to_the_budget_in_row_order_and_each_draft_is_a_one_token_decode_chunk():
    """And the snapshot shows a row's token and drafts as one decode chunk (the views draw it)."""
    assert cap_drafts([[1, 2, 3], [4, 5], [6]], 4) == [[1, 2, 3], [4], []]
    assert cap_drafts([[1, 2]], 0) == [[]]
    chunks = verify_chunks(
        [Chunk(0, 5, 1, "decode"), Chunk(1, 2, 1, "decode"), Chunk(2, 0, 6, "prefill", samples=False)],
        {0: [7, 8], 1: []},
    )
    assert chunks == (
        Chunk(0, 5, 1, "decode"),
        Chunk(0, 6, 1, "decode"),
        Chunk(0, 7, 1, "decode"),
        Chunk(1, 2, 1, "decode"),
        Chunk(2, 0, 6, "prefill", samples=False),
    )
    assert sampling_groups([0, 0, 0, 1, 3, 2, 2]) == [(0, 3), (1, 1), (3, 1), (2, 2)]
    shown = observed_chunks(chunks)
    assert shown == (
        Chunk(0, 5, 3, "decode"),
        Chunk(1, 2, 1, "decode"),
        Chunk(2, 0, 6, "prefill", samples=False),
    )
    assert mask_text(shown).splitlines()[1:4] == [  # the verify tokens: causal over the row's keys
        "       0@5 ######..|...|......",
        "       0@6 #######.|...|......",
        "       0@7 ########|...|......",
    ]


def test_freeing_all_but_the_first_pages_keeps_a_shared_page_and_frees_the_rows_own():
    t = PageTable(4)
    t.reserve(0, 6)  # pages [0, 1]
    t.fork(0, 1)  # uid 1 shares both
    t.reserve(1, 12)  # and gets page 2 of its own
    assert t.free(1, keep=1) == [2] and t.pages[1] == [0] and t.refs == {0: 2, 1: 1}
    assert t.free(1, keep=3) == [] and t.pages[1] == [0]
    assert t.free(1) == [] and 1 not in t.pages and t.refs == {0: 1, 1: 1} and t.problems() == []


# -- through the scheduler ------------------------------------------------------------
@pytest.mark.parametrize(
    "method, page_size, budget",
    [("prompt-lookup", 4, 24), ("prompt-lookup", 1, 9), ("noisy draft", 16, 32), ("same model", 7, 12)],
)
def test_every_row_equals_its_run_alone_and_the_padded_and_plain_greedy_tokens_with_mixed_forwards(
    bundled, noisy_draft, method, page_size, budget
):
    model, tok = bundled
    settings = dict(
        layout="packed",
        max_batch=3,
        page_size=page_size,
        max_num_batched_tokens=budget,
        speculative=method_of(method, model, noisy_draft),
        num_draft_tokens=4,
    )
    sched = wb.Scheduler(model, tok, **settings)
    arrivals = arrivals_of()
    uids, forwards = drive(sched, arrivals)
    check = oracle.solo_check(model, sched)
    assert check.ok, check.text()
    events = [e for e in sched.events if e.kind == "draft"]
    assert sum(e.n_accepted for e in events) > 20, "drafts were accepted"
    if method == "noisy draft":
        assert sum(e.n_accepted for e in events) < sum(e.n_tokens for e in events), "some were rejected"
    verify = [f for f in forwards if any(c.kind == "decode" and c.n_tokens > 1 for c in f)]  # a row's 1 + n
    assert all(len({c.uid for c in f}) == len(f) for f in forwards), (
        "the snapshot shows one chunk per request"
    )
    assert any(any(c.kind == "prefill" for c in f) for f in verify), (
        "a forward mixed verify and prefill chunks"
    )
    assert all(sum(c.n_tokens for c in f) <= budget for f in forwards)
    ours = records(sched, uids)
    for request, mine in zip(arrivals, ours):  # equal to the same request alone (bit-equal on the CPU)
        assert mine == alone(model, tok, request, settings)
    padded = wb.Scheduler(model, tok, max_batch=3, speculative=settings["speculative"], num_draft_tokens=4)
    plain = wb.Scheduler(model, tok, layout="packed", max_batch=3, page_size=page_size)
    for other in (padded, plain):
        theirs = [other.submit(r) for r in arrivals]
        other.run()
        assert [list(r.tokens) for r in ours] == [other.tokens(u) for u in theirs]


def test_a_budget_too_small_for_every_draft_cuts_them_and_rows_stay_equal_alone(bundled):
    """Running rows' tokens and drafts come first (vLLM's scheduler counts draft tokens in
    ``max_num_batched_tokens`` the same way), prefill chunks take what is left."""
    model, tok = bundled
    sched = packed_spec(model, tok, max_batch=4, max_num_batched_tokens=6, num_draft_tokens=4)
    prompts = ["import os\nimport sys\n" * 2, "x = 1\n" * 3, "a = b\n" * 3, "y = 2\n" * 3]
    uids, forwards = drive(sched, [wb.Request(prompt=p, max_tokens=30) for p in prompts], every=0)
    assert all(sum(c.n_tokens for c in f) <= 6 for f in forwards)
    rows = [sum(c.kind == "decode" for c in f) for f in forwards]
    drafts = [sum(c.n_tokens for c in f if c.kind == "decode") - n for f, n in zip(forwards, rows)]
    assert any(n >= 2 and d == 6 - n for n, d in zip(rows, drafts)), "two rows' drafts filled the budget"
    assert any(d and any(c.kind == "prefill" for c in f) for d, f in zip(drafts, forwards))
    check = oracle.solo_check(model, sched, uids)
    assert check.ok, check.text()


def test_a_preemption_and_an_abort_in_the_middle_leave_every_other_row_equal(bundled, noisy_draft):
    model, tok = bundled
    for speculative in ("prompt-lookup", noisy_draft):
        sched = packed_spec(model, tok, speculative=speculative, num_draft_tokens=3)
        uids = [sched.submit(wb.Request(prompt=p * 2, max_tokens=30)) for p in CODE[:3]]
        while not any(e.kind == "draft" and e.n_accepted for e in sched.events) or sched.step_index < 8:
            sched.admit(), sched.step(), sched.filter()
            books(sched)
        assert all(sched.status(u).name == "RUNNING" for u in uids[:2])
        sched.preempt(uids[0])
        sched.abort(uids[1])
        books(sched)
        sched.run()
        books(sched)
        assert sched.finish_reason(uids[1]) == "abort" and sched.finish_reason(uids[0]) == "length"
        check = oracle.solo_check(model, sched, [uids[0], uids[2]])
        assert check.ok, check.text()
        settings = dict(layout="packed", max_batch=3, page_size=4, max_num_batched_tokens=24)
        settings |= dict(speculative=speculative, num_draft_tokens=3)
        assert records(sched, [uids[2]])[0] == alone(
            model, tok, wb.Request(prompt=CODE[2] * 2, max_tokens=30), settings
        )


def test_a_kv_budget_preempts_a_speculating_row_for_priority_and_it_resumes_from_its_pages(bundled):
    """The preempted row's accepted drafts were indexed in its pages (prefix caching): it
    resumes from them (``n_cached``), and every row equals its run alone."""
    model, tok = bundled
    probe = packed_spec(model, tok)
    two = 2 * probe.ledger.alone_bytes(24, 24)
    sched = packed_spec(model, tok, kv_budget_bytes=two, prompt_cache=32, policy="priority")
    prompts = ["import os\nimport sys\n" * 2, "x = 1\n" * 4, "a = b\n" * 4]
    low = [sched.submit(wb.Request(prompt=p, max_tokens=24)) for p in prompts[:2]]
    while not any(e.kind == "draft" and e.n_accepted for e in sched.events) or sched.step_index < 6:
        sched.admit(), sched.step(), sched.filter()
        books(sched)
    high = sched.submit(wb.Request(prompt=prompts[2], max_tokens=24, priority=2))
    events = sched.admit()
    assert [e.kind for e in events if e.kind == "preempt"] == ["preempt"]
    books(sched)
    drive(sched, [])
    preempted = next(e.uid for e in events if e.kind == "preempt")
    cached = [e.n_cached for e in sched.events if e.kind == "admit" and e.uid == preempted][-1]
    assert cached > len(sched.request(preempted).prompt_ids), "pages past its prompt: speculated tokens"
    check = oracle.solo_check(model, sched, low + [high])
    assert check.ok, check.text()


@pytest.mark.parametrize("page_size", [16, 5])
def test_submit_n_samples_sharing_pages_speculate_without_corrupting_the_shared_pages(bundled, page_size):
    """Greedy samples of one ``submit_n`` share every page of the prompt, the half-filled last
    one included; each verify writes its drafts into a copy of that page (copy-on-write), so a
    trim after a rejected draft never touches a sibling's keys: every sample equals the same
    request alone."""
    model, tok = bundled
    settings = dict(layout="packed", max_batch=4, page_size=page_size, max_num_batched_tokens=32)
    settings |= dict(speculative="prompt-lookup", num_draft_tokens=4, prompt_cache=8)
    sched = wb.Scheduler(model, tok, **settings)
    request = wb.Request(prompt=CODE[0] * 2, max_tokens=24)
    shared = []

    def watch(s, _):
        pages = dict(s.snapshot().packed.pages)
        if len(pages) > 1:
            lists = list(pages.values())
            shared.append(len(set(lists[0]) & set(lists[1])))

    uids = sched.submit_n(request, 3)
    drive(sched, [], each=watch)
    assert shared and max(shared) >= 1, "the samples held pages in common"
    assert sum(e.n_accepted for e in sched.events if e.kind == "draft") > 5
    solo = alone(model, tok, request, settings)
    assert records(sched, uids) == [solo] * 3
    check = oracle.solo_check(model, sched, uids)
    assert check.ok, check.text()


def test_a_cached_prefix_and_an_aborted_leader_with_speculation_stay_equal_alone(bundled):
    model, tok = bundled
    settings = dict(layout="packed", max_batch=3, page_size=4, max_num_batched_tokens=24, prompt_cache=16)
    settings |= dict(speculative="prompt-lookup", num_draft_tokens=3)
    sched = wb.Scheduler(model, tok, **settings)
    first = sched.submit(wb.Request(prompt=CODE[1] * 2, max_tokens=16))
    sched.run()
    again = sched.submit(wb.Request(prompt=CODE[1] * 2 + "    def", max_tokens=16))
    samples = sched.submit_n(wb.Request(prompt=CODE[0] * 2, max_tokens=18, temperature=0.7, seed=5), 2)
    sched.admit()
    sched.abort(samples[0])  # the leader leaves while its followers wait for its prefill
    drive(sched, [])
    assert [e.n_cached for e in sched.events if e.kind == "admit"][1] > 0, "a prefix hit on speculated pages"
    for uid, request in [
        (first, wb.Request(prompt=CODE[1] * 2, max_tokens=16)),
        (again, wb.Request(prompt=CODE[1] * 2 + "    def", max_tokens=16)),
        (samples[1], wb.Request(prompt=CODE[0] * 2, max_tokens=18, temperature=0.7, seed=6)),
    ]:
        assert records(sched, [uid])[0] == alone(model, tok, request, settings)


def test_sampled_rows_draw_the_tokens_they_draw_without_speculation(bundled):
    """A sampled row (with mlx-lm's repetition penalty or not) accepts a draft where its own
    seeded draw equals it: the tokens of its run without speculation."""
    model, tok = bundled
    sampled = dict(temperature=0.8, seed=8)
    requests = [
        wb.Request(prompt=CODE[0] * 2, max_tokens=20),
        wb.Request(prompt=CODE[1] * 2, max_tokens=20, **sampled),
        wb.Request(prompt=CODE[2] * 2, max_tokens=20, repetition_penalty=1.1, **sampled),
        wb.Request(prompt=CODE[3] * 2, max_tokens=20),
    ]
    runs = {}
    for name, settings in {"plain": dict(speculative=None, pipeline=False), "spec": {}}.items():
        sched = packed_spec(model, tok, max_batch=4, num_draft_tokens=3, **settings)
        uids = [sched.submit(r) for r in requests]
        sched.run()
        runs[name] = (records(sched, uids), sched)
    for (tokens, logprobs, _, _), (plain_tokens, plain_logprobs, _, _) in zip(
        runs["spec"][0], runs["plain"][0]
    ):
        assert list(tokens) == list(plain_tokens)
        assert max(abs(x - y) for x, y in zip(logprobs, plain_logprobs)) < 1e-4
    events = [e for e in runs["spec"][1].events if e.kind == "draft" and e.n_accepted]
    assert {1, 2} <= {e.uid for e in events}, "the sampled rows took and accepted drafts"


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 6])
def test_max_tokens_inside_an_accepted_draft_ends_the_row_where_solo_ends(bundled, max_tokens):
    model, tok = bundled
    sched = packed_spec(model, tok, max_batch=2, speculative=model, num_draft_tokens=4)  # all accepted
    uids = [sched.submit(wb.Request(prompt=p, max_tokens=max_tokens)) for p in CODE[:2]]
    sched.run()
    assert [len(sched.tokens(u)) for u in uids] == [max_tokens] * 2
    assert all(sched.finish_reason(u) == "length" for u in uids)
    check = oracle.solo_check(model, sched, uids)
    assert check.ok, check.text()


@pytest.mark.parametrize("method", ["prompt-lookup", "noisy draft"])
def test_restoring_a_checkpoint_repeats_the_same_tokens_and_draft_events_and_a_fork_continues_alike(
    bundled, noisy_draft, method
):
    model, tok = bundled
    sched = packed_spec(model, tok, speculative=method_of(method, model, noisy_draft), num_draft_tokens=3)
    drive(
        sched, [wb.Request(prompt=p * 2, max_tokens=16 + 3 * i) for i, p in enumerate(CODE)], every=0, stop=5
    )
    cp, fork = sched.checkpoint(), sched.fork()
    assert any(e.kind == "draft" for e in sched.events), "checkpointed after speculating"

    def outcome(s):
        drafts = [(e.uid, e.step, e.n_tokens, e.n_accepted) for e in s.events if e.kind == "draft"]
        return {u: s.tokens(u) for u in s.requests}, drafts

    sched.run()
    first = outcome(sched)
    sched.restore(cp)
    books(sched)
    sched.run()
    assert outcome(sched) == first
    fork.run()
    assert outcome(fork)[0] == first[0]
    check = oracle.solo_check(model, sched)
    assert check.ok, check.text()


def test_the_compose_pair_runs_with_every_row_equal_alone(bundled):
    model, tok = bundled
    result = check_pair(model, tok, ("packed", "speculative"))
    assert result.result == "runs" and result.rows == 8 == result.equal, result


@pytest.mark.parametrize("other", [dict(kv_bits=8, kv_group_size=32), dict(adapters="prose")])
def test_speculating_with_kv_bits_or_adapters_in_the_packed_layout_is_refused_naming_them(bundled, other):
    """Each pair composes; the packed verify path does not run quantized pages or per-token
    adapters (three settings at once): refused, naming the setting."""
    from workbench.verify.compose import ADAPTERS

    model, tok = bundled
    settings = dict(layout="packed", speculative="prompt-lookup") | other
    if "adapters" in other:
        settings["adapters"] = ADAPTERS
    with pytest.raises(ValueError, match="layout='packed'.*(kv_bits|adapters)"):
        wb.Scheduler(model, tok, **settings)


def test_the_packed_views_show_a_rows_token_and_drafts_as_one_causal_decode_chunk(bundled):
    from workbench.views.packed import packed_text, render_packed_mask, render_token_budget

    model, tok = bundled
    sched = packed_spec(model, tok, speculative=model, num_draft_tokens=3)  # drafting for itself
    sched.submit(wb.Request(prompt=CODE[0], max_tokens=12))
    sched.run()
    shown = [
        s for s in sched.history if any(c.n_tokens == 4 and c.kind == "decode" for c in s.packed.last_chunks)
    ]
    assert shown, "a forward verified three drafts"
    assert "decode positions" in packed_text(shown[0]) and "T=4 tokens" in packed_text(shown[0])
    render_packed_mask(shown[0])
    render_token_budget(sched.history)
