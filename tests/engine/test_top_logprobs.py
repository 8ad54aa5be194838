"""Top-k log-probs (``Request(top_logprobs=k)``, ``Scheduler.top_logprobs``): the k best
(token id, log-prob) pairs per generated token, best first, equal bit for bit to the same
request run alone under batching with staggered joins, and the same in the request view,
the token events, the report and ``stream``."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step

import workbench as wb
from workbench.engine.request import MAX_TOP_LOGPROBS
from workbench.engine.top_logprobs import read_top, top_arrays
from workbench.verify.oracle import solo_cache

from .alone import row_record, run_alone


def test_top_arrays_keep_the_k_best_of_the_rows_that_asked_best_first_ties_by_id():
    logprobs = mx.array(
        [[-2.3, -0.4, -9.1, -1.2, -3.0], [-1.0, -1.0, -5.0, -0.5, -7.0], [-0.1, -3.0, -4.0, -5.0, -6.0]]
    )  # [B=3, V=5]
    top = read_top(top_arrays(logprobs, [2, 3, 0]))
    assert set(top) == {0, 1}, "row 2 asked none"
    assert top[0] == ((1, pytest.approx(-0.4)), (3, pytest.approx(-1.2)))
    assert [t for t, _ in top[1]] == [3, 0, 1]  # -0.5, then the tie -1.0 by id
    assert read_top(top_arrays(logprobs, [0, 0, 0])) == {}
    assert [t for t, _ in read_top(top_arrays(logprobs, [9, 0, 0]))[0]] == [1, 3, 0, 4, 2], (
        "k past V: all of V"
    )


def test_top_logprobs_leave_out_the_tokens_a_row_forbids_never_a_non_finite_log_prob(make_sched, prompt):
    """A processor that sets all but 3 logits to -inf (a grammar's mask does so) leaves 3 pairs of
    the 5 asked: -inf is no log-prob a JSON answer can carry (issue 41, attack s5)."""
    allowed = mx.array([5, 9, 77])

    def only_three(tokens, logits):
        keep = mx.zeros((logits.shape[-1],), dtype=mx.bool_)
        keep[allowed] = True
        return mx.where(keep, logits, mx.array(-float("inf"), dtype=logits.dtype))

    sched = make_sched()
    uid = sched.submit(
        wb.Request(
            prompt=prompt(6), max_tokens=3, top_logprobs=5, logits_processors=[only_three], stop_ids=[]
        )
    )
    sched.run()
    tops = sched.top_logprobs(uid)
    assert len(tops) == 3
    for pairs in tops:
        assert sorted(t for t, _ in pairs) == [5, 9, 77]
        assert all(np.isfinite(v) for _, v in pairs)
    masked = mx.array([[-0.1, -float("inf"), -2.0, -float("inf")]])
    assert read_top(top_arrays(masked, [4])) == {0: ((0, pytest.approx(-0.1)), (2, pytest.approx(-2.0)))}


@pytest.mark.parametrize("value", [-1, MAX_TOP_LOGPROBS + 1, 2.0, True, "5"])
def test_a_top_logprobs_outside_0_to_20_is_refused_naming_the_field_and_the_limit(make_sched, value):
    sched = make_sched()
    with pytest.raises(ValueError, match=r"top_logprobs must be an int in \[0, 20\] \(MAX_TOP_LOGPROBS\)"):
        sched.submit(wb.Request(prompt=[1, 2, 3], top_logprobs=value))
    assert not sched.requests and sched.idle


def test_top_logprobs_none_means_none_as_openai_and_vllm_take_null(make_sched):
    assert wb.Request(prompt=[1, 2, 3], top_logprobs=None) == wb.Request(prompt=[1, 2, 3], top_logprobs=0)
    assert wb.Request.from_dict({"prompt": [1, 2, 3], "top_logprobs": None}).top_logprobs == 0
    sched = make_sched()
    uid = sched.submit(wb.Request(prompt=[1, 2, 3], max_tokens=3, stop_ids=[], top_logprobs=None))
    sched.run()
    assert sched.tokens(uid) and sched.top_logprobs(uid) == [()] * len(sched.tokens(uid))


# (prompt tokens, max_tokens, top_logprobs, temperature, arrival step): plain rows among them
ROWS = (
    (7, 9, 5, 0.0, 0),
    (30, 6, 0, 0.0, 0),
    (3, 12, 20, 0.0, 2),
    (18, 8, 1, 0.9, 3),
    (11, 7, 0, 0.7, 3),
    (45, 10, 5, 0.0, 5),
)


def requests_of(prompt) -> list[wb.Request]:
    return [
        wb.Request(
            prompt=prompt(n, 17 * i), max_tokens=m, top_logprobs=k, temperature=t, seed=100 + i, stop_ids=[]
        )
        for i, (n, m, k, t, _) in enumerate(ROWS)
    ]


@pytest.mark.parametrize(
    "options", [dict(max_batch=3, prefill_step_size=8), dict(max_batch=4, pipeline=False)]
)
def test_top_logprobs_under_staggered_joins_equal_each_request_run_alone_bit_for_bit(
    bundled, prompt, options
):
    model, tokenizer = bundled
    requests = requests_of(prompt)
    sched = wb.Scheduler(model, tokenizer, **options)
    sched.run(arrivals=[(at, r) for r, (*_, at) in zip(requests, ROWS)])
    assert {e.join_mode for e in sched.events if e.kind == "join"} >= {"new batch", "extend"}
    for uid, (request, (_, m, k, _, _)) in enumerate(zip(requests, ROWS)):
        got = row_record(sched, uid)
        assert got == run_alone(model, tokenizer, request, **options), f"uid {uid} differs from its run alone"
        tokens, logprobs, top, _ = got
        assert len(top) == len(tokens) == m and all(len(t) == k for t in top)
        for token, logprob, pairs in zip(tokens, logprobs, top):
            values = [lp for _, lp in pairs]
            assert values == sorted(values, reverse=True)
            if pairs and request.temperature == 0:  # greedy: the chosen token is the best one
                assert pairs[0] == (token, logprob)
            if pairs:
                assert dict(pairs).get(token, logprob) == logprob, (
                    "the chosen token's log-prob is the same number"
                )
        assert sched.top_logprobs(uid) == list(top)


def test_top_logprobs_are_in_the_token_events_the_report_and_the_stream(make_sched, prompt):
    sched = make_sched(max_batch=2)
    a = sched.submit(wb.Request(prompt=prompt(9), max_tokens=6, top_logprobs=3, stop_ids=[]))
    b = sched.submit(wb.Request(prompt=prompt(5, 40), max_tokens=4, stop_ids=[]))
    chunks = list(sched.stream(a, logprobs=True))
    assert sum((c.tokens for c in chunks), ()) == tuple(sched.tokens(a))
    assert "".join(c.text for c in chunks) == sched.text(a)
    assert sum((c.top_logprobs for c in chunks), ()) == tuple(sched.top_logprobs(a))
    assert [e.top_logprobs for e in sched.events if e.kind == "token" and e.uid == a] == sched.top_logprobs(a)
    sched.run()
    assert all(e.top_logprobs == () for e in sched.events if e.kind == "token" and e.uid == b)
    frame = sched.report().top_logprobs
    assert set(frame.uid) == {a} and len(frame) == 6 * 3
    mine = frame.sort_values(["position", "rank"])
    assert mine.token.tolist() == [t for pairs in sched.top_logprobs(a) for t, _ in pairs]
    assert mine[mine["rank"] == 0].chosen.all()  # greedy
    assert list(mine.position.unique()) == list(range(6))


def test_top_logprobs_follow_the_rows_processed_log_probs(make_sched, prompt):
    """A logit bias moves a token to the top: top-k is read after the row's processors."""
    sched = make_sched()
    uid = sched.submit(wb.Request(prompt=prompt(6), max_tokens=3, top_logprobs=2, logit_bias={77: 60.0}))
    sched.run()
    assert [pairs[0][0] for pairs in sched.top_logprobs(uid)] == [77, 77, 77] == sched.tokens(uid)
    assert all(pairs[0][1] > -1e-3 for pairs in sched.top_logprobs(uid))


def test_top_logprobs_equal_mlx_lms_own_log_probs_alone(bundled, prompt):
    """mlx-lm's generate_step returns each step's [V] log-probs: their 5 best are ours."""
    model, tokenizer = bundled
    ids = prompt(12, 3)
    sched = wb.Scheduler(model, tokenizer)
    uid = sched.submit(wb.Request(prompt=ids, max_tokens=6, top_logprobs=5, stop_ids=[]))
    sched.run()
    steps = generate_step(mx.array(ids), model, max_tokens=6, prompt_cache=solo_cache(model))
    for (_token, logprobs), ours in zip(steps, sched.top_logprobs(uid)):
        ref = np.array(logprobs.astype(mx.float32))
        best = np.argsort(-ref, kind="stable")[:5]
        assert [t for t, _ in ours] == best.tolist()
        np.testing.assert_allclose([lp for _, lp in ours], ref[best], atol=1e-5)


@pytest.mark.realmodel
def test_top_logprobs_on_the_real_model_under_batching_equal_each_request_alone():
    from tests.real_model import chat_ids, dense_real_model

    model, tokenizer = dense_real_model()
    questions = ["What is 2+2?", "Name a primary colour.", "Say hello."]
    requests = [
        wb.Request(prompt=chat_ids(tokenizer, q), max_tokens=5, top_logprobs=k, stop_ids=[])
        for q, k in zip(questions, (5, 0, 20))
    ]
    sched = wb.Scheduler(model, tokenizer, max_batch=3)
    sched.run(arrivals=[(0, requests[0]), (2, requests[1]), (3, requests[2])])
    for uid, request in enumerate(requests):
        assert row_record(sched, uid) == run_alone(model, tokenizer, request, max_batch=3), uid
    assert [len(p) for p in sched.top_logprobs(2)] == [20] * 5


def test_top_logprobs_in_the_packed_layout_follow_each_row(bundled, prompt):
    """The packed layout's one [1, T] forward gives every row that asked its own top-k, the
    k best of the same log-probs as its token's, within the packed layout's noise (1e-4, as
    its oracle) of the row run alone."""
    model, tokenizer = bundled
    requests = [r for r, (*_, t, _) in zip(requests_of(prompt), ROWS) if t == 0.0]  # greedy rows
    sched = wb.Scheduler(model, tokenizer, layout="packed", max_batch=3)
    uids = [sched.submit(r) for r in requests]
    sched.run()
    for uid, request in zip(uids, requests):
        tokens, logprobs, top, _ = row_record(sched, uid)
        alone = run_alone(model, tokenizer, request, max_batch=1)
        assert tokens == alone[0] and len(top) == len(tokens)
        assert all(len(t) == request.top_logprobs for t in top)
        for token, logprob, pairs, solo in zip(tokens, logprobs, top, alone[2]):
            if pairs:
                assert pairs[0] == (token, logprob)
                np.testing.assert_allclose([lp for _, lp in pairs], [lp for _, lp in solo], atol=1e-4)
