"""``workbench.verify.invariance.bit_check``: every row of a ``batch_invariant=True`` run
finished by stop or length against the same request run alone on a scheduler of the same
settings (``max_batch=1``, no speculation), with the seed the row drew and the adapters the
scheduler loaded; a row that is not its run alone is reported, with its first differing token
(a speculative verify one bit off too). Aborted, errored, unfinished rows and rows loaded without
their sampler are counted, not checked; a named aborted or errored row is compared up to where
it stopped, a named unfinished one refused."""

import math

import pytest

import workbench as wb
from workbench.verify import invariance
from workbench.verify.compose import ADAPTERS

pytestmark = pytest.mark.model

PROMPTS = ("def add(a, b):", "import os\nimport sys\n", "class Stack:", "x = [1, 2")


def _run(model, tok, requests, **settings):
    sched = wb.Scheduler(model, tok, max_batch=4, prefill_step_size=8, batch_invariant=True, **settings)
    for r in requests:
        sched.submit(r)
    sched.run()
    return sched


def test_a_packed_run_reads_every_row_equal_to_its_packed_run_alone(bundled):
    model, tok = bundled
    sched = _run(
        model, tok, [wb.Request(prompt=p, max_tokens=6) for p in PROMPTS], layout="packed", page_size=4
    )
    report = invariance.bit_check(sched)
    assert report.ok and report.n_equal == 4, report.text()


@pytest.mark.parametrize("seed", ["default", 123, None])
def test_sampled_rows_submitted_without_a_seed_are_run_alone_with_the_seed_they_drew(bundled, seed):
    model, tok = bundled
    settings = {} if seed == "default" else {"seed": seed}
    sched = wb.Scheduler(model, tok, max_batch=4, prefill_step_size=8, batch_invariant=True, **settings)
    for p in PROMPTS[:2]:
        sched.submit(wb.Request(prompt=p, max_tokens=6, temperature=0.9))
    sched.submit_n(wb.Request(prompt=PROMPTS[2], max_tokens=6, temperature=1.0, top_k=20), 2)  # seed + i
    sched.run()
    report = invariance.bit_check(sched)
    assert report.ok and report.n_equal == 4, report.text()


def test_rows_with_adapters_are_run_alone_with_the_schedulers_adapters():
    model, tok = wb.load()  # a private copy: adapters wrap its layers in place
    rows = [(PROMPTS[0], "prose"), (PROMPTS[1], "numbers"), (PROMPTS[2], None)]
    sched = _run(
        model, tok, [wb.Request(prompt=p, max_tokens=6, adapter=a) for p, a in rows], adapters=ADAPTERS
    )
    report = invariance.bit_check(sched)
    assert report.ok and report.n_equal == 3, report.text()


def test_a_row_that_is_not_its_run_alone_is_reported_from_its_first_difference(bundled):
    model, tok = bundled
    reqs = [wb.Request(prompt=p, max_tokens=6) for p in PROMPTS[:2]]
    sched = _run(model, tok, [*reqs, wb.Request(prompt=PROMPTS[2], max_tokens=6, temperature=1.0)])
    assert invariance.bit_check(sched).ok
    lp = sched.requests[0].logprobs
    lp[3] = math.nextafter(lp[3], 0.0)  # one log-prob off by its last bit
    sched.requests[2].seed += 1  # as if the row had drawn another seed: alone it samples otherwise
    report = invariance.bit_check(sched)
    assert [(r.uid, r.equal) for r in report.rows] == [(0, False), (1, True), (2, False)]
    assert report.rows[0].first_difference == 3 and report.text().startswith("bit-exact: 1/3")


def test_the_runs_alone_leave_the_checked_schedulers_prompt_cache_and_clock_as_they_were(
    bundled, fake_clock_class
):
    from mlx_lm.server import LRUPromptCache

    model, tok = bundled
    cache, clock = LRUPromptCache(max_size=8), fake_clock_class()
    sched = _run(
        model, tok, [wb.Request(prompt=p, max_tokens=4) for p in PROMPTS], prompt_cache=cache, clock=clock
    )
    entries, now_s = len(cache), clock.now_s
    assert invariance.bit_check(sched).ok
    assert (len(cache), clock.now_s) == (entries, now_s)


# Prompts that repeat themselves: prompt lookup drafts, and the verify forward keeps drafts.
REPEATING = (
    "a = 1\na = 1\na = 1\na =",
    "def add(a, b):\n    return a + b\ndef add(a, b):",
    "import os\nimport os\nimport",
    "x = [1, 2, 1, 2, 1, 2",
)


def test_speculation_that_moves_one_bit_is_caught_as_its_run_alone_does_not_speculate(bundled, monkeypatch):
    import workbench.engine.levers.speculative as spec

    model, tok = bundled
    requests = [wb.Request(prompt=p, max_tokens=16) for p in REPEATING]
    report = invariance.bit_check(_run(model, tok, requests, speculative="prompt-lookup"))
    assert report.ok and report.n_equal == 4, report.text()  # speculating changes no bit
    verify, nudged = spec.verify, []

    def verify_one_ulp_off(*args, **kwargs):  # a verified position's log-prob off by its last bit
        out = verify(*args, **kwargs)
        for row in out.logprobs:
            if len(row) > 1:
                row[1] = math.nextafter(row[1], 0.0)
                nudged.append(row[1])
        return out

    monkeypatch.setattr(spec, "verify", verify_one_ulp_off)
    sched = _run(model, tok, requests, speculative="prompt-lookup")
    assert nudged, "no draft was verified"
    report = invariance.bit_check(sched)
    assert not report.ok and report.n_equal < 4, report.text()
    assert invariance.ALONE_CHANGES["speculative"] is None


