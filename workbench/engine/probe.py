"""Does a model batch? A probe run when a Scheduler is built, so the engine never fails
mid-step for a model it accepted.

Some mlx-lm model code assumes one scalar cache offset for the whole batch (mlx-lm's
``gpt_bigcode`` converts ``cache.offset`` with ``int()``). The probe runs two prompts of 3 and
5 tokens alone and then batched for one decode step, and compares each row's likely next-token
log-probabilities (above :data:`LIKELY_LOGPROB`) with its solo run (reduced precision: within
:data:`LOW_PRECISION_TOLERANCE`). A model that fails runs in a *serial lane* (``max_batch =
1``; ``Scheduler.serial_reason``). Why these thresholds: ``docs/lab/engine-notes.md``, "probe.py".
"""

from __future__ import annotations

import weakref
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .kv import caches as kv

EMBEDDINGS = (nn.Embedding, nn.QuantizedEmbedding)
PROMPT_LENGTHS = (3, 5)  # two rows of different lengths, of ordinary mid-vocabulary token ids
TOLERANCE = (
    5e-2  # max |Δ log-prob|: generous for reduced-precision weights; wrong positions differ by far more
)
LIKELY_LOGPROB = -9.0  # compare tokens the solo run gives at least ~1e-4 probability
LOW_PRECISION_TOLERANCE = 1.0  # for 16-bit or quantized weights: one step of bf16 noise reaches ~0.4 nats


def _vocab(model: Any) -> int:
    """The token ids a forward takes: ``model.args.vocab_size``, else the fewest rows of the
    model's embeddings (phixtral's args call it ``num_vocab``: an id beyond them reads memory
    outside the table, and the probe's verdict then changed from one build to the next)."""
    size = getattr(getattr(model, "args", None), "vocab_size", None)
    if size:
        return int(size)
    rows = [m.weight.shape[0] for _, m in model.named_modules() if isinstance(m, EMBEDDINGS)]
    return int(min(rows)) if rows else 4096


def _prompts(model: Any) -> list[list[int]]:
    """Ordinary token ids from the middle of the vocabulary (not special tokens)."""
    third = max(_vocab(model) // 3, 1)
    return [[third + 97 * (n + 7 * i) % third for i in range(n)] for n in PROMPT_LENGTHS]


def _tolerance(model: Any) -> float:
    low = any(
        v.dtype != mx.float32
        for _, v in tree_flatten(model.parameters())
        if mx.issubdtype(v.dtype, mx.floating)
    )
    return LOW_PRECISION_TOLERANCE if low else TOLERANCE


_RESULTS: dict[
    int, str
] = {}  # id(model) -> reason: probed once per model object, dropped when it is collected


def _next_logprobs(model: Any, caches: list[Any], tokens: mx.array) -> mx.array:
    logits = model(tokens, cache=caches)[:, -1, :].astype(mx.float32)  # [B, V]
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def probe(model: Any, max_kv_size: int | None = None) -> str:
    """``""`` when two rows of different lengths decode batched as each does alone, else
    why not (the exception, or the largest log-prob difference). Runs 6 small forwards
    the first time a model object is probed; cached after that."""
    known = _RESULTS.get(id(model))
    if known is not None:
        return known
    try:
        solo, rows = [], []
        for prompt in _prompts(model):
            for target in (solo, rows):
                caches = kv.single_cache(model, max_kv_size)
                model(mx.array([prompt]), cache=caches)  # prefill, [1, L]
                target.append(caches)
        alone = mx.concatenate([_next_logprobs(model, c, mx.array([[1]])) for c in solo])  # [2, V]
        batched = _next_logprobs(model, kv.merge_rows(rows), mx.array([[1], [1]]))  # [2, V]
        likely = alone > LIKELY_LOGPROB  # [2, V]
        diff = float(mx.where(likely, mx.abs(alone - batched), 0.0).max())
        reason = (
            ""
            if diff <= _tolerance(model)
            else (f"rows of 3 and 5 tokens batched differ from each alone by {diff:.3g} in log-probability")
        )
    except Exception as exc:  # the model's own code: anything it raises means it does not batch
        reason = f"a batched decode step raised {type(exc).__name__}: {exc}"
    try:  # keyed by id, forgotten with the model: the cache never keeps a model alive
        weakref.finalize(model, _RESULTS.pop, id(model), None)
    except TypeError:  # an object that takes no weak reference: probed again next time
        return reason
    _RESULTS[id(model)] = reason
    return reason
