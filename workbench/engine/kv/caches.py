"""Cache adapter: build, join, evict and read mlx-lm's batch caches (``mlx_lm.models.cache``).

A *batch cache* is the per-layer list a forward takes as ``cache=`` with ``B`` rows; a
full-attention layer's ``BatchKVCache`` keys are ``[B, n_kv_heads, capacity, head_dim]``, the
first ``kv_width`` positions in use, row ``b`` left-padded by ``left_padding[b]``. Design notes:
``docs/lab/engine-notes.md``, "kv/caches.py".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    RotatingKVCache,
    make_prompt_cache,
)

from .cache_internals import LayerCaches, ring_position
from .profile import kv_profile


def check_batchable(model: Any, max_kv_size: int | None = None) -> None:
    """Refuse a model whose per-layer caches cannot be batched.

    Args:
        max_kv_size: mlx-lm's bounded KV size (tokens), only for models without their own
            ``make_cache`` (mlx-lm silently ignores it otherwise; we refuse).

    Raises:
        ValueError: naming the first layer index and cache type with no ``merge`` (e.g.
            ``QuantizedKVCache``, ``ChunkedKVCache``, ``ConcatenateKVCache``), or when
            ``max_kv_size`` is given for a model that defines ``make_cache``.
    """
    if max_kv_size is not None and hasattr(model, "make_cache"):
        raise ValueError(
            f"max_kv_size={max_kv_size} would be ignored: {type(model).__module__} defines "
            "make_cache, so its layers choose their own caches (mlx-lm's make_prompt_cache)"
        )
    for i, c in enumerate(make_prompt_cache(model, max_kv_size)):
        subs = c.caches if isinstance(c, CacheList) else (c,)
        for sub in subs:
            if not hasattr(type(sub), "merge"):
                raise ValueError(
                    f"layer {i}: cache type {type(sub).__name__} cannot be batched by mlx-lm "
                    "(no merge/extend/filter); use a model or KV setting with KVCache, "
                    "RotatingKVCache or ArraysCache layers, or serve it one request at a time "
                    "with mlx_lm.generate"
                )


def single_cache(model: Any, max_kv_size: int | None = None, keep: int = 0) -> LayerCaches:
    """The model's own single-sequence cache (``make_prompt_cache``), every ``RotatingKVCache``
    keeping ``keep`` sink tokens (``0``: as the batch cache; ``4``: mlx-lm's single default)."""
    return [
        RotatingKVCache(c.max_size, keep=keep) if isinstance(c, RotatingKVCache) else c
        for c in make_prompt_cache(model, max_kv_size)
    ]


def new_batch_cache(model: Any, n_rows: int, max_kv_size: int | None = None) -> LayerCaches:
    """Empty batch caches for ``n_rows`` joining rows (mlx-lm's ``generate._merge_caches``
    over fresh ``make_prompt_cache`` caches)."""
    return merge_rows([make_prompt_cache(model, max_kv_size) for _ in range(n_rows)])


@dataclass(frozen=True)
class CacheRecipe:
    """How one engine's caches are made (mlx-lm's ``BatchGenerator._make_new_cache``): the model's
    ``make_prompt_cache``, bounded to ``max_kv_size`` tokens, quantized by ``kv_quant``
    (:class:`~workbench.engine.levers.quantized_kv.KVQuant`; ``None``: float)."""

    model: Any
    max_kv_size: int | None = None
    kv_quant: Any = None

    def single(self, keep: int = 0) -> LayerCaches:
        """A single-sequence cache (:func:`single_cache`, ``keep`` sink tokens)."""
        return single_cache(self.model, self.max_kv_size, keep)

    def batch(self, n_rows: int) -> LayerCaches:
        """Empty batch caches for ``n_rows`` rows (:func:`new_batch_cache`)."""
        return new_batch_cache(self.model, n_rows, self.max_kv_size)

    def profile(self) -> list[Any]:
        """Every layer's :class:`~workbench.engine.kv.profile.LayerBytes` (one probe forward)."""
        return kv_profile(self.model, self.max_kv_size, self.kv_quant)


def merge_rows(solo: list[LayerCaches]) -> LayerCaches:
    """One batch cache from per-row single-sequence caches (each class's ``merge``, left-padding)."""
    return [type(layer[0]).merge(list(layer)) for layer in zip(*solo)]


def join(running: LayerCaches | None, joiners: LayerCaches) -> LayerCaches:
    """Append the joiners' rows after the running rows with mlx-lm's in-place ``extend``;
    returns the running list (or ``joiners``)."""
    if running is None:
        return joiners
    for mine, theirs in zip(running, joiners):
        mine.extend(theirs)
    return running


def evict(running: LayerCaches, keep: Sequence[int]) -> LayerCaches | None:
    """Keep only rows ``keep`` (sorted) with mlx-lm's in-place ``filter``; ``None`` when none is kept."""
    if not keep:
        return None
    for c in running:
        c.filter(list(keep))
    settle(running)
    return running


def repeat_rows(caches: LayerCaches, rows: Sequence[int]) -> LayerCaches:
    """Row ``b`` becomes row ``rows[b]`` (may repeat), in place with mlx-lm's ``filter``; returns
    ``caches``. Example: ``rows = [0, 0, 0, 1]`` turns 2 rows into 4, the first three equal."""
    for c in caches:
        c.filter(list(rows))
    settle(caches)
    return caches


def settle(caches: LayerCaches | None) -> None:
    """Evaluate the caches into buffers of their own, so the bytes they hold are their ``nbytes``
    (why: engine notes)."""
    if not caches:
        return
    for c in caches:
        for sub in c.caches if isinstance(c, CacheList) else (c,):
            if isinstance(sub, BatchKVCache) and sub.keys is not None:
                sub.keys, sub.values = (
                    type(t)(mx.contiguous(a) for a in t) if isinstance(t, (tuple, list)) else mx.contiguous(t)
                    for t in (sub.keys, sub.values)
                )
    mx.eval([c.state for c in caches])


def kv_bytes(caches: LayerCaches | None) -> int:
    """Bytes allocated by all layers' caches (mlx-lm's ``nbytes``, capacity included)."""
    return 0 if caches is None else int(sum(c.nbytes for c in caches))


def keys_shape(cache: Any) -> tuple[int, ...]:
    """``[P, n_kv_heads, capacity, last]`` of an attention cache's keys (quantized: the packed part's)."""
    keys = cache.keys[0] if isinstance(cache.keys, (tuple, list)) else cache.keys
    return tuple(keys.shape)


def _flat_layers(caches: LayerCaches) -> list[tuple[str, Any]]:
    """``(layer label, cache)`` pairs with ``CacheList`` members as ``"i.j"``."""
    out = []
    for i, c in enumerate(caches):
        if isinstance(c, CacheList):
            out += [(f"{i}.{j}", sub) for j, sub in enumerate(c.caches)]
        else:
            out.append((str(i), c))
    return out


def group_name(cache: Any) -> str:
    """``full``, ``window<W>``, ``ssm`` or the class name of a batch cache."""
    if isinstance(cache, BatchKVCache):
        return "full"
    if isinstance(cache, BatchRotatingKVCache):
        return f"window{cache.max_size}"
    if isinstance(cache, ArraysCache):
        return "ssm"
    return type(cache).__name__


def layer_groups(caches: LayerCaches) -> dict[str, list[tuple[str, Any]]]:
    """Layers grouped by :func:`group_name`, in first-layer order."""
    groups: dict[str, list[tuple[str, Any]]] = {}
    for label, c in _flat_layers(caches):
        groups.setdefault(group_name(c), []).append((label, c))
    return groups


def _ints(a: mx.array) -> np.ndarray:
    return np.array(a).reshape(-1).astype(np.int64)


Geometry = Callable[[], dict[str, Any]]


def attention_geometry(cache: BatchKVCache | BatchRotatingKVCache) -> Geometry:
    """Per-row geometry of one attention layer's batch cache, captured now (evaluating nothing)
    and converted to numpy when the returned function is called: ``left_padding`` ``[B]``
    (negative for a ring past its window), ``offset`` ``[B]`` (RoPE position next),
    ``kv_width_tokens``, ``capacity_tokens``, ``mask`` ``[B, S]`` bool (``make_mask(1)``); a
    ring adds ``window_tokens``, ``write_index``, ``wrapped``, ``mask_temporal`` (oldest first).
    """
    # new handles: mlx-lm's rotating cache updates these arrays in place (``-=``, ``+=``)
    left_padding, offset = cache.left_padding[:], cache.offset[:]
    B = left_padding.shape[0]
    out: dict[str, Any] = {
        "capacity_tokens": 0 if cache.keys is None else keys_shape(cache)[2],
        "kv_width_tokens": int(cache.size()),
    }
    if isinstance(cache, BatchRotatingKVCache):
        mask = cache.make_mask(1, window_size=cache.max_size)
        wrapped, write_index = ring_position(cache)
        out.update(window_tokens=int(cache.max_size), write_index=write_index, wrapped=wrapped)
    else:
        mask = cache.make_mask(1)

    def finish() -> dict[str, Any]:
        rows = np.array(mask).reshape(B, -1)
        geo = dict(out, left_padding=_ints(left_padding), offset=_ints(offset), mask=rows)
        if "window_tokens" in out:
            geo["mask_temporal"] = np.roll(rows, -(write_index + 1), axis=-1) if wrapped else rows
        return geo

    return finish


def ssm_geometry(cache: ArraysCache, n_rows: int) -> Geometry:
    """State shapes of one ``ArraysCache`` layer and its next-step mask ``[B, 1]`` bool, captured
    as :func:`attention_geometry` does."""
    B = n_rows
    mask = cache.make_mask(1)
    shapes = tuple(tuple(a.shape) for a in cache.cache if a is not None)
    return lambda: {
        "state_shapes": shapes,
        "mask": np.ones((B, 1), bool) if mask is None else np.array(mask).reshape(B, -1),
    }
