"""Sampling per row: logits processors, filters and a seeded draw attached to each row,
so a row samples the same tokens whatever its neighbours are.

Knows: a request's sampling fields and mlx-lm's sampling pieces
(``make_logits_processors``, ``apply_top_p``, ``apply_min_p``, ``apply_top_k``). Must not
know: the scheduler, caches.

Greedy rows without processors share one ``argmax`` over the batch (as mlx-lm's
``BatchGenerator`` does when rows share a sampler). Every other row is processed alone:
its processors see only its own tokens (prompt and generated, never padding), and its
draw uses its own PRNG key :func:`token_key` ``(seed, t)`` for its ``t``-th token, which
depends on the seed and ``t`` only (never on ``max_tokens``, neighbours, preemption or
checkpoints)
— mlx-lm draws from one global PRNG state, so it cannot batch seeded requests.

Axis letters: ``B`` rows, ``V`` vocabulary, ``T`` context tokens.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from .request import Request


def token_key(seed: int, t: int) -> mx.array:
    """The PRNG key of a row's ``t``-th sampled token (0-based): ``mx.random.key`` of a
    64-bit hash (BLAKE2b) of ``(seed, t)``, so it depends on nothing else. (mlx-lm draws
    every row from one global PRNG state; splitting one key into ``max_tokens + 1`` parts
    would make token ``t`` depend on ``max_tokens``.)"""
    digest = hashlib.blake2b(f"{seed}:{t}".encode(), digest_size=8).digest()
    return mx.random.key(int.from_bytes(digest, "little"))


class RowSampler:
    """How one row turns logits into its next token.

    Args:
        request: the row's request.
        seed: the PRNG seed for a sampled row (the request's own, else one the scheduler
            drew).
        vocab_size: ``V``.
    """

    def __init__(self, request: Request, seed: int, vocab_size: int):
        r = request
        self.processors = make_logits_processors(
            dict(r.logit_bias) if r.logit_bias else None, r.repetition_penalty,
            presence_penalty=r.presence_penalty or None, frequency_penalty=r.frequency_penalty or None,
        ) + list(r.logits_processors)
        self.custom = r.sampler
        self.temperature, self.top_p, self.top_k, self.min_p = r.temperature, r.top_p, r.top_k, r.min_p
        if self.top_k >= vocab_size:
            self.top_k = 0
        self.shared_argmax = r.temperature == 0 and r.sampler is None and not self.processors
        self.seed = seed

    def process(self, context: mx.array, logits: mx.array) -> mx.array:
        """Apply the row's logits processors to ``logits`` ``[1, V]`` given its tokens
        ``[T]``. Exceptions propagate (the caller contains them)."""
        for processor in self.processors:
            logits = processor(context, logits)
        return logits

    def choose(self, logprobs: mx.array, t: int) -> mx.array:
        """The row's ``t``-th token (0-based) from ``logprobs`` ``[1, V]``; ``[1]`` uint32."""
        if self.custom is not None:
            return mx.array(self.custom(logprobs)).reshape(1).astype(mx.uint32)
        if self.temperature == 0:
            return mx.argmax(logprobs, axis=-1).astype(mx.uint32)
        if 0 < self.top_p < 1:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p > 0:
            logprobs = apply_min_p(logprobs, self.min_p)
        if self.top_k > 0:
            logprobs = apply_top_k(logprobs, self.top_k)
        key = token_key(self.seed, t)
        return mx.random.categorical(logprobs * (1.0 / self.temperature), key=key).astype(mx.uint32)


def sample_rows(logits: mx.array, samplers: Sequence[RowSampler], contexts: Sequence[Any],
                token_index: Sequence[int]) -> tuple[mx.array, mx.array, dict[int, str]]:
    """Next token per row.

    Args:
        logits: ``[B, V]`` raw logits of the step.
        samplers: one :class:`RowSampler` per row.
        contexts: per row a callable returning its tokens ``[T]`` (prompt and generated,
            possibly lazy), used only by rows with processors.
        token_index: per row the 0-based index of the token being sampled.

    Returns:
        ``(tokens [B] uint32, logprobs [B, V], errors)``; ``errors`` maps a row to the
        message of the exception its processors or sampler raised (that row's token is
        then 0 and must be discarded).
    """
    errors: dict[int, str] = {}
    if all(s.shared_argmax for s in samplers):
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return mx.argmax(logprobs, axis=-1).astype(mx.uint32), logprobs, errors
    rows_logits = []
    for b, s in enumerate(samplers):
        row = logits[b : b + 1]
        if s.processors:
            try:
                row = s.process(contexts[b](), row)
            except Exception as exc:  # contained: only this row ends
                errors[b] = f"logits processor raised {type(exc).__name__}: {exc}"
                row = mx.zeros_like(logits[b : b + 1])
        rows_logits.append(row)
    logits = mx.concatenate(rows_logits, axis=0)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    greedy = mx.argmax(logprobs, axis=-1).astype(mx.uint32)
    tokens = []
    for b, s in enumerate(samplers):
        if b in errors or (s.temperature == 0 and s.custom is None):
            tokens.append(greedy[b : b + 1])
            continue
        try:
            tokens.append(s.choose(logprobs[b : b + 1], token_index[b]))
        except Exception as exc:  # contained: only this row ends
            errors[b] = f"sampler raised {type(exc).__name__}: {exc}"
            tokens.append(greedy[b : b + 1])
    return mx.concatenate(tokens), logprobs, errors
