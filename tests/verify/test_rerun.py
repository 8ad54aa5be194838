"""The two re-runs mirror what they claim: the batched one is the forward the next
``step()`` runs (same next-token log-probabilities as the engine reads later), the solo one
is mlx-lm's ``generate_step`` (same log-probabilities as the solo oracle's trace)."""

import numpy as np
import pytest

import workbench as wb
from workbench.verify.oracle import ref_request, solo_reference
from workbench.verify.rerun import batched_step, solo_step

pytestmark = pytest.mark.model


def test_the_batched_re_run_is_the_forward_the_next_step_runs(make_sched, prompt, bundled):
    model, _ = bundled
    sched = make_sched(max_batch=3)
    for n, start in ((6, 0), (2, 40), (11, 80)):
        sched.submit(wb.Request(prompt=prompt(n, start), max_tokens=8))
    sched.admit(), sched.step(), sched.step()
    cp = sched.checkpoint()
    steps = {uid: batched_step(model, cp, uid) for uid in range(3)}
    n = len(sched.tokens(0))  # 2 read; token 2 pending; the next step's forward computes token 3
    sched.step(), sched.step()
    for uid, b in steps.items():
        token = sched.tokens(uid)[n + 1]
        assert b.fed_token == sched.tokens(uid)[n] and b.batch_size == 3 and b.row == uid
        assert int(b.record.logprobs.argmax()) == token
        assert b.record.logprobs[token] == sched.logprobs(uid)[n + 1]  # bit for bit
        assert b.record.hidden.shape == (5, 128) and b.record.kv[0].shape == (
            len(sched.request_of(uid).prompt_ids) + n + 1,
            2 * 2 * 32,
        )
    assert [b.left_padding for b in steps.values()] == [5, 9, 0]


def test_the_solo_re_run_is_mlx_lms_generate_step(make_sched, prompt, bundled):
    model, _ = bundled
    sched = make_sched(max_batch=1, prefill_step_size=4)  # the prompt prefilled in chunks of 4
    uid = sched.submit(wb.Request(prompt=prompt(11, 80), max_tokens=6))
    sched.run()
    ref = solo_reference(model, ref_request(sched.request_of(uid)), prefill_step_size=4)
    ids, tokens = list(sched.request_of(uid).prompt_ids), sched.tokens(uid)
    for n in (0, 3):
        solo = solo_step(model, ids, tokens[:n], tokens[n], prefill_step_size=4)
        assert int(solo.logprobs.argmax()) == ref.tokens[n + 1]
        assert solo.logprobs[ref.tokens[n + 1]] == ref.logprobs[n + 1]  # bit for bit
        assert np.isfinite(solo.hidden).all() and solo.kv[0].shape[0] == len(ids) + n + 1


def test_a_uid_without_a_row_and_an_empty_prompt_are_refused(make_sched, prompt, bundled):
    model, _ = bundled
    sched = make_sched(max_batch=1)
    sched.submit(wb.Request(prompt=prompt(4), max_tokens=2))
    with pytest.raises(ValueError, match="holds no row"):
        batched_step(model, sched.checkpoint(), 0)  # still queued
    with pytest.raises(ValueError, match="empty"):
        solo_step(model, [], [], 5)
