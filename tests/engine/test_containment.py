"""A faulty row ends alone (finish reason ``error``) and every other row produces exactly
the tokens it would have produced without it; abort works in every state; per-row
sampling (mlx-lm processors, seeds) does not depend on the neighbours."""

import math
import re

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors

import workbench as wb

from .hostile import HOSTILE, hostile_fields

pytestmark = pytest.mark.model

NEIGHBOURS = ((5, 14), (23, 12), (2, 16))


def run(make_sched, prompt, extra=None, max_batch=4, join_extra_at=2, **kw):
    """Neighbours from step 0; ``extra`` (a Request) submitted at step ``join_extra_at``."""
    sched = make_sched(max_batch=max_batch, **kw)
    uids = [sched.submit(wb.Request(prompt=prompt(n, 7 * n), max_tokens=m)) for n, m in NEIGHBOURS]
    arrivals = [(join_extra_at, extra)] if extra is not None else []
    sched.run(arrivals)
    extra_uid = len(uids) if extra is not None else None
    return sched, [sched.tokens(u) for u in uids], extra_uid


_CLEAN: dict = {}


def clean_tokens(make_sched, prompt, **kw):
    """The neighbours' tokens of ``run`` without an extra row, run once per settings in this
    process: every fault case compares its neighbours with the same clean run (a fault that
    left the shared model changed would show against it too)."""
    key = tuple(sorted(kw.items()))
    if key not in _CLEAN:
        _CLEAN[key] = run(make_sched, prompt, **kw)[1]
    return _CLEAN[key]


def raises_on_call(n):
    calls = {"n": 0}

    def processor(tokens, logits):
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError("boom")
        return logits

    return processor


def nan_on_call(n):
    calls = {"n": 0}

    def processor(tokens, logits):
        calls["n"] += 1
        return logits * math.nan if calls["n"] == n else logits

    return processor


def failing_callback(uid, token):
    raise ValueError("callback failed")


