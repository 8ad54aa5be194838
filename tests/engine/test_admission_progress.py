"""Admission never idles with a queue it could serve: a prompt held for the waiting samples
of a ``submit_n`` (:mod:`workbench.engine.shared_prompts`) yields before a request waits for
it, under every policy and budget, in both layouts, pipelined or not. Each run is driven
by a bounded number of ``admit(); step(); filter()`` iterations, so a wedge fails the test
instead of hanging it; a request that could never fit is refused at ``submit``."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.engine.admission import POLICIES
from workbench.workloads.workload import prompt_of_length

pytestmark = pytest.mark.model


def drive(sched, iterations: int) -> int:
    """``admit(); step(); filter()`` until the engine is idle, at most ``iterations``
    times (``run()`` loops until ``max_steps`` decode steps, forever when none runs).
    Returns the iterations it took; every one leaves ``check()`` ok."""
    for i in range(iterations):
        if sched.idle:
            return i
        sched.admit()
        if sched.batch.rows:
            sched.step()
        sched.filter()
        assert sched.check().ok, sched.check()
    return iterations


def assert_drained(sched, uids, iterations):
    waiting = {u: sched.status(u).value for u in uids if sched.status(u) is not wb.Status.FINISHED}
    assert sched.idle and not waiting, (
        f"after {iterations} iterations the engine still holds {waiting} "
        f"(queue {sched.queue}, running {[r.uid for r in sched.batch.rows]}, "
        f"held prompts {sorted(sched.state.shared_prompts)})"
    )


def test_a_held_prompt_yields_to_a_request_that_fits_alone(bundled):
    """The wedge of issue 42: the samples' held prompt makes the urgent long request's
    projection exceed a budget it fits alone; it must be dropped, not waited for."""
    model, tok = bundled
    long = wb.Request(prompt=prompt_of_length(tok, 200, 2), max_tokens=10, priority=1)
    probe = wb.Scheduler(model, tok)
    budget = probe.ledger.alone_bytes(200, 10) + 64 * probe.ledger.base.full_token_bytes
    sched = wb.Scheduler(model, tok, kv_budget_bytes=budget, policy="priority")
    sample = wb.Request(prompt=prompt_of_length(tok, 20, 1), max_tokens=5, temperature=0.9, seed=1)
    uids = sched.submit_n(sample, 3)
    sched.admit()  # one sample runs (two do not fit), its prompt is held for the other two
    assert set(sched.state.shared_prompts) == {uids[0]}
    sched.step()
    urgent = sched.submit(long)
    iterations = drive(sched, 60)
    assert_drained(sched, [*uids, urgent], iterations)
    assert sched.tokens(urgent) == oracle_tokens(model, tok, long)


def test_a_row_is_not_preempted_when_its_resumed_inputs_could_never_fit_again(bundled):
    """With a prompt cache the projection of a group is a bound over cached prefixes, which
    grows with the input: a 250-token prompt that fits a budget alone does not once it
    resumes with 8 tokens more. The urgent request waits for it instead of preempting it
    into a queue it could never leave."""
    from mlx_lm.models.cache import LRUPromptCache

    model, tok = bundled
    probe = wb.Scheduler(model, tok, prompt_cache=LRUPromptCache(max_size=4))
    budget = probe.ledger.alone_bytes(250, 10)
    sched = wb.Scheduler(
        model, tok, kv_budget_bytes=budget, policy="priority", prompt_cache=LRUPromptCache(max_size=4)
    )
    low = wb.Request(prompt=prompt_of_length(tok, 250, 1), max_tokens=10, stop_ids=[])
    resumed = low.prompt + [0] * 8  # its prompt and 8 tokens: more than the budget alone
    assert sched.ledger.alone_bytes(len(resumed), 2) > budget
    uids = [sched.submit(low)]
    drive_steps(sched, 8)
    uids.append(sched.submit(wb.Request(prompt=prompt_of_length(tok, 5, 9), max_tokens=5, priority=5)))
    iterations = drive(sched, 40)
    assert_drained(sched, uids, iterations)
    assert not [e for e in sched.events if e.kind == "preempt"]
    assert sched.tokens(uids[0]) == oracle_tokens(model, tok, low)


def test_preempting_a_row_that_could_never_resume_is_refused_naming_the_budget(bundled):
    from mlx_lm.models.cache import LRUPromptCache

    model, tok = bundled
    probe = wb.Scheduler(model, tok, prompt_cache=LRUPromptCache(max_size=4))
    budget = probe.ledger.alone_bytes(250, 10)
    sched = wb.Scheduler(model, tok, kv_budget_bytes=budget, prompt_cache=LRUPromptCache(max_size=4))
    uid = sched.submit(wb.Request(prompt=prompt_of_length(tok, 250, 1), max_tokens=10, stop_ids=[]))
    drive_steps(sched, 2)
    sched.preempt(uid)  # 2 tokens more still fit: it resumes
    drive_steps(sched, 6)
    assert len(sched.tokens(uid)) == 8
    with pytest.raises(
        ValueError, match=rf"preempt: uid {uid} could never resume with .*kv_budget_bytes is {budget:,}"
    ):
        sched.preempt(uid)
    assert sched.status(uid) is wb.Status.RUNNING
    iterations = drive(sched, 10)
    assert_drained(sched, [uid], iterations)


def drive_steps(sched, steps):
    """Iterate until ``steps`` decode steps have run (at most ``2 * steps + 4`` iterations)."""
    start = sched.step_index
    for _ in range(2 * steps + 4):
        if sched.step_index - start >= steps:
            return
        drive(sched, 1)
    raise AssertionError(f"{steps} decode steps did not run")


def oracle_tokens(model, tok, request):
    """The request's tokens run alone on a fresh engine."""
    alone = wb.Scheduler(model, tok)
    uid = alone.submit(request)
    alone.run()
    return alone.tokens(uid)


