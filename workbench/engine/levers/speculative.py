"""Speculative decoding inside the batch: draft tokens per row, one batched verify
forward, per-row acceptance, each row's cache trimmed to what it accepted.

``Scheduler(speculative="prompt-lookup", num_draft_tokens=k)`` drafts each row's next tokens
from its own context by n-gram lookup (vLLM's ``ngram`` method); ``speculative=draft_model``
drafts with a second mlx-lm model sharing the tokenizer
(:mod:`workbench.engine.levers.draft_model`). Mirrors mlx-lm's ``speculative_generate_step``,
batched. One step (the row's pending token ``t0`` was sampled by the last forward)::

    read t0 ─▶ drafts d[0..n_b) per row (n_b <= k; 0 for rows that cannot speculate)
            ─▶ one verify forward over [B, 1 + K] = [t0, d..., pad...]   (K = max n_b)
            ─▶ choice[j] = the row's own token after input position j (j = 0..K)
            ─▶ accept d[j] while choice[j] == d[j]: a_b drafts; the next pending token
               is choice[a_b] (the "bonus" token: one more than accepted, always)
            ─▶ trim row b's cache by K - a_b positions (:func:`trim_rows`)

A row's choice is its argmax (greedy) or its seeded draw for that token index (sampled), so
every row emits the tokens it emits without speculation. Axis letters: ``B`` rows, ``K`` most
drafts of any row, ``V`` vocabulary. Why the target's distribution is kept, and a per-row trim
example: ``docs/lab/engine-notes.md``, "levers/speculative.py".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ..forward import Pending
from ..kv.trim import check_cache, trim_rows
from ..sampling import RowSampler, sample_rows
from ..top_logprobs import top_arrays
from .draft_model import DraftModel

PROMPT_LOOKUP = "prompt-lookup"


@dataclass(frozen=True)
class Speculation:
    """How a scheduler speculates.

    Attributes:
        num_draft_tokens: most draft tokens per row and step (``k``, 1..16).
        draft: the draft model's proposer (:class:`workbench.engine.levers.draft_model.DraftModel`),
            or ``None`` for prompt lookup.
        max_ngram, min_ngram: the n-gram lengths prompt lookup tries, longest first (tokens).
    """

    num_draft_tokens: int
    draft: Any = None
    max_ngram: int = 3
    min_ngram: int = 1

    @property
    def method(self) -> str:
        """``"prompt-lookup"`` or ``"draft model"``."""
        return PROMPT_LOOKUP if self.draft is None else "draft model"


def configure(
    model: Any,
    speculative: Any,
    num_draft_tokens: int,
    *,
    batch_invariant: bool = False,
    vocab_size: int | None = None,
    prefill_step_size: int = 2048,
    max_kv_size: int | None = None,
) -> Speculation | None:
    """The scheduler's :class:`Speculation`, or ``None`` for ``speculative=None``.

    Args:
        speculative: ``"prompt-lookup"`` or a draft mlx-lm model sharing the target's
            tokenizer (same vocabulary size).
        vocab_size: the target's ``V``, which a draft model must have too.

    Raises:
        ValueError: a layer cache other than ``KVCache`` in the target (``max_kv_size``:
            rotating) or the draft model (:func:`check_cache`); a draft of another vocabulary.
    """
    if speculative is None:
        return None
    check_cache(model, "the model's", max_kv_size)
    if isinstance(speculative, str):
        return Speculation(num_draft_tokens)
    return Speculation(num_draft_tokens, DraftModel.of(speculative, vocab_size, prefill_step_size))


def draft_caps(rows: Sequence[Any], k: int) -> list[int]:
    """Per row of :class:`~workbench.engine.state.RequestState` the most drafts it may take:
    ``0`` if finished or not :func:`speculates`, else ``k`` bounded by tokens left to ``max_tokens``."""
    return [
        0
        if r.finished or not speculates(r.sampler, r.valid.request)
        else max(0, min(k, r.valid.request.max_tokens - len(r.tokens)))
        for r in rows
    ]


def propose(spec: Speculation, batch: Any) -> list[list[int]]:
    """Each running row's drafts of the :class:`~workbench.engine.batch.Batch` (prompt lookup, or
    the draft model's greedy tokens, its caches in ``batch.draft``), at most :func:`draft_caps`."""
    caps = draft_caps(batch.rows, spec.num_draft_tokens)
    if not any(caps):
        return [[] for _ in caps]
    contexts = [list(r.valid.prompt_ids) + r.tokens for r in batch.rows]
    if spec.draft is not None:
        return spec.draft.propose(batch, contexts, caps)
    return [lookup_drafts(c, n, spec.max_ngram, spec.min_ngram) if n else [] for c, n in zip(contexts, caps)]