def _aborted_and_errored(model, tok):
    """A run of four rows: uid 1 aborted after 2 tokens, uid 2's on_token raising at its first
    token (finish "error"), uids 0 and 3 finished by length."""

    def raises(uid, token):
        raise RuntimeError("a callback that fails")

    sched = wb.Scheduler(model, tok, max_batch=4, prefill_step_size=8, batch_invariant=True)
    for i, p in enumerate(PROMPTS):
        sched.submit(wb.Request(prompt=p, max_tokens=6, on_token=raises if i == 2 else None))
    while len(sched.tokens(1)) < 2:
        sched.admit()
        sched.step()
    sched.abort(1)
    sched.run()
    assert [sched.finish_reason(u) for u in range(4)] == ["length", "abort", "error", "length"]
    return sched


def test_aborted_and_errored_rows_are_left_out_by_default_and_counted(bundled):
    sched = _aborted_and_errored(*bundled)
    report = invariance.bit_check(sched)
    assert report.ok and [r.uid for r in report.rows] == [0, 3], report.text()
    assert report.skipped == ((1, "abort"), (2, "error"))
    assert report.text() == (
        "bit-exact: 2/2 rows equal to their run alone (tokens and log-probs; 1 aborted row, "
        "1 errored row not checked)"
    )


def test_a_named_aborted_or_errored_row_is_compared_up_to_where_it_stopped(bundled):
    sched = _aborted_and_errored(*bundled)
    report = invariance.bit_check(sched, uids=[1, 2])
    assert [(r.uid, r.equal, r.stopped) for r in report.rows] == [(1, True, "abort"), (2, True, "error")]
    assert "uid 1 up to its abort; uid 2 up to its error" in report.text()
    lp = sched.requests[1].logprobs
    lp[1] = math.nextafter(lp[1], 0.0)
    report = invariance.bit_check(sched, uids=[1])
    assert not report.ok and report.rows[0].first_difference == 1, report.text()


def test_a_named_unfinished_row_is_refused_naming_it_and_its_status(bundled):
    model, tok = bundled
    sched = wb.Scheduler(model, tok, max_batch=1, prefill_step_size=8, batch_invariant=True)
    first, queued = (sched.submit(wb.Request(prompt=p, max_tokens=6)) for p in PROMPTS[:2])
    while not sched.tokens(first):
        sched.admit()
        sched.step()
    with pytest.raises(ValueError, match=rf"uid {first} is running, not finished"):
        invariance.bit_check(sched, uids=[first])
    with pytest.raises(ValueError, match=rf"uid {queued} is queued, not finished"):
        invariance.bit_check(sched, uids=[queued])
    report = invariance.bit_check(sched)
    assert report.rows == [] and "2 unfinished rows not checked" in report.text()


def test_a_row_loaded_without_its_sampler_is_left_out_not_reported_as_differing(bundled, tmp_path):
    import mlx.core as mx

    from workbench.verify import oracle

    model, tok = bundled

    def second_best(logprobs):  # [1, V] -> [1]: never the greedy token
        return mx.argsort(logprobs, axis=-1)[:, -2]

    sched = _run(
        model,
        tok,
        [wb.Request(prompt=PROMPTS[0], max_tokens=6, sampler=second_best)]
        + [wb.Request(prompt=p, max_tokens=6) for p in PROMPTS[1:3]],
    )
    assert invariance.bit_check(sched).n_equal == 3
    path = sched.checkpoint().save(tmp_path / "done")
    loaded = wb.Scheduler(model, tok, max_batch=4, prefill_step_size=8, batch_invariant=True)
    loaded.restore(wb.Checkpoint.load(path, loaded))
    assert loaded.requests[0].not_restored == ("sampler",) and loaded.request_of(0).request.sampler is None
    report = invariance.bit_check(loaded)
    assert report.ok and [r.uid for r in report.rows] == [1, 2], report.text()
    assert report.skipped == ((0, "not restored"),)
    assert (
        "1 row whose sampler or logits processors a checkpoint file did not restore not checked"
        in report.text()
    )
    assert oracle.checkable_uids(loaded) == [1, 2]  # nor is it a greedy row to the oracles
    with pytest.raises(ValueError, match="uid 0 was loaded from a checkpoint file without its sampler"):
        invariance.bit_check(loaded, uids=[0])
    again = loaded.checkpoint().save(tmp_path / "again")  # saved again, it still says what it lost
    other = wb.Scheduler(model, tok, max_batch=4, prefill_step_size=8, batch_invariant=True)
    other.restore(wb.Checkpoint.load(again, other))
    assert other.requests[0].not_restored == ("sampler",)
