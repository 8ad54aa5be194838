"""``workbench.verify.invariance.bit_check``: every row of a ``batch_invariant=True`` run
against the same request run alone on a scheduler of the same settings (``max_batch=1``),
with the seed the row drew and the adapters the scheduler loaded; a row that is not its
run alone is reported, with its first differing token."""

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
