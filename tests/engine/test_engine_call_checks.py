"""The engine's own calls refuse what would corrupt it, by name (found by a break-it pass,
2026-12-07): a state-changing call from inside a request's ``on_token`` (the step is half-read
there), ``run()``'s arguments, ``prompt_cache`` of another kind, ``submit_n``'s numpy ``n`` and
a sampler's out-of-range Python integer."""

import numpy as np
import pytest

import workbench as wb


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("call", ["step", "admit", "filter", "run", "preempt", "restore"])
def test_a_state_changing_call_from_on_token_ends_only_the_calling_row(bundled, layout, call):
    model, tok = bundled
    sched = wb.Scheduler(model, tok, max_batch=4, layout=layout)
    neighbour = sched.submit(wb.Request(prompt=[10, 20, 30], max_tokens=6))
    saved = sched.checkpoint()
    calls = {
        "step": sched.step,
        "admit": sched.admit,
        "filter": sched.filter,
        "run": sched.run,
        "preempt": lambda: sched.preempt(neighbour),
        "restore": lambda: sched.restore(saved),
    }
    caller = sched.submit(
        wb.Request(prompt=[11, 21, 31], max_tokens=6, on_token=lambda uid, t: calls[call]())
    )
    sched.run()
    assert sched.finish_reason(caller) == "error" and len(sched.tokens(caller)) == 1
    message = sched.requests[caller].message
    assert f"Scheduler.{call}() called from inside uid {caller}'s on_token" in message, message
    assert sched.finish_reason(neighbour) == "length" and len(sched.tokens(neighbour)) == 6
    alone = wb.Scheduler(model, tok, max_batch=4, layout=layout)
    uid = alone.submit(wb.Request(prompt=[10, 20, 30], max_tokens=6))
    alone.run()
    assert sched.tokens(neighbour) == alone.tokens(uid)
    assert sched.check().ok, sched.check()


def test_submit_and_abort_stay_allowed_from_on_token(bundled):
    model, tok = bundled
    sched = wb.Scheduler(model, tok, max_batch=4)
    neighbour = sched.submit(wb.Request(prompt=[10, 20, 30], max_tokens=8))
    later = []

    def on_token(uid, token):
        if not later:
            later.append(sched.submit(wb.Request(prompt=[12, 22], max_tokens=2)))
            sched.abort(neighbour)

    caller = sched.submit(wb.Request(prompt=[11, 21, 31], max_tokens=3, on_token=on_token))
    sched.run()
    assert sched.finish_reason(caller) == "length" and sched.finish_reason(neighbour) == "abort"
    assert sched.finish_reason(later[0]) == "length" and sched.check().ok


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(max_steps=-1), r"max_steps must be a whole number >= 0 decode steps or None, got -1"),
        (dict(max_steps=1.5), r"max_steps must be a whole number >= 0 decode steps or None, got 1.5"),
        (dict(arrivals=[("a", None)]), r"each arrival must be a \(step, Request\) pair"),
        (dict(arrivals=[(-1, wb.Request(prompt=[1]))]), r"whole-number step >= 0"),
    ],
)
def test_run_refuses_bad_arguments_naming_them(make_sched, kwargs, message):
    sched = make_sched()
    with pytest.raises(ValueError, match=message):
        sched.run(**kwargs)
    assert sched.idle and sched.events == []


@pytest.mark.parametrize("value", ["big", -1, 2.5, True])
def test_a_prompt_cache_of_another_kind_is_refused_when_the_scheduler_is_built(bundled, value):
    model, tok = bundled
    with pytest.raises(ValueError, match="prompt_cache must be an mlx-lm LRUPromptCache, its max_size"):
        wb.Scheduler(model, tok, prompt_cache=value)


def test_submit_n_takes_a_numpy_count(make_sched):
    uids = make_sched().submit_n(wb.Request(prompt=[5, 6], max_tokens=2, temperature=0.7), np.int64(2))
    assert len(uids) == 2


@pytest.mark.parametrize("returned", [2**70, np.uint64(2**63), -(2**40)])  # beyond an MLX integer
def test_a_sampler_returning_an_integer_out_of_range_ends_its_row_naming_the_value(make_sched, returned):
    sched = make_sched()
    good = sched.submit(wb.Request(prompt=[5, 9], max_tokens=3))
    bad = sched.submit(wb.Request(prompt=[5, 9], max_tokens=3, temperature=0.5, sampler=lambda lp: returned))
    sched.run()
    assert sched.finish_reason(bad) == "error" and sched.finish_reason(good) == "length"
    message = sched.requests[bad].message
    assert f"sampler returned {int(returned)}; a token id must be an integer in [0," in message, message