class Nobody:
    """A policy that admits no one (a broken custom policy): a wedge by construction."""

    name = "nobody"

    def order(self, queue):
        return []


def test_an_idle_engine_with_a_queue_admission_takes_none_of_is_a_problem_and_run_raises(make_sched, prompt):
    sched = make_sched(policy=Nobody())
    uid = sched.submit(wb.Request(prompt=prompt(5), max_tokens=3))
    for _ in range(2):  # before admit() (it would change nothing) and after it
        report = sched.check()
        assert not report.ok and "policy 'nobody' admits none of them" in str(report), report
        assert f"uids [{uid}]" in str(report) and "admission is wedged" in str(report)
        sched.admit()
    fine = make_sched()
    fine.submit(wb.Request(prompt=prompt(5), max_tokens=3))
    assert fine.check().ok  # a queue admit() will take is no problem before admit()
    admits = 0
    admit = sched.admit

    def counted():  # run() on a wedge would loop for ever: fail instead
        nonlocal admits
        admits += 1
        assert admits < 50, "run() kept calling admit() on a wedged engine"
        return admit()

    sched.admit = counted
    with pytest.raises(
        RuntimeError, match=r"run\(\): admit\(\) admitted nothing on an idle engine: .*admission is wedged"
    ):
        sched.run()
    assert admits == 1 and sched.queue == (uid,)


# -- progress under every policy, budget, layout and pipelining ---------------------------

WORK = st.lists(
    st.fixed_dictionaries(
        dict(
            n=st.sampled_from([1, 1, 2, 3, 4]),  # 1: a plain request, else a submit_n group
            prompt=st.integers(1, 200),
            max_tokens=st.integers(1, 10),
            priority=st.integers(0, 2),
            sampled=st.booleans(),
            arrival=st.integers(0, 8),  # the iteration it is submitted at
        )
    ),
    min_size=1,
    max_size=5,
)


