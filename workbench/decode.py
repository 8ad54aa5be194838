"""One decode forward: feed one token per row, get each row's next-token choice, lazily.

Knows: the model call with a batch cache, log-softmax, per-row sampling. Must not know:
requests, events, the queue.

Pipelining (mirrors mlx-lm's ``GenerationBatch._step``): :func:`launch` builds the graph
for the next step from the *unread* tokens of the current one and returns a
:class:`Pending` whose arrays are evaluated asynchronously (``mx.async_eval``) while
Python reads the current step's tokens. Numerics are unchanged: the same ops run, only
their evaluation overlaps Python work.

Axis letters: ``B`` rows, ``V`` vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx

from .sampling import Sampler, sample_rows


@dataclass
class Pending:
    """Lazy results of one decode forward, aligned with the rows it ran for.

    Attributes:
        tokens: ``[B]`` uint32, each row's sampled next token.
        logprobs: ``[B]`` float32, the log-probability of that token.
    """

    tokens: mx.array
    logprobs: mx.array

    def take(self, rows: Sequence[int]) -> "Pending":
        """Only rows ``rows`` (after a filter)."""
        idx = mx.array(list(rows), dtype=mx.int32)
        return Pending(self.tokens[idx], self.logprobs[idx])

    @staticmethod
    def concat(a: "Pending | None", b: "Pending") -> "Pending":
        """Rows of ``a`` then rows of ``b`` (after a join)."""
        if a is None:
            return b
        return Pending(mx.concatenate([a.tokens, b.tokens]), mx.concatenate([a.logprobs, b.logprobs]))

    def read(self) -> tuple[list[int], list[float]]:
        """Evaluate (waits for the forward) and return ``(tokens, logprobs)`` as lists."""
        mx.eval(self.tokens, self.logprobs)
        return self.tokens.tolist(), self.logprobs.tolist()


def launch(model: Any, caches: list[Any], inputs: mx.array, samplers: Sequence[Sampler | None],
           asynchronous: bool = True) -> Pending:
    """Feed ``inputs`` ``[B]`` (token ids, may be lazy) through the model with ``caches``
    (updated in place) and sample each row's next token.

    Args:
        asynchronous: start evaluation with ``mx.async_eval`` and return at once (the
            pipelined path); ``False`` evaluates before returning.

    Returns:
        The :class:`Pending` next tokens and their log-probabilities.
    """
    logits = model(inputs.reshape(-1, 1), cache=caches)[:, -1, :]  # [B, V]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    sampled = sample_rows(logprobs, samplers)  # [B]
    chosen = mx.take_along_axis(logprobs, sampled[:, None].astype(mx.int32), axis=-1)[:, 0]
    pending = Pending(sampled, chosen.astype(mx.float32))
    if asynchronous:
        mx.async_eval(pending.tokens, pending.logprobs)
    else:
        mx.eval(pending.tokens, pending.logprobs)
    return pending
