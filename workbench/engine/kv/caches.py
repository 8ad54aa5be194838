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
    """The model's own single-sequence cache (``make_prompt_cache``), with every
    ``RotatingKVCache`` rebuilt to keep ``keep`` sink tokens.

    mlx-lm's ``make_prompt_cache(model, max_kv_size)`` keeps 4 sink tokens while its
    ``BatchRotatingKVCache`` keeps none, so a row that is prefilled alone and then batched
    (and the solo reference of a batched row) uses ``keep=0``; ``keep=4`` reproduces
    mlx-lm's single-sequence default (a known semantic gap).
    """
    return [
        RotatingKVCache(c.max_size, keep=keep) if isinstance(c, RotatingKVCache) else c
        for c in make_prompt_cache(model, max_kv_size)
    ]


def new_batch_cache(model: Any, n_rows: int, max_kv_size: int | None = None) -> LayerCaches:
    """Empty batch caches for ``n_rows`` joining rows.

    Mirrors mlx-lm's ``generate._merge_caches`` over fresh
    ``make_prompt_cache(model, max_kv_size)`` caches: each layer's solo cache class
    ``merge``s into its batch class (``KVCache`` -> ``BatchKVCache``, ``RotatingKVCache``
    -> ``BatchRotatingKVCache``, ``ArraysCache`` -> ``ArraysCache``, ``CacheList`` ->
    ``CacheList``).
    """
    return merge_rows([make_prompt_cache(model, max_kv_size) for _ in range(n_rows)])


@dataclass(frozen=True)
class CacheRecipe:
    """How one engine's caches are made: the model's own per-layer caches (mlx-lm's
    ``make_prompt_cache``), bounded to ``max_kv_size`` tokens (rotating; only for models
    without ``make_cache``), quantized by ``kv_quant`` (a
    :class:`~workbench.engine.levers.quantized_kv.KVQuant`; ``None``: float). mlx-lm keeps
    the same as ``BatchGenerator._make_new_cache``.

    ``recipe.single()`` ``[1, H, S, D]`` per layer, ``recipe.batch(n)`` ``[n, H, S, D]``,
    ``recipe.profile()`` the per-layer bytes (:func:`workbench.engine.kv.profile.kv_profile`).
    """

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
    """One batch cache from per-row single-sequence caches (empty or holding a cached
    prefix), layer by layer with each class's ``merge`` (left-padding shorter rows)."""
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
    settle(running)
    return running


def repeat_rows(caches: LayerCaches, rows: Sequence[int]) -> LayerCaches:
    """Row ``b`` of the result = row ``rows[b]`` of ``caches`` (indices may repeat: a row
    copied into several), in place, with mlx-lm's ``filter`` (a gather of every layer's
    keys, values, offsets and padding, or states; shared left padding trimmed). Returns
    ``caches``. Example: ``rows = [0, 0, 0, 1]`` turns 2 rows into 4, the first three equal."""
    for c in caches:
        c.filter(list(rows))
    settle(caches)
    return caches


def settle(caches: LayerCaches | None) -> None:
    """Evaluate the caches now into buffers of their own, so the bytes they hold are their
    ``nbytes``: mlx-lm's ``filter`` leaves a lazy gather that keeps the old buffer alive
    until the next forward, and a slice (``keys[..., m:, :]``, shared left padding
    dropped) that keeps the gathered buffer's dropped positions; ``extend`` leaves a lazy
    concatenation holding both sides. ``mx.contiguous`` copies only such slices (the
    next write into one would copy it anyway); the rest is evaluated in place."""
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
    """Shape of an attention cache's key storage, ``[P, n_kv_heads, capacity, last]``:
    the float keys' shape, or for a quantized cache
    (:class:`workbench.engine.levers.quantized_kv.BatchQuantizedKVCache`, keys a
    ``(packed, scales, biases)`` tuple) the packed part's (``last`` = packed words)."""
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
    """The layer group a batch cache belongs to: ``full`` (``BatchKVCache``),
    ``window<W>`` (``BatchRotatingKVCache`` of ``W`` tokens), ``ssm`` (``ArraysCache``),
    else the class name."""
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
    """Per-row geometry of one attention layer's batch cache, and its next-step mask,
    captured now and converted to numpy when the returned function is called.

    Capturing evaluates nothing (a snapshot can be recorded right after a forward is
    launched); the call evaluates, and may wait.

    The dict has ``left_padding`` ``[B]`` (pad positions, tokens; for a ring that has
    dropped old positions this can be negative, as in mlx-lm), ``offset`` ``[B]`` (RoPE
    position of each row's next token), ``kv_width_tokens`` (positions in use),
    ``capacity_tokens`` (allocated positions), ``mask`` ``[B, S]`` bool: what
    ``cache.make_mask(1)`` gives the layer at the next step. For a rotating cache also
    ``window_tokens``, ``write_index`` (the ring slot written next), ``wrapped`` and
    ``mask_temporal`` (the mask rolled back to oldest-first order).
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
    """State shapes of one ``ArraysCache`` layer (e.g. conv state ``[B, K-1, C]`` and SSM
    state ``[B, n_heads, head_dim, state]``) and the mask its next step uses, as
    ``[B, 1]`` bool (all True when mlx-lm gives none: every row's token enters the state).
    Captured now, converted when the returned function is called (see
    :func:`attention_geometry`)."""
    B = n_rows
    mask = cache.make_mask(1)
    shapes = tuple(tuple(a.shape) for a in cache.cache if a is not None)
    return lambda: {
        "state_shapes": shapes,
        "mask": np.ones((B, 1), bool) if mask is None else np.array(mask).reshape(B, -1),
    }
