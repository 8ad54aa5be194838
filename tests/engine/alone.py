"""Running one request alone through the engine: the "same request run alone" oracle of the
top-k, submit_n and on-disk checkpoint tests (every field the engine records for a row).

On the CPU a row's record equals its run alone bit for bit. On a GPU the kernels of a ``[B, ...]``
forward and a ``[1, ...]`` forward differ in the last bits (about 1e-6 in a log-prob on an H200,
docs/gpu.md), so there tokens, top-k tokens and finish reasons must still be equal and the log-probs
within :data:`GPU_LOGPROB_ATOL`.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

import workbench as wb

GPU_LOGPROB_ATOL = 1e-4  # nats; the measured gap is about 1e-6 (docs/gpu.md)


def logprob_atol() -> float:
    """0 on the CPU (bit equality), :data:`GPU_LOGPROB_ATOL` on a GPU."""
    return 0.0 if mx.default_device() == mx.cpu else GPU_LOGPROB_ATOL


def _close(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= logprob_atol()


class RowRecord(NamedTuple):
    """What a row produced; ``==`` is the oracle (exact on the CPU, log-probs within
    :func:`logprob_atol` on a GPU; a plain tuple or list compares the same way)."""

    tokens: tuple
    logprobs: tuple
    top_logprobs: tuple
    finish_reason: str | None

    def __eq__(self, other) -> bool:
        if not isinstance(other, (tuple, list)) or len(other) != 4:
            return NotImplemented
        tokens, logprobs, top, reason = other
        return (
            list(self.tokens) == list(tokens)
            and self.finish_reason == reason
            and len(self.logprobs) == len(logprobs)
            and all(_close(a, b) for a, b in zip(self.logprobs, logprobs))
            and len(self.top_logprobs) == len(top)
            and all(_same_pairs(a, b) for a, b in zip(self.top_logprobs, top))
        )

    def __ne__(self, other) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = tuple.__hash__


def _same_pairs(a, b) -> bool:
    """One step's top-k ``(token, log-prob)`` pairs: the same tokens in the same order, log-probs close."""
    return len(a) == len(b) and all(int(x[0]) == int(y[0]) and _close(x[1], y[1]) for x, y in zip(a, b))


def row_record(sched: wb.Scheduler, uid: int) -> RowRecord:
    """What a row produced: tokens, log-probs, top-k log-probs, finish reason."""
    view = sched.request(uid)
    return RowRecord(view.tokens, view.logprobs, view.top_logprobs, view.finish_reason)


def run_alone(model, tokenizer, request: wb.Request, **settings) -> RowRecord:
    """``request`` alone on a fresh scheduler (``settings``), run to the end: its
    :func:`row_record`."""
    sched = wb.Scheduler(model, tokenizer, **settings)
    uid = sched.submit(request)
    sched.run()
    return row_record(sched, uid)
