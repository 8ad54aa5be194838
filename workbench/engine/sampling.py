"""Sampling per row: logits processors, filters and a seeded draw attached to each row,
so a row samples the same tokens whatever its neighbours are (mlx-lm's
``make_logits_processors``, ``apply_top_p``, ``apply_min_p``, ``apply_top_k``).

Greedy rows without processors share one ``argmax`` over the batch (as mlx-lm's
``BatchGenerator``). Every other row is processed alone, on its own tokens, and its ``t``-th
draw uses the key :func:`token_key` ``(seed, t)`` (why not mlx-lm's PRNG:
``docs/lab/engine-notes.md``, "sampling.py"). A processor must return ``[1, V]`` floating, a
sampler one integer id in ``[0, V)``; anything else ends only that row (``error``).
Axis letters: ``B`` rows, ``V`` vocabulary, ``T`` context tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from .request import Request


def token_key(seed: int, t: int) -> mx.array:
    """The PRNG key of a row's ``t``-th sampled token: ``mx.random.key`` of BLAKE2b ``(seed, t)``."""
    digest = hashlib.blake2b(f"{seed}:{t}".encode(), digest_size=8).digest()
    return mx.random.key(int.from_bytes(digest, "little"))


class BadOutput(ValueError):
    """A logits processor's or custom sampler's output broke its contract (the row's error)."""


def dtype_name(dtype: Any) -> str:
    """``"int32"`` for ``mx.int32`` (MLX prints ``mlx.core.int32``)."""
    return str(dtype).rsplit(".", 1)[-1]


@dataclass(frozen=True)
class TokenCheck:
    """A custom sampler's returned token id, checked on the device, read with the tokens.

    Attributes:
        value: ``[1]`` the id as returned (its own dtype). ok: ``[1]`` bool, True when it is
            an integer in ``[0, vocab_size)``. vocab_size: ``V``.
    """

    value: mx.array
    ok: mx.array
    vocab_size: int

    def message(self) -> str:
        """``""`` for a good id, else the row's error (evaluates)."""
        if self.ok.item():
            return ""
        return (
            f"sampler returned {self.value.item()!r} ({dtype_name(self.value.dtype)}); a token id must be an "
            f"integer in [0, {self.vocab_size})"
        )


def sampler_token(value: Any, vocab_size: int) -> tuple[mx.array, TokenCheck]:
    """A custom sampler's return value (one id, any size-1 shape) as ``([1] uint32 token, its
    check)``; the token is 0 where the check fails, which is read with the tokens.

    Raises:
        BadOutput: a value ``mx.array`` refuses, of size other than 1, or a Python or numpy integer
            outside ``[0, vocab_size)`` (naming type, shape or value).
    """
    if (
        isinstance(value, (int, np.integer))
        and not isinstance(value, (bool, np.bool_))
        and not -(2**31) <= value < 2**32  # beyond an MLX integer: mx.array raised std::bad_cast
    ):
        raise BadOutput(
            f"sampler returned {int(value)!r}; a token id must be an integer in [0, {vocab_size})"
        )
    try:
        array = value if isinstance(value, mx.array) else mx.array(value)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:  # RuntimeError: MLX's std::bad_cast
        raise BadOutput(f"sampler returned {type(value).__name__}, not a token id ({exc})") from None
    if array.size != 1:
        raise BadOutput(
            f"sampler returned shape {tuple(array.shape)}; a token id must be one integer "
            f"(shape [1]) in [0, {vocab_size})"
        )
    array = array.reshape(1)
    if mx.issubdtype(array.dtype, mx.integer):
        ok = (
            (array >= 0) & (array < vocab_size)
            if mx.issubdtype(array.dtype, mx.signedinteger)
            else array < vocab_size
        )
    else:  # 3.7, NaN, True: not an id (never truncated to one)
        ok = mx.zeros((1,), dtype=mx.bool_)
    return mx.where(ok, array, 0).astype(mx.uint32), TokenCheck(array, ok, vocab_size)


def processed_logits(value: Any, index: int, vocab_size: int, dtype: Any) -> mx.array:
    """A logits processor's return value checked (``[1, V]`` floating), returned as ``dtype``.

    Raises:
        BadOutput: naming processor ``index`` and what it returned against ``[1, V]`` floating.
    """
    want = f"logits must be an mx.array [1, {vocab_size}] of a floating dtype"
    if not isinstance(value, mx.array):
        raise BadOutput(f"logits processor {index} returned {type(value).__name__}; {want}")
    if tuple(value.shape) != (1, vocab_size):
        raise BadOutput(f"logits processor {index} returned shape {list(value.shape)}; {want}")
    if not mx.issubdtype(value.dtype, mx.floating):
        raise BadOutput(f"logits processor {index} returned dtype {dtype_name(value.dtype)}; {want}")
    return value.astype(dtype)


