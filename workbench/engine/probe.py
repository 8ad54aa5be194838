"""Does a model batch? A probe run when a Scheduler is built, so the engine never fails
mid-step for a model it accepted.

Knows: mlx-lm's single-sequence and batch caches (:mod:`workbench.engine.kv.caches`), the
model's forward. Must not know: requests, the scheduler's loop.

Some mlx-lm model code assumes one scalar cache offset for the whole batch (mlx-lm's
``gpt_bigcode`` converts ``cache.offset`` with ``int()``): with two rows of different
lengths its forward raises ``ValueError: [convert] Only length-1 arrays can be converted
to Python scalars``, or could compute positions wrong without raising. The probe runs two
prompts of 3 and 5 tokens alone and then batched (merged with left padding, as a join
does) for one decode step, and compares each row's next-token log-probabilities with its
solo run. A model that fails is served in a *serial lane*: ``max_batch = 1``, the same API
and events, one row at a time (see ``Scheduler.serial_reason``).
"""

from __future__ import annotations

import weakref
from typing import Any

import mlx.core as mx

from .kv import caches as kv

PROMPTS = ([1, 2, 3], [4, 5, 6, 7, 8])
TOLERANCE = 5e-2  # max |Δ log-prob|: generous for reduced-precision weights; wrong positions differ by far more
_RESULTS: dict[int, str] = {}  # id(model) -> reason: probed once per model object, dropped when it is collected


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
        for prompt in PROMPTS:
            for target in (solo, rows):
                caches = kv.single_cache(model, max_kv_size)
                model(mx.array([prompt]), cache=caches)  # prefill, [1, L]
                target.append(caches)
        alone = mx.concatenate([_next_logprobs(model, c, mx.array([[1]])) for c in solo])  # [2, V]
        batched = _next_logprobs(model, kv.merge_rows(rows), mx.array([[1], [1]]))  # [2, V]
        diff = float(mx.abs(alone - batched).max())
        reason = "" if diff <= TOLERANCE else (
            f"rows of 3 and 5 tokens batched differ from each alone by {diff:.3g} in log-probability")
    except Exception as exc:  # the model's own code: anything it raises means it does not batch
        reason = f"a batched decode step raised {type(exc).__name__}: {exc}"
    try:  # keyed by id, forgotten with the model: the cache never keeps a model alive
        weakref.finalize(model, _RESULTS.pop, id(model), None)
    except TypeError:  # an object that takes no weak reference: probed again next time
        return reason
    _RESULTS[id(model)] = reason
    return reason
