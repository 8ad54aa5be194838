"""Speculative decoding inside the batch (``workbench.engine.levers.speculative`` and
``draft_model``): pure drafting, acceptance and per-row trimming on hand-built arrays;
every greedy row equal to its run alone through mlx-lm (the solo oracle) under staggered
joins, free slots, stop strings and ``max_tokens`` landing inside accepted drafts,
preemption, abort, checkpoint / restore / fork; sampled rows equal to the same seeded
request without speculation; refusals of what cannot speculate."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import BatchKVCache

import workbench as wb
from workbench.engine.levers.speculative import accepted_counts, lookup_drafts, trim_rows
from workbench.runtime.loading import DATA_DIR
from workbench.verify import oracle

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("solo_references_once")]

# prompts that repeat themselves (prompt lookup finds drafts) and ones that do not
CODE = [
    "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "import os\nimport sys\n",
    "x = 1",
]


def assert_solo(model, sched, uids=None):
    check = oracle.solo_check(model, sched, uids)
    assert check.ok, check.text()
    return check


def drafts_of(sched):
    return [e for e in sched.events if e.kind == "draft"]


@pytest.fixture(scope="module")
def noisy_draft():
    """The bundled model with its last layer's MLP zeroed: same vocabulary, drafts that
    the target accepts only in part."""
    model, _ = wb.load()
    mlp = model.layers[-1].mlp
    mlp.down_proj.weight = mx.zeros_like(mlp.down_proj.weight)
    mx.eval(model.parameters())
    return model


# -- pure functions -------------------------------------------------------------------
def test_prompt_lookup_drafts_follow_the_latest_earlier_occurrence_of_the_longest_suffix():
    assert lookup_drafts([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2) == [7, 1]  # "1 2 3" last seen at 4: then 7 1
    assert lookup_drafts([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]
    assert lookup_drafts([4, 1, 2, 4, 3, 2, 4], 3, max_ngram=3) == [3, 2, 4]  # "2 4" at 4..5 (not "4" alone)
    assert lookup_drafts([1, 2, 3], 4) == []
    assert lookup_drafts([1, 1], 5) == [1]  # the draft runs up to the end of the context
    assert lookup_drafts([3, 1, 3], 0) == []


def test_greedy_acceptance_stops_at_the_first_draft_the_target_did_not_choose():
    assert accepted_counts([[4, 5, 6], [], [7, 8], [1]], [[4, 5, 6, 2], [3], [2, 8, 0], [1, 1]]) == [
        3,
        0,
        0,
        1,
    ]


def hand_cache(rows):
    """A BatchKVCache whose keys hold each row's token ids (``[B, 1, S, 1]``), left-padded."""
    width = max(len(r) for r in rows)
    cache = BatchKVCache([width - len(r) for r in rows])
    keys = mx.array([[[[0.0]] * (width - len(r)) + [[float(t)] for t in r]] for r in rows])  # [B, 1, S, 1]
    cache.update_and_fetch(keys, keys)
    return cache


def visible(cache):
    """Each row's attended keys at the next one-token step (the mask of ``make_mask(1)``)."""
    mask = np.array(cache.make_mask(1)).reshape(cache.offset.shape[0], -1)
    keys = np.array(cache.keys[..., : cache.size(), 0])[:, 0]  # [B, S]
    return [keys[b][mask[b][:-1]].astype(int).tolist() for b in range(len(keys))]


def test_trimming_rows_by_different_counts_keeps_each_rows_accepted_tokens_in_order():
    cache = hand_cache([[1, 2, 3, 9, 9], [4, 5, 9, 9, 9], [6, 7, 8, 10, 11]])  # 9: rejected drafts
    trim_rows([cache], [2, 3, 0])
    assert visible(cache) == [[1, 2, 3], [4, 5], [6, 7, 8, 10, 11]]
    assert cache.offset.tolist() == [3, 2, 5]  # RoPE positions follow the kept tokens
    assert cache.left_padding.tolist() == [2, 3, 0] and cache.size() == 5  # the width: the longest row


