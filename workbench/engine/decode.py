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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from .sampling import RowSampler, TokenCheck, sample_rows
from .top_logprobs import TopArrays, TopPairs, arrays_of, read_top, top_arrays


@dataclass
class Pending:
    """Lazy results of one decode forward, aligned with the rows it ran for.

    Attributes:
        tokens: ``[B]`` uint32, each row's sampled next token.
        logprobs: ``[B]`` float32, the log-probability of that token.
        finite: ``[B]`` bool, False where the row's processed logits held NaN or +inf
            (or were all -inf).
        errors: row -> message for rows whose processors or sampler raised or broke
            their contract, or -> the :class:`~workbench.engine.sampling.TokenCheck` of a
            custom sampler's id (resolved by :meth:`read` to a message, or dropped when good).
        top: row -> its top-k ``(ids [k], log-probs [k])`` for rows whose request asked
            (``Request(top_logprobs=k)``, :mod:`workbench.engine.top_logprobs`).
    """

    tokens: mx.array
    logprobs: mx.array
    finite: mx.array
    errors: dict
    top: TopArrays = field(default_factory=dict)

    def take(self, rows: Sequence[int]) -> "Pending":
        """Only rows ``rows`` (after a filter)."""
        idx = mx.array(list(rows), dtype=mx.int32)
        errors = {new: self.errors[old] for new, old in enumerate(rows) if old in self.errors}
        top = {new: self.top[old] for new, old in enumerate(rows) if old in self.top}
        return Pending(self.tokens[idx], self.logprobs[idx], self.finite[idx], errors, top)

    @staticmethod
    def concat(a: "Pending | None", b: "Pending") -> "Pending":
        """Rows of ``a`` then rows of ``b`` (after a join)."""
        if a is None:
            return b
        n = a.tokens.shape[0]
        errors = {**a.errors, **{n + k: v for k, v in b.errors.items()}}
        top = {**a.top, **{n + k: v for k, v in b.top.items()}}
        return Pending(
            mx.concatenate([a.tokens, b.tokens]),
            mx.concatenate([a.logprobs, b.logprobs]),
            mx.concatenate([a.finite, b.finite]),
            errors,
            top,
        )

    def clone(self) -> "Pending":
        """A copy sharing the arrays (nothing writes them in place) with its own ``errors``
        and ``top``."""
        return Pending(self.tokens, self.logprobs, self.finite, dict(self.errors), dict(self.top))

    def read(self) -> tuple[list[int], list[float], list[bool]]:
        """Evaluate (waits for the forward) and return ``(tokens, logprobs, finite)`` as
        lists; ``errors`` then holds messages only (custom samplers' ids checked)."""
        checks = [c for c in self.errors.values() if isinstance(c, TokenCheck)]
        mx.eval(self.tokens, self.logprobs, self.finite, *[c.ok for c in checks], *arrays_of(self.top))
        resolved = {b: e if isinstance(e, str) else e.message() for b, e in self.errors.items()}
        self.errors = {b: message for b, message in resolved.items() if message}
        return self.tokens.tolist(), self.logprobs.tolist(), self.finite.tolist()

    def arrays(self) -> list[mx.array]:
        """The arrays a read evaluates: tokens, log-probs, finiteness, the top-k arrays."""
        return [self.tokens, self.logprobs, self.finite, *arrays_of(self.top)]

    def read_top(self) -> dict[int, TopPairs]:
        """Row -> its top-k ``((id, log-prob), ...)`` best first, for the rows that asked
        (:func:`workbench.engine.top_logprobs.read_top`; evaluates, after :meth:`read`
        at no extra wait)."""
        return read_top(self.top)


def launch(
    model: Any,
    caches: list[Any],
    inputs: mx.array,
    samplers: Sequence[RowSampler],
    contexts: Sequence[Any],
    token_index: Sequence[int],
    asynchronous: bool = True,
) -> Pending:
    """Feed ``inputs`` ``[B]`` (token ids, may be lazy) through the model with ``caches``
    (updated in place) and sample each row's next token.

    Args:
        samplers, contexts, token_index: per row, see :func:`workbench.engine.sampling.sample_rows`.
        asynchronous: start evaluation with ``mx.async_eval`` and return at once (the
            pipelined path); ``False`` evaluates before returning.

    Returns:
        The :class:`Pending` next tokens, their log-probabilities, finiteness and errors,
        and the top-k log-probs of rows whose sampler asked (``RowSampler.top_logprobs``).
    """
    logits = model(inputs.reshape(-1, 1), cache=caches)[:, -1, :]  # [B, V]
    return sample_pending(logits, samplers, contexts, token_index, asynchronous)


def sample_pending(
    logits: mx.array,
    samplers: Sequence[RowSampler],
    contexts: Sequence[Any],
    token_index: Sequence[int],
    asynchronous: bool | None = True,
) -> Pending:
    """Sample each row's next token from ``logits`` ``[B, V]`` (the tail of
    :func:`launch`, shared with the packed forward): the :class:`Pending` tokens,
    log-probabilities, finiteness and errors, evaluated (``asynchronous=False``), started
    (``True``) or left lazy (``None``: the caller starts them later, :meth:`Pending.arrays`)."""
    sampled, logprobs, errors = sample_rows(logits, samplers, contexts, token_index)  # [B], [B, V]
    # NaN or +inf in a row's (processed) logits, or all -inf, makes its log-softmax NaN;
    # -inf entries alone (banned tokens) are fine.
    finite = mx.logical_not(mx.isnan(logprobs).any(axis=-1))  # [B]
    chosen = mx.take_along_axis(logprobs, sampled[:, None].astype(mx.int32), axis=-1)[:, 0]
    top = top_arrays(logprobs, [s.top_logprobs for s in samplers])  # the same [B, V] as ``chosen``
    pending = Pending(sampled, chosen.astype(mx.float32), finite, errors, top)
    if asynchronous is not None:
        (mx.async_eval if asynchronous else mx.eval)(*pending.arrays())
    return pending


def row_context(row: Any, pending: Pending | None, b: int) -> Callable[[], mx.array]:
    """The row's own tokens ``[T]`` (prompt, read tokens, and the unread one at row ``b`` of
    ``pending``) for its logits processors: built only when asked."""

    def build() -> mx.array:
        known = mx.array(list(row.valid.prompt_ids) + row.tokens, dtype=mx.uint32)
        return known if pending is None else mx.concatenate([known, pending.tokens[b : b + 1]])

    return build