def run_bounded(sched, work, bound):
    """Submit ``work`` at its arrival iterations and drive the engine (:func:`drive`'s
    iteration) at most ``bound`` times, failing at once when ``admit()`` leaves a queue on
    an idle engine (a wedge: every later iteration would repeat it); returns
    ``{uid: max_tokens}`` of every request."""
    uids, pending = {}, sorted(enumerate(work), key=lambda a: a[1]["arrival"])
    for i in range(bound):
        while pending and (pending[0][1]["arrival"] <= i or sched.idle):
            k, w = pending.pop(0)
            request = wb.Request(
                prompt=prompt_of_length(sched.tokenizer, w["prompt"], 17 * k),
                max_tokens=w["max_tokens"],
                priority=w["priority"],
                temperature=0.9 if w["sampled"] else 0.0,
                seed=k,
                stop_ids=[],
            )
            new = sched.submit_n(request, w["n"]) if w["n"] > 1 else [sched.submit(request)]
            uids.update(dict.fromkeys(new, w["max_tokens"]))
        if sched.idle:
            break
        sched.admit()
        assert sched.batch.rows or sched.state.prefilling or not sched.queue, (
            f"admit() took none of the queue {sched.queue} on an idle engine "
            f"(held prompts {sorted(sched.state.shared_prompts)})"
        )
        if sched.batch.rows:
            sched.step()
        sched.filter()
        assert sched.check().ok, sched.check()
    return uids


def progress_settings(request):
    long = request.config.getoption("--long")
    return settings(
        max_examples=60 if long else 3,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=not long,
    )


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "serial"])
@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_request_finishes_under_every_policy_and_budget(bundled, policy, layout, pipeline, request):
    """Budgets from the least that admits the largest request alone upward: within a bounded
    number of iterations every request (plain or a ``submit_n`` sample) finishes with its
    ``max_tokens``, or, when it could never fit, was refused at ``submit``."""
    model, tok = bundled
    position_bytes = wb.Scheduler(model, tok).ledger.base.full_token_bytes  # one position, every layer

    @progress_settings(request)
    @example(  # the samples' held prompt bounds the next sample over a budget it fits alone
        work=[dict(n=3, prompt=199, max_tokens=3, priority=0, sampled=False, arrival=0)],
        extra_tokens=200,
        max_batch=1,
        chunk=16,
    )
    @example(  # ... and a longer, more urgent request that arrives while they wait
        work=[
            dict(n=3, prompt=20, max_tokens=5, priority=0, sampled=True, arrival=0),
            dict(n=1, prompt=200, max_tokens=10, priority=1, sampled=False, arrival=1),
        ],
        extra_tokens=64,
        max_batch=6,
        chunk=2048,
    )
    @given(
        work=WORK,
        extra_tokens=st.sampled_from([0, 0, 8, 40, 64, 200, 600]),
        max_batch=st.integers(1, 6),
        chunk=st.sampled_from([16, 64, 2048]),
    )
    def check(work, extra_tokens, max_batch, chunk):
        options = dict(layout=layout, pipeline=pipeline, policy=policy, max_batch=max_batch)
        options |= dict(prefill_step_size=chunk) if layout == "padded" else dict(max_num_batched_tokens=chunk)
        ledger = wb.Scheduler(model, tok, **options).ledger
        largest = max(ledger.alone_bytes(w["prompt"], w["max_tokens"]) for w in work)
        budget = largest + extra_tokens * position_bytes
        sched = wb.Scheduler(model, tok, kv_budget_bytes=budget, **options)
        too_long = wb.Request(prompt=prompt_of_length(tok, 300, 3), max_tokens=200)
        if sched.ledger.alone_bytes(300, 200) > budget:  # never fits: refused, nothing queued
            with pytest.raises(ValueError, match="kv_budget_bytes"):
                sched.submit(too_long)
        bound = 3 * sum(w["n"] * (w["max_tokens"] + w["prompt"] // 16 + 3) for w in work) + 20
        uids = run_bounded(sched, work, bound)
        short = {u: len(sched.tokens(u)) for u, m in uids.items() if len(sched.tokens(u)) != m}
        assert sched.idle and not short, (
            f"after {bound} iterations: queue {sched.queue}, running {[r.uid for r in sched.batch.rows]}, "
            f"held prompts {sorted(sched.state.shared_prompts)}, short rows {short}"
        )
        assert all(s.held_bytes <= budget for s in sched.history)

    check()