def test_trimming_every_row_by_the_same_count_only_moves_the_write_index():
    cache = hand_cache([[1, 2, 9], [3, 4, 9]])
    trim_rows([cache], [1, 1])
    assert visible(cache) == [[1, 2], [3, 4]] and cache.left_padding.tolist() == [0, 0] and cache.size() == 2


# -- the oracle ----------------------------------------------------------------------
@pytest.mark.parametrize("method", ["prompt-lookup", "noisy draft", "same model"])
def test_every_greedy_row_equals_its_run_alone_with_staggered_joins_and_free_slots(
    bundled, noisy_draft, method
):
    model, tok = bundled
    speculative = {"prompt-lookup": "prompt-lookup", "noisy draft": noisy_draft, "same model": model}[method]
    sched = wb.Scheduler(model, tok, max_batch=3, speculative=speculative, num_draft_tokens=4)
    arrivals = [
        (i, wb.Request(prompt=CODE[i % 4] * (1 + i % 2), max_tokens=9 + 7 * (i % 3))) for i in range(8)
    ]
    checks = []
    pending = list(arrivals)
    while pending or not sched.idle:
        while pending and (pending[0][0] <= sched.step_index or sched.idle):
            sched.submit(pending.pop(0)[1])
        sched.admit()
        sched.step()
        checks.append(sched.check())
        sched.filter()
    assert all(c.ok for c in checks), [str(c) for c in checks if not c.ok]
    assert_solo(model, sched)
    events = drafts_of(sched)
    accepted = sum(e.n_accepted for e in events)
    assert accepted > 20, "drafts were accepted"
    if method == "noisy draft":
        assert accepted < sum(e.n_tokens for e in events), "some drafts were rejected"
    assert {e.join_mode for e in sched.events if e.kind == "join"} >= {"free slot"}
    tokens = [e for e in sched.events if e.kind == "token"]
    assert len(tokens) > 1.3 * len({(e.uid, e.step) for e in tokens}), (
        "rows advanced by more than a token a step"
    )


def test_rows_with_different_draft_counts_share_one_verify_forward(bundled, make_sched):
    model, tok = bundled
    sched = make_sched(max_batch=4, speculative="prompt-lookup", num_draft_tokens=4)
    for p in CODE:
        sched.submit(wb.Request(prompt=p * 2, max_tokens=24))
    sched.run()
    by_step = {}
    for e in drafts_of(sched):
        by_step.setdefault(e.step, []).append(e.n_tokens)
    assert any(len(set(n)) > 1 or len(n) < 4 for n in by_step.values()), "some step mixed draft counts"
    assert_solo(model, sched)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 6, 11])
def test_max_tokens_inside_an_accepted_draft_ends_the_row_where_solo_ends(bundled, make_sched, max_tokens):
    model, tok = bundled
    sched = make_sched(max_batch=2, speculative=model, num_draft_tokens=4)  # the same model: all accepted
    uids = [sched.submit(wb.Request(prompt=p, max_tokens=max_tokens)) for p in CODE[:2]]
    sched.run()
    assert [len(sched.tokens(u)) for u in uids] == [max_tokens] * 2
    assert all(sched.finish_reason(u) == "length" for u in uids)
    assert all(e.n_tokens <= max_tokens for e in drafts_of(sched))
    assert_solo(model, sched)


def self_drafted(make_sched, model, **request):
    """``(tokens, scheduler)`` of one request drafted by the model itself (every draft accepted)."""
    sched = make_sched(speculative=model, num_draft_tokens=4)
    uid = sched.submit(wb.Request(**request))
    sched.run()
    return sched.tokens(uid), sched


