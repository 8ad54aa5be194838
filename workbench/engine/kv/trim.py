"""Caches that step back per row: trimming each row of a batch cache by its own count,
and the check that a model's caches can (speculative decoding's drafts and verify).

Knows: mlx-lm's ``KVCache`` / ``BatchKVCache`` (``trim``, ``prepare(right_padding=)``,
``finalize``). Must not know: requests, drafts, the draft model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlx_lm.models.cache import KVCache, make_prompt_cache


def trim_rows(caches: Sequence[Any], rejected: Sequence[int]) -> None:
    """Drop the last ``rejected[b]`` positions of row ``b`` from every layer's ``BatchKVCache``,
    in place: ``trim(m)`` for the ``m`` all rows reject, then each row rolled right by the rest
    (``prepare(right_padding=)`` + ``finalize()``); a worked example: ``docs/lab/engine-notes.md``,
    "levers/speculative.py".

    Args:
        caches: per-layer ``BatchKVCache`` over ``B`` rows (no free slots).
        rejected: ``[B]`` positions to drop per row (each ``<=`` what it just appended).
    """
    m = min(rejected, default=0)
    extra = [r - m for r in rejected]
    for c in caches:
        if m:
            c.trim(m)
        if any(extra):
            c.prepare(right_padding=extra)
            c.finalize()


def check_cache(model: Any, who: str, max_kv_size: int | None = None) -> None:
    """Refuse a model whose per-layer caches cannot be trimmed per row.

    Raises:
        ValueError: naming the first layer whose cache is not mlx-lm's ``KVCache``
            (rotating windows overwrite old positions, ``ArraysCache`` states cannot step
            back, ``CacheList`` mixes them).
    """
    for i, c in enumerate(make_prompt_cache(model, max_kv_size)):
        if type(c) is not KVCache:
            raise ValueError(
                f"speculative: {who} layer {i} has a {type(c).__name__}, which cannot be trimmed per "
                "row (only full-attention KVCache layers can drop rejected draft tokens)"
            )