class RowSampler:
    """How one row turns logits into its next token.

    Args:
        request: the row's request.
        seed: the PRNG seed (the request's own, else drawn by the scheduler).
        vocab_size: ``V``.
        constraint: the row's ``RowGrammar``, applied after all other processors, or ``None``.
    """

    def __init__(self, request: Request, seed: int, vocab_size: int, constraint: Any = None):
        r = request
        self.processors = (
            make_logits_processors(
                dict(r.logit_bias) if r.logit_bias else None,
                r.repetition_penalty,
                presence_penalty=r.presence_penalty or None,
                frequency_penalty=r.frequency_penalty or None,
            )
            + list(r.logits_processors)
            + ([constraint] if constraint is not None else [])
        )
        self.constraint = constraint
        self.custom = r.sampler
        self.vocab_size = vocab_size
        self.temperature, self.top_p, self.top_k, self.min_p = r.temperature, r.top_p, r.top_k, r.min_p
        if self.top_k >= vocab_size:
            self.top_k = 0
        self.shared_argmax = r.temperature == 0 and r.sampler is None and not self.processors
        self.seed = seed
        self.top_logprobs = r.top_logprobs  # k best (id, log-prob) per token, 0: none (engine.top_logprobs)

    def process(self, context: mx.array, logits: mx.array) -> mx.array:
        """The row's processors over ``logits`` ``[1, V]`` and tokens ``[T]``, each output checked."""
        V = logits.shape[-1]
        for i, processor in enumerate(self.processors):
            logits = processed_logits(processor(context, logits), i, V, logits.dtype)
        return logits

    def custom_token(self, logprobs: mx.array) -> tuple[mx.array, TokenCheck]:
        """:func:`sampler_token` of the custom sampler over ``logprobs`` ``[1, V]``."""
        return sampler_token(self.custom(logprobs), self.vocab_size)

    def choose(self, logprobs: mx.array, t: int) -> mx.array:
        """The row's ``t``-th token (0-based) from ``logprobs`` ``[1, V]``; ``[1]`` uint32
        (a custom sampler's unchecked: use :meth:`custom_token`)."""
        if self.custom is not None:
            return self.custom_token(logprobs)[0]
        if self.temperature == 0:
            return mx.argmax(logprobs, axis=-1).astype(mx.uint32)
        if 0 < self.top_p < 1:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p > 0:
            logprobs = apply_min_p(logprobs, self.min_p)
        if self.top_k > 0:
            logprobs = apply_top_k(logprobs, self.top_k)
        key, scale = token_key(self.seed, t), 1.0 / self.temperature
        if scale * 32 > mx.finfo(logprobs.dtype).max:  # a log-prob (>= -32) x scale overflows (float16)
            logprobs = logprobs.astype(mx.float32)  # finite there for any accepted temperature
        return mx.random.categorical(logprobs * scale, key=key).astype(mx.uint32)


def sample_rows(
    logits: mx.array, samplers: Sequence[RowSampler], contexts: Sequence[Any], token_index: Sequence[int]
) -> tuple[mx.array, mx.array, dict[int, str]]:
    """Next token per row.

    Args:
        logits: ``[B, V]`` raw logits of the step.
        samplers: one :class:`RowSampler` per row.
        contexts: per row a callable returning its tokens ``[T]`` (for processors).
        token_index: per row the 0-based index of the token being sampled.

    Returns:
        ``(tokens [B] uint32, logprobs [B, V], errors)``; ``errors``: row -> message (its
        token must be discarded) or its custom sampler's :class:`TokenCheck`.
    """
    errors: dict[int, str | TokenCheck] = {}
    if all(s.shared_argmax for s in samplers):
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return mx.argmax(logprobs, axis=-1).astype(mx.uint32), logprobs, errors
    rows_logits = []
    for b, s in enumerate(samplers):
        row = logits[b : b + 1]
        if s.processors:
            row = _contained(
                errors,
                b,
                "logits processor",
                lambda s=s, b=b, row=row: s.process(contexts[b](), row),
                mx.zeros_like(row),
            )
        rows_logits.append(row)
    logits = mx.concatenate(rows_logits, axis=0)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    greedy = mx.argmax(logprobs, axis=-1).astype(mx.uint32)
    tokens = []
    for b, s in enumerate(samplers):
        lp, chosen = logprobs[b : b + 1], None
        if b not in errors and s.custom is not None:
            checked = _contained(errors, b, "sampler", lambda s=s, lp=lp: s.custom_token(lp), None)
            if checked is not None:
                chosen, errors[b] = checked
        elif b not in errors and s.temperature != 0:
            chosen = _contained(
                errors, b, "sampler", lambda s=s, lp=lp, b=b: s.choose(lp, token_index[b]), None
            )
        tokens.append(greedy[b : b + 1] if chosen is None else chosen)
    return mx.concatenate(tokens), logprobs, errors


def _contained(errors: dict, b: int, what: str, call: Any, fallback: Any) -> Any:
    """``call()``, or ``fallback`` with the exception's message in ``errors[b]``."""
    try:
        return call()
    except BadOutput as exc:
        errors[b] = str(exc)
    except Exception as exc:
        errors[b] = f"{what} raised {type(exc).__name__}: {exc}"
    return fallback