FAULTS = {
    "processor raises": (
        dict(logits_processors=[raises_on_call(3)]),
        "logits processor raised RuntimeError: boom",
        2,
    ),
    "nan logits": (dict(logits_processors=[nan_on_call(4)]), "non-finite logits (NaN or inf)", 3),
    "sampler raises": (
        dict(temperature=0.7, sampler=lambda lp: 1 / 0),
        "sampler raised ZeroDivisionError",
        0,
    ),
    "callback raises": (dict(on_token=failing_callback), "on_token raised ValueError: callback failed", 1),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_faulty_row_ends_with_error_and_neighbours_are_untouched(make_sched, prompt, fault):
    fields, message, n_tokens = FAULTS[fault]
    clean = clean_tokens(make_sched, prompt)
    faulty = wb.Request(prompt=prompt(9, 300), max_tokens=10, **fields)
    sched, tokens, bad = run(make_sched, prompt, faulty)
    assert tokens == clean
    assert sched.finish_reason(bad) == "error"
    assert sched.error(bad).startswith(message)
    assert len(sched.tokens(bad)) == n_tokens
    row = sched.report().requests.set_index("uid").loc[bad]
    assert row.finish_reason == "error" and row.error.startswith(message)
    assert sched.idle and sched.snapshot().kv_bytes == 0


@pytest.mark.parametrize("pipeline", [True, False])
@pytest.mark.parametrize("name", list(HOSTILE))
def test_what_a_sampler_or_processor_returns_against_its_contract_ends_only_its_row(
    make_sched, prompt, name, pipeline
):
    """A custom sampler's id (-1, past the vocabulary, 3.7, NaN, a wrong shape) never reaches
    the embedding, and a processor's wrong shape or dtype never reaches the batch's logits:
    the row ends with an error naming the callable, the value and the limit; step() never
    raises; the neighbours' tokens are those of a run without it."""
    V = make_sched().vocab_size
    clean = clean_tokens(make_sched, prompt, pipeline=pipeline)
    fields, message = hostile_fields(name, V, after=9 + 3)  # a processor turns bad at its 4th token
    sched, tokens, bad = run(
        make_sched, prompt, wb.Request(prompt=prompt(9, 300), max_tokens=10, **fields), pipeline=pipeline
    )
    assert tokens == clean
    assert sched.finish_reason(bad) == "error", (sched.finish_reason(bad), sched.tokens(bad))
    assert re.match(message, sched.error(bad)), sched.error(bad)
    assert len(sched.tokens(bad)) == (0 if name.startswith("sampler") else 3)
    assert sched.check().ok and sched.idle and sched.snapshot().kv_bytes == 0


def test_a_sampler_returning_good_ids_of_any_integer_kind_is_followed(make_sched, prompt):
    """Python ints, numpy ints, int64 / uint32 arrays, shape () or [1]: the id is used as is."""
    V = make_sched().vocab_size
    kinds = [
        lambda lp: int(mx.argmax(lp, axis=-1).item()),
        lambda lp: np.int64(mx.argmax(lp).item()),
        lambda lp: mx.argmax(lp, axis=-1).astype(mx.int64),
        lambda lp: mx.argmax(lp),
        lambda lp: V - 1,
    ]
    greedy = make_sched()
    uid = greedy.submit(wb.Request(prompt=prompt(9, 300), max_tokens=6))
    greedy.run()
    for i, kind in enumerate(kinds):
        sched = make_sched()
        u = sched.submit(wb.Request(prompt=prompt(9, 300), max_tokens=6, stop_ids=[], sampler=kind))
        sched.run()
        assert sched.finish_reason(u) == "length", (i, sched.error(u))
        assert sched.tokens(u) == (greedy.tokens(uid) if i < 4 else [V - 1] * 6), i


@pytest.mark.parametrize("when", ["queued", "prefilling", "running"])
def test_abort_works_in_every_state_and_keeps_the_batch_consistent(make_sched, prompt, when):
    clean = clean_tokens(make_sched, prompt)
    sched = make_sched(max_batch=4 if when != "queued" else 3, prefill_step_size=4)
    uids = [sched.submit(wb.Request(prompt=prompt(n, 7 * n), max_tokens=m)) for n, m in NEIGHBOURS]
    sched.admit()
    for _ in range(6):  # a 1-chunk prefill each admit: let the neighbours join
        sched.admit()
        sched.step()
    victim = sched.submit(wb.Request(prompt=prompt(30, 90), max_tokens=20))
    if when != "queued":
        sched.admit()  # one chunk of 4 of 29 tokens: prefilling
        assert sched.snapshot().prefilling[0][0] == victim
    if when == "running":
        while victim not in sched.snapshot().uids:
            sched.admit()
            sched.step()
            sched.filter()
    events = sched.abort(victim)
    assert [(e.kind, e.finish_reason) for e in events] == [("finish", "abort")]
    assert sched.abort(victim) == []  # a second abort is a no-op
    assert sched.finish_reason(victim) == "abort"
    sched.run()
    assert [sched.tokens(u) for u in uids] == clean
    assert sched.idle and sched.snapshot().kv_bytes == 0
    assert (sched.report().events.kind == "finish").sum() == 4


def test_abort_of_an_unknown_uid_raises(make_sched):
    with pytest.raises(KeyError, match="uid 5 is unknown"):
        make_sched().abort(5)


@pytest.mark.parametrize("not_a_uid", [True, False, 0.0, 1.0, np.bool_(True), "0", None])
def test_abort_refuses_a_uid_that_is_not_an_int_and_changes_nothing(make_sched, prompt, not_a_uid):
    sched = make_sched()
    uids = [sched.submit(wb.Request(prompt=prompt(4, 10 * i), max_tokens=3)) for i in range(2)]
    sched.admit()
    n_events = len(sched.events)
    with pytest.raises(ValueError, match=r"uid must be an int.*" + type(not_a_uid).__name__):
        sched.abort(not_a_uid)
    with pytest.raises(ValueError, match="uid must be an int"):
        sched.preempt(not_a_uid)
    assert [sched.finish_reason(u) for u in uids] == [None, None] and len(sched.events) == n_events
    assert sched.abort(np.int64(uids[1])) and sched.finish_reason(uids[1]) == "abort"  # numpy ints are ints


def sampled(prompt, seed):
    return wb.Request(prompt=prompt(6, 400), max_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=seed)


def test_a_seeded_sampled_row_is_identical_alone_and_beside_any_neighbours(make_sched, prompt):
    alone = make_sched(max_batch=1)
    uid = alone.submit(sampled(prompt, 7))
    alone.run()
    reference = alone.tokens(uid)
    for max_batch, join_at in ((4, 0), (4, 3), (2, 5)):
        sched, _, extra = run(
            make_sched, prompt, sampled(prompt, 7), max_batch=max_batch, join_extra_at=join_at
        )
        assert sched.tokens(extra) == reference
    # with sampled neighbours too
    sched = make_sched(max_batch=3)
    sched.submit(wb.Request(prompt=prompt(3), max_tokens=12, temperature=1.0, seed=1))
    uid = sched.submit(sampled(prompt, 7))
    sched.submit(wb.Request(prompt=prompt(40), max_tokens=12, temperature=0.5))
    sched.run()
    assert sched.tokens(uid) == reference
    other = make_sched(max_batch=1)
    uid8 = other.submit(sampled(prompt, 8))
    other.run()
    assert other.tokens(uid8) != reference  # the seed matters


def test_an_unseeded_row_draws_its_seed_from_the_scheduler_seed_and_samples_as_if_given_it(
    make_sched, prompt
):
    unseeded = wb.Request(prompt=prompt(6), max_tokens=10, temperature=1.0)

    def once(scheduler_seed, neighbour):
        """The unseeded request submitted second, after ``neighbour``; its tokens and drawn seed."""
        sched = make_sched(max_batch=2, seed=scheduler_seed)
        sched.submit(neighbour)
        uid = sched.submit(unseeded)
        sched.run()
        return sched.tokens(uid), sched.requests[uid].seed

    greedy = wb.Request(prompt=prompt(9, 40), max_tokens=4)
    tokens, drawn = once(3, greedy)
    assert once(3, greedy) == (tokens, drawn)  # same scheduler seed: same seed, same tokens
    other_tokens, other_drawn = once(4, greedy)
    assert other_drawn != drawn and other_tokens != tokens  # the scheduler seed is used
    # the draw does not depend on the neighbour's fields (a seeded, sampled, longer one here)
    assert once(3, sampled(prompt, 11)) == (tokens, drawn)
    # the drawn seed acts exactly like a request's own seed: alone, with it given, same tokens
    alone = make_sched(max_batch=1, seed=99)
    uid = alone.submit(wb.Request(prompt=prompt(6), max_tokens=10, temperature=1.0, seed=drawn))
    alone.run()
    assert alone.tokens(uid) == tokens


def test_penalties_equal_mlx_lm_solo_with_the_same_processors_and_never_see_padding(
    bundled, make_sched, prompt
):
    model, _ = bundled
    p = prompt(4, 600)
    fields = dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2, logit_bias={17: 2.0})
    reference = []
    for token, _ in generate_step(
        mx.array(p),
        model,
        max_tokens=15,
        logits_processors=make_logits_processors({17: 2.0}, 1.3, presence_penalty=0.5, frequency_penalty=0.2),
    ):
        reference.append(int(token))
    sched = make_sched(max_batch=3)
    sched.submit(wb.Request(prompt=prompt(60, 5), max_tokens=15))  # long neighbour: lots of padding
    uid = sched.submit(wb.Request(prompt=p, max_tokens=15, stop_ids=[], **fields))
    sched.run()
    assert sched.tokens(uid) == reference
