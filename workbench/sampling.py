"""Sampling per row: greedy rows share one argmax, others use mlx-lm's ``make_sampler``.

Knows: a request's sampling fields, mlx-lm's samplers. Must not know: the scheduler.

Axis letters: ``B`` rows, ``V`` vocabulary size.
"""

from __future__ import annotations

from typing import Callable, Sequence

import mlx.core as mx
from mlx_lm.sample_utils import make_sampler

from .request import Request

Sampler = Callable[[mx.array], mx.array]


def sampler_for(request: Request) -> Sampler | None:
    """``None`` for a greedy request, else mlx-lm's ``make_sampler(temp, top_p, top_k=)``."""
    if request.greedy:
        return None
    return make_sampler(temp=request.temperature, top_p=request.top_p, top_k=request.top_k)


def sample_rows(logprobs: mx.array, samplers: Sequence[Sampler | None]) -> mx.array:
    """Next token per row.

    Args:
        logprobs: ``[B, V]`` float log-probabilities.
        samplers: one per row; ``None`` means greedy.

    Returns:
        ``[B]`` uint32 token ids. All-greedy batches take one ``argmax`` (as mlx-lm's
        ``BatchGenerator`` does when rows share a sampler); mixed batches sample row by
        row.
    """
    greedy = mx.argmax(logprobs, axis=-1).astype(mx.uint32)
    if all(s is None for s in samplers):
        return greedy
    rows = [
        greedy[b : b + 1] if s is None else s(logprobs[b : b + 1]).astype(mx.uint32).reshape(1)
        for b, s in enumerate(samplers)
    ]
    return mx.concatenate(rows)