def test_a_stop_string_completed_inside_an_accepted_draft_ends_the_row_where_solo_ends(bundled, make_sched):
    model, tok = bundled
    tokens, _ = self_drafted(make_sched, model, prompt=CODE[0], max_tokens=40)
    # a stop string completed by token 6, 7 or 8: drafts accepted in the second step, more after them
    j, stop = next(
        (j, tok.decode(tokens[: j + 1])[-n:])
        for j in (6, 7, 8)
        for n in range(1, 8)
        if tok.decode(tokens[: j + 1])[-n:].strip()
        and tok.decode(tokens[: j + 1])[-n:] not in tok.decode(tokens[:j])
    )
    stopped, sched = self_drafted(make_sched, model, prompt=CODE[0], max_tokens=40, stop=stop)
    uid = 0
    assert sched.finish_reason(uid) == "stop" and stopped == tokens[: j + 1]
    last = drafts_of(sched)[-1]
    assert last.n_accepted > len([e for e in sched.events if e.kind == "token" and e.step == last.step]) - 1
    assert_solo(model, sched)
    assert stop not in sched.text(uid)


def test_a_stop_id_inside_an_accepted_draft_ends_the_row_there(bundled, make_sched):
    model, tok = bundled
    tokens, _ = self_drafted(make_sched, model, prompt=CODE[1], max_tokens=30)
    stop_id = next(t for i, t in enumerate(tokens) if i >= 2 and t not in tokens[:i])
    stopped, sched = self_drafted(make_sched, model, prompt=CODE[1], max_tokens=30, stop_ids=[stop_id])
    assert stopped == tokens[: tokens.index(stop_id) + 1] and sched.finish_reason(0) == "stop"
    assert_solo(model, sched)


def test_sampled_rows_draw_the_tokens_they_draw_without_speculation(bundled, make_sched):
    model, tok = bundled

    def run(**kwargs):
        sched = make_sched(max_batch=4, **kwargs)
        uids = [
            sched.submit(wb.Request(prompt=p, max_tokens=20, temperature=0.8 if i % 2 else 0.0, seed=7 + i))
            for i, p in enumerate(CODE)
        ]
        sched.run()
        return [sched.tokens(u) for u in uids], sched

    plain, _ = run(pipeline=False)
    spec, sched = run(speculative="prompt-lookup", num_draft_tokens=3)
    assert spec == plain
    assert {e.uid for e in drafts_of(sched)} <= {0, 2}, "only greedy rows draft"
    assert_solo(model, sched)


def test_a_preempted_row_resumes_and_equals_solo_and_an_aborted_row_leaves_the_others_intact(
    bundled, noisy_draft, make_sched
):
    model, tok = bundled
    for speculative in ("prompt-lookup", noisy_draft):
        sched = make_sched(max_batch=3, speculative=speculative, num_draft_tokens=3)
        uids = [sched.submit(wb.Request(prompt=p * 2, max_tokens=30)) for p in CODE[:3]]
        for _ in range(3):
            sched.admit(), sched.step(), sched.filter()
        sched.preempt(uids[0])
        sched.abort(uids[1])
        sched.run()
        assert sched.finish_reason(uids[1]) == "abort" and sched.finish_reason(uids[0]) == "length"
        assert any(e.kind == "preempt" for e in sched.events)
        assert_solo(model, sched, [uids[0], uids[2]])


@pytest.mark.parametrize("method", ["prompt-lookup", "noisy draft"])
def test_restoring_a_checkpoint_repeats_the_same_tokens_and_draft_events_and_a_fork_continues_alike(
    bundled, noisy_draft, make_sched, method
):
    model, tok = bundled
    speculative = "prompt-lookup" if method == "prompt-lookup" else noisy_draft
    sched = make_sched(max_batch=3, speculative=speculative, num_draft_tokens=3)
    for i, p in enumerate(CODE):
        sched.submit(wb.Request(prompt=p * 2, max_tokens=16 + 3 * i))
    for _ in range(4):
        sched.admit(), sched.step(), sched.filter()
    cp = sched.checkpoint()
    fork = sched.fork()
    sched.run()
    first = (
        {u: sched.tokens(u) for u in sched.requests},
        [(e.uid, e.step, e.n_tokens, e.n_accepted) for e in drafts_of(sched)],
    )
    sched.restore(cp)
    sched.run()
    again = (
        {u: sched.tokens(u) for u in sched.requests},
        [(e.uid, e.step, e.n_tokens, e.n_accepted) for e in drafts_of(sched)],
    )
    assert again == first
    fork.run()
    assert {u: fork.tokens(u) for u in fork.requests} == first[0]
    assert_solo(model, sched)


