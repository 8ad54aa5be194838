"""The run-alone oracle's record (tests/engine/alone.py): bit equality on the CPU, log-probs within
the GPU's measured noise on a GPU, tokens and finish reasons always exact."""

from __future__ import annotations

import pytest

from . import alone
from .alone import RowRecord

A = RowRecord((5, 7), (-0.5, -1.25), (((5, -0.5), (9, -2.0)), ((7, -1.25), (3, -1.5))), "length")


def nudged(record: RowRecord, dlogprob: float) -> tuple:
    tokens, logprobs, top, reason = record
    return tokens, tuple(x + dlogprob for x in logprobs), top, reason


def test_on_the_cpu_a_record_equals_only_a_bit_equal_one(monkeypatch):
    monkeypatch.setattr(alone, "logprob_atol", lambda: 0.0)  # the CPU's rule, on any device
    assert A == tuple(A) and A == [list(A.tokens), list(A.logprobs), A.top_logprobs, "length"]
    assert A != nudged(A, 1e-9)
    assert A != ((5, 8), A.logprobs, A.top_logprobs, "length") and A != (*A[:3], "stop")


@pytest.mark.parametrize("dlogprob, equal", [(1e-6, True), (5e-4, False)])
def test_on_a_gpu_log_probs_may_differ_by_the_noise_but_tokens_may_not(monkeypatch, dlogprob, equal):
    monkeypatch.setattr(alone, "logprob_atol", lambda: alone.GPU_LOGPROB_ATOL)
    assert (A == nudged(A, dlogprob)) is equal
    swapped = (A.tokens, A.logprobs, (((9, -2.0), (5, -0.5)), A.top_logprobs[1]), "length")
    assert A != swapped and A != ((5, 8), A.logprobs, A.top_logprobs, "length")
