"""Top-k log-probs per row: the ``k`` most likely next tokens and their log-probabilities,
best first, for the rows whose request asked (``Request(top_logprobs=k)``).

They are read from the same log-probs as the row's sampled token's own (after its logits
processors, before temperature and filters: mlx-lm's ``Response.logprobs``, OpenAI's and
vLLM's ``top_logprobs``), so a row's top-k depends only on its own log-probs. Ties go to the
smaller id; ``-inf`` tokens (forbidden by a processor) are left out, so a constrained row may
get fewer than ``k`` pairs. How it is computed: ``docs/lab/engine-notes.md``, "top_logprobs.py".

Example, ``V = 5`` and one row asking ``k = 2``::

    logprobs[b] = [-2.3, -0.4, -9.1, -1.2, -3.0]   ->   ((1, -0.4), (3, -1.2))

Axis letters: ``B`` rows, ``n`` rows that asked, ``V`` vocabulary, ``K`` the most asked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import mlx.core as mx

# row -> (ids [k] int32, log-probs [k] float32), lazy: one forward's top-k of the rows that asked
TopArrays = dict[int, tuple[mx.array, mx.array]]
# what a row records per generated token: ((token id, log-prob), ...), best first
TopPairs = tuple[tuple[int, float], ...]


def top_arrays(logprobs: mx.array, ks: Sequence[int]) -> TopArrays:
    """The ``ks[b]`` best ``(id, log-prob)`` of each row ``b`` with ``ks[b] > 0``, lazily.

    Args:
        logprobs: ``[B, V]`` log-probs of one forward (any float dtype).
        ks: per row, how many it asked (``0``: none); at most ``V`` is used.

    Returns:
        row -> ``(ids [k] int32, log-probs [k] float32)``, sorted best first; ``{}`` when
        no row asked (then nothing is computed).
    """
    rows = [b for b, k in enumerate(ks) if k > 0]
    if not rows:
        return {}
    V = logprobs.shape[-1]
    K = min(V, max(ks[b] for b in rows))
    picked = (
        logprobs if len(rows) == logprobs.shape[0] else logprobs[mx.array(rows, dtype=mx.int32)]
    )  # [n, V]
    ids = (
        mx.argpartition(-picked, kth=K - 1, axis=-1)[:, :K] if K < V else mx.argsort(-picked, axis=-1)
    )  # [n, K]
    values = mx.take_along_axis(picked, ids, axis=-1)
    order = mx.argsort(-values, axis=-1)
    ids = mx.take_along_axis(ids, order, axis=-1).astype(mx.int32)
    values = mx.take_along_axis(values, order, axis=-1).astype(mx.float32)
    return {b: (ids[i, : min(ks[b], V)], values[i, : min(ks[b], V)]) for i, b in enumerate(rows)}


def arrays_of(top: Mapping[int, tuple[mx.array, mx.array]]) -> list[mx.array]:
    """Every array of ``top``, for ``mx.eval`` / ``mx.async_eval``."""
    return [a for pair in top.values() for a in pair]


def read_top(top: Mapping[int, tuple[mx.array, mx.array]]) -> dict[int, TopPairs]:
    """``top`` evaluated: row -> ``((id, log-prob), ...)`` best first, ties by id, non-finite
    pairs left out; ``{}`` when no row asked (nothing evaluated)."""
    if not top:
        return {}
    mx.eval(arrays_of(top))
    out = {}
    for b, (ids, values) in top.items():
        pairs = [(i, v) for i, v in zip(ids.tolist(), values.tolist()) if math.isfinite(v)]
        out[b] = tuple(sorted(pairs, key=lambda p: (-p[1], p[0])))
    return out