def settle(spec: Speculation, batch: Any, verified: Verified) -> None:
    """After a verify forward: the draft model's caches keep only the accepted drafts."""
    if spec.draft is not None:
        spec.draft.settle(batch, verified.accepted)


def speculates(sampler: RowSampler, request: Any) -> bool:
    """Whether a row may take drafts: no custom sampler, user logits processor, grammar (they
    may keep state and would see rejected drafts) or top-k log-probs."""
    return (
        sampler.custom is None
        and sampler.constraint is None
        and not request.logits_processors
        and not sampler.top_logprobs
    )


def lookup_drafts(context: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of
    the context's last ``n`` tokens, for ``n`` from ``max_ngram`` down to ``min_ngram``
    (the first ``n`` that occurs earlier wins); at most ``k`` of them. Mirrors vLLM's
    ``NgramProposer`` (which takes the first occurrence; the latest one follows the most
    recent repetition, as in copied code).

    >>> lookup_drafts([5, 6, 7, 8, 5, 6], 3)   # "5 6" occurred at 0: then 7 8 5
    [7, 8, 5]
    >>> lookup_drafts([1, 2, 3], 4)
    []

    Args:
        context: the row's tokens ``[T]`` (prompt, then generated).
        k: most drafts (``>= 0``).

    Returns:
        Up to ``k`` token ids (empty when no suffix n-gram occurred before).
    """
    ctx = np.asarray(context, dtype=np.int64)
    T = len(ctx)
    for n in range(min(max_ngram, T - 1), min_ngram - 1, -1):
        if n < 1 or k < 1:
            break
        windows = np.lib.stride_tricks.sliding_window_view(ctx[: T - 1], n)  # [T - n, n], starts 0..T-n-1
        hits = np.flatnonzero((windows == ctx[T - n :]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return ctx[start : start + k].tolist()
    return []


def accepted_counts(drafts: Sequence[Sequence[int]], choices: Sequence[Sequence[int]]) -> list[int]:
    """Per row, how many leading drafts the target chose too (what the row would have chosen).

    >>> accepted_counts([[4, 5, 6], [], [7, 8]], [[4, 5, 9, 1], [3, 0, 0, 0], [2, 8, 0, 0]])
    [2, 0, 0]

    Args:
        drafts: per row its draft tokens ``[n_b]``.
        choices: per row the target's token after each input position ``[1 + K]``
            (``choices[b][j]`` follows input ``j``; input 0 is the pending token).
    """
    out = []
    for d, c in zip(drafts, choices):
        a = 0
        while a < len(d) and c[a] == d[a]:
            a += 1
        out.append(a)
    return out


@dataclass
class Verified:
    """What one verify forward decided, evaluated, per row.

    Attributes:
        drafted: ``[B]`` draft tokens each row fed. accepted: ``[B]`` drafts accepted.
        tokens, logprobs: per row the accepted drafts and their natural-log probabilities.
        pending: the next token per row (``choice[a_b]``), as the next step reads it.
    """

    drafted: list[int]
    accepted: list[int]
    tokens: list[list[int]]
    logprobs: list[list[float]]
    pending: Pending

    @classmethod
    def without_drafts(cls, pending: Pending) -> "Verified":
        """A step in which no row drafted (an ordinary decode step gave ``pending``)."""
        B = pending.tokens.shape[0]
        return cls([0] * B, [0] * B, [[] for _ in range(B)], [[] for _ in range(B)], pending)


def _choices(logits: mx.array, first: mx.array, first_lp: mx.array) -> tuple[list, list, list]:
    """Greedy choices, their log-probs and finiteness per row and position, as lists ``[B][1 + K]``."""
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # [B, 1 + K, V]
    choices = mx.concatenate([first[:, None], mx.argmax(lp[:, 1:], axis=-1).astype(mx.uint32)], axis=1)
    picked = mx.take_along_axis(lp, choices[..., None].astype(mx.int32), axis=-1)[..., 0]  # [B, 1 + K]
    first_picked = mx.take_along_axis(first_lp, first[:, None].astype(mx.int32), axis=-1)[:, 0]
    finite = mx.logical_not(mx.isnan(lp).any(axis=-1))  # [B, 1 + K]
    first_finite = mx.logical_not(mx.isnan(first_lp).any(axis=-1))
    mx.eval(choices, picked, finite, first_picked, first_finite)
    c, p, f = choices.tolist(), picked.tolist(), finite.tolist()
    for b, (lp0, ok0) in enumerate(zip(first_picked.tolist(), first_finite.tolist())):
        p[b][0], f[b][0] = lp0, ok0  # position 0 as the row's own sampler processed it
    return c, p, f


def _sampled_choices(
    logits: mx.array,
    drafts: Sequence[Sequence[int]],
    samplers: Sequence[RowSampler],
    contexts: Sequence[Any],
    token_index: Sequence[int],
    c: list,
    p: list,
    f: list,
) -> None:
    """Overwrite ``c``, ``p``, ``f`` at positions ``1..n_b`` of sampled rows with the row's seeded draw."""
    for b, (d, s) in enumerate(zip(drafts, samplers)):
        if not d or s.shared_argmax:
            continue
        base, drawn = contexts[b]() if s.processors else None, []
        for j in range(1, len(d) + 1):
            row = logits[b, j][None]  # [1, V]
            if s.processors:
                row = s.process(mx.concatenate([base, mx.array(d[:j], dtype=mx.uint32)]), row)
            lp = row - mx.logsumexp(row, axis=-1, keepdims=True)
            token = s.choose(lp, token_index[b] + j)  # [1]
            drawn.append((token, lp[0, token[0]], mx.logical_not(mx.isnan(lp).any())))
        mx.eval(drawn)
        for j, (token, logprob, ok) in enumerate(drawn, 1):
            c[b][j], p[b][j], f[b][j] = int(token.item()), float(logprob.item()), bool(ok.item())


def verify(
    model: Any,
    caches: Sequence[Any],
    pending_tokens: Sequence[int],
    drafts: Sequence[Sequence[int]],
    samplers: Sequence[RowSampler],
    contexts: Sequence[Any],
    token_index: Sequence[int],
) -> Verified:
    """One verify forward over ``[B, 1 + K]`` (pending token, drafts, padding), then
    :func:`decide` and each row's cache trimmed (:func:`trim_rows`).

    Args:
        caches: per-layer ``BatchKVCache`` (or the quantized
            :class:`~workbench.engine.levers.quantized_kv.BatchQuantizedKVCache`, ``kv_bits``)
            over ``B`` rows, each holding its context up to (not including) its pending token;
            the caller enters the rows' LoRA selection (all ``1 + K`` positions of a row) and
            the attention path (:meth:`workbench.engine.runner.ModelRunner.speculate`).
        pending_tokens: ``[B]`` each row's latest read token (fed first).
        drafts: per row up to ``K`` draft tokens (rows with none feed padding only).
        samplers, contexts, token_index: per row, as :func:`sample_rows` takes them.

    Returns:
        The evaluated :class:`Verified`.
    """
    K = max(len(d) for d in drafts)
    inputs = mx.array(
        [[t, *d, *([t] * (K - len(d)))] for t, d in zip(pending_tokens, drafts)], dtype=mx.uint32
    )
    logits = model(inputs, cache=list(caches))  # [B, 1 + K, V]
    verified = decide(logits, drafts, samplers, contexts, token_index)
    trim_rows(caches, [K - a for a in verified.accepted])
    return verified


def decide(
    logits: mx.array,
    drafts: Sequence[Sequence[int]],
    samplers: Sequence[RowSampler],
    contexts: Sequence[Any],
    token_index: Sequence[int],
) -> Verified:
    """The evaluated :class:`Verified` of a verify forward's ``logits`` ``[B, 1 + K, V]``, either
    layout's: position 0 sampled as a decode step samples it (:func:`sample_rows`), a draft
    accepted while the row chose it; positions past a row's drafts are never read."""
    first, first_lp, errors = sample_rows(logits[:, 0, :], samplers, contexts, token_index)  # [B], [B, V]
    c, p, f = _choices(logits, first, first_lp)
    _sampled_choices(logits, drafts, samplers, contexts, token_index, c, p, f)
    acc = [
        min(a, f[b].index(False) if False in f[b] else a) for b, a in enumerate(accepted_counts(drafts, c))
    ]
    rows = range(len(drafts))
    top = top_arrays(first_lp, [s.top_logprobs for s in samplers])  # top-k rows never draft: position 0
    pending = Pending(
        mx.array([c[b][acc[b]] for b in rows], dtype=mx.uint32),
        mx.array([p[b][acc[b]] for b in rows], dtype=mx.float32),
        mx.array([f[b][acc[b]] for b in rows]),
        {b: e for b, e in errors.items() if acc[b] == 0},
        top,
    )
    return Verified(
        [len(d) for d in drafts],
        acc,
        [list(drafts[b][: acc[b]]) for b in rows],
        [p[b][: acc[b]] for b in rows],
        pending,
    )
