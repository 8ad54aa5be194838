"""Cache adapter: build, join, evict and read mlx-lm's batch caches.

Knows: mlx-lm's cache classes (``mlx_lm.models.cache``) and their batch operations
``merge / extend / filter / prepare / finalize / make_mask``. Must not know: requests,
events, the scheduling policy.

A *batch cache* here is the per-layer list a model's forward takes as ``cache=`` with
batch size ``B``; for a full-attention layer it is a ``BatchKVCache`` whose keys are
``[B, n_kv_heads, capacity, head_dim]`` of which the first ``kv_width`` positions are in
use, each row left-padded by ``left_padding[b]`` positions.
"""

from __future__ import annotations

from typing import Any, Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

LayerCaches = list[Any]


def check_batchable(model: Any) -> None:
    """Refuse a model whose per-layer caches cannot be batched.

    Raises:
        ValueError: naming the first layer index and cache type with no ``merge`` (e.g.
            ``QuantizedKVCache``, ``ChunkedKVCache``, ``ConcatenateKVCache``).
    """
    for i, c in enumerate(make_prompt_cache(model)):
        if not hasattr(type(c), "merge"):
            raise ValueError(
                f"layer {i}: cache type {type(c).__name__} cannot be batched by mlx-lm "
                "(no merge/extend/filter); use a model or KV setting with KVCache, "
                "RotatingKVCache or ArraysCache layers"
            )


def new_batch_cache(model: Any, n_rows: int) -> LayerCaches:
    """Empty batch caches for ``n_rows`` joining rows.

    Mirrors mlx-lm's ``generate._merge_caches`` over fresh ``make_prompt_cache(model)``
    caches: each layer's solo cache class ``merge``s into its batch class
    (``KVCache`` -> ``BatchKVCache``, ``ArraysCache`` -> ``ArraysCache``, ...).
    """
    solo = [make_prompt_cache(model) for _ in range(n_rows)]
    return [type(layer[0]).merge(list(layer)) for layer in zip(*solo)]


def join(running: LayerCaches | None, joiners: LayerCaches) -> LayerCaches:
    """Append the joiners' rows after the running rows, layer by layer, with mlx-lm's
    in-place ``extend`` (never by re-merging the whole batch). Returns the running list
    (or ``joiners`` when nothing was running)."""
    if running is None:
        return joiners
    for mine, theirs in zip(running, joiners):
        mine.extend(theirs)
    return running


def evict(running: LayerCaches, keep: Sequence[int]) -> LayerCaches | None:
    """Keep only rows ``keep`` (sorted row indices) with mlx-lm's in-place ``filter``,
    which also trims left padding shared by all kept rows. Returns ``None`` when no row
    is kept."""
    if not keep:
        return None
    for c in running:
        c.filter(list(keep))
    return running


def full_attention_layer(caches: LayerCaches) -> BatchKVCache | None:
    """The first ``BatchKVCache`` layer (the full-attention layer group), or ``None``."""
    return next((c for c in caches if isinstance(c, BatchKVCache)), None)


def geometry(cache: BatchKVCache) -> dict[str, Any]:
    """Per-row geometry of one ``BatchKVCache`` layer.

    Returns:
        ``left_padding`` ``[B]`` int (tokens), ``offset`` ``[B]`` int (RoPE position of
        the next token), ``kv_width_tokens`` (positions in use), ``capacity_tokens``
        (allocated positions; mlx-lm grows it in steps of 256).
    """
    mx.eval(cache.left_padding, cache.offset)
    return {
        "left_padding": [int(x) for x in cache.left_padding.tolist()],
        "offset": [int(x) for x in cache.offset.tolist()],
        "kv_width_tokens": int(cache.size()),
        "capacity_tokens": 0 if cache.keys is None else int(cache.keys.shape[2]),
    }


def kv_bytes(caches: LayerCaches | None) -> int:
    """Bytes allocated by all layers' caches (mlx-lm's ``nbytes``, capacity included)."""
    return 0 if caches is None else int(sum(c.nbytes for c in caches))


def next_step_mask(cache: BatchKVCache) -> mx.array:
    """The mask the next decode step gives this layer: ``cache.make_mask(1)`` as an
    ``[B, S]`` bool array, ``S = kv_width + 1``."""
    B = cache.left_padding.shape[0]
    mask = cache.make_mask(1)  # [B, 1, 1, S]
    return mask.reshape(B, -1)