def test_a_prompt_cache_entry_stored_after_speculation_serves_the_next_request(bundled, make_sched):
    model, tok = bundled
    sched = make_sched(max_batch=2, speculative="prompt-lookup", num_draft_tokens=4, prompt_cache=4)
    a = sched.submit(wb.Request(prompt=CODE[0] * 2, max_tokens=12))
    sched.run()
    b = sched.submit(wb.Request(prompt=list(sched.request_of(a).prompt_ids) + sched.tokens(a), max_tokens=12))
    sched.run()
    assert [e.n_cached for e in sched.events if e.kind == "admit"][-1] > 0
    assert_solo(model, sched, [a, b])


# -- refusals -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(speculative="ngram"), r"speculative must be None, one of \['prompt-lookup'\]"),
        (dict(speculative="prompt-lookup", num_draft_tokens=0), "num_draft_tokens must be an int >= 1"),
        (
            dict(speculative="prompt-lookup", num_draft_tokens=17),
            r"num_draft_tokens must be an int in \[1, 16\]",
        ),
        (dict(speculative="prompt-lookup", batch_invariant=True), "cannot run with batch_invariant"),
        (dict(speculative="prompt-lookup", kv_bits=8, kv_group_size=32), "cannot run with kv_bits"),
        (dict(speculative=object()), "a draft mlx-lm model"),
    ],
)
def test_combinations_that_cannot_speculate_are_refused_naming_why(make_sched, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_sched(**kwargs)


@pytest.mark.parametrize(
    "folder, max_kv_size, message",
    [
        ("tiny-mamba2", None, "ArraysCache"),
        ("tiny-gemma3", None, "RotatingKVCache"),
        ("tiny-qwen3", 8, "RotatingKVCache"),
        ("tiny-qwen3-next", None, "ArraysCache"),
    ],
)
def test_models_whose_caches_cannot_be_trimmed_per_row_are_refused_naming_the_layer(
    folder, max_kv_size, message
):
    model, tok = wb.load(DATA_DIR / "models" / folder)
    with pytest.raises(ValueError, match=f"layer \\d+ has a {message}"):
        wb.Scheduler(model, tok, speculative="prompt-lookup", max_kv_size=max_kv_size)
    wb.Scheduler(model, tok, max_kv_size=max_kv_size)  # without speculation: accepted


def test_a_draft_model_of_another_vocabulary_is_refused(make_sched, random_llama):
    with pytest.raises(ValueError, match="draft model's vocab_size is 1024, the model's 4096"):
        make_sched(speculative=random_llama[0])


def test_a_row_asking_top_logprobs_takes_no_drafts_and_keeps_its_top_k(bundled):
    """Top-k log-probs of an accepted draft would need the verify forward's distribution at
    its position: such a row decodes one token per step (no draft events), with its top-k,
    and its tokens equal a speculating neighbour's with the same prompt."""
    model, tok = bundled
    sched = wb.Scheduler(model, tok, speculative=model, max_batch=3)  # drafting for itself: always drafts
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    asks = sched.submit(wb.Request(prompt=prompt, max_tokens=8, top_logprobs=2))
    plain = sched.submit(wb.Request(prompt=prompt, max_tokens=8))
    sched.run()
    drafted = {e.uid for e in sched.events if e.kind == "draft"}
    assert plain in drafted and asks not in drafted
    assert len(sched.top_logprobs(asks)) == 8 and all(len(t) == 2 for t in sched.top_logprobs(asks))
    assert sched.request(asks).tokens == sched.request(plain).tokens
