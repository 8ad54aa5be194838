"""The one module that touches mlx-lm's cache internals (the write index ``_idx``, a
ring's ``rotated``, an ``LRUPromptCache``'s trie), behind named functions: free slots,
ring positions, cloning caches for checkpoints, so a change in mlx-lm breaks one file.

**Free slots**: a joiner *written into a finished row's slot* (one
``[1, n_kv_heads, S, head_dim]`` slice update per layer, older positions zeroed and masked
by a new left padding) instead of ``filter`` + ``extend`` (why: ``docs/lab/engine-notes.md``,
"kv/cache_internals.py"). Slot 1 (uid 7 finished) reused by a 2-token joiner, ``_idx = 4``::

    before (uid 7 evicted)          after fill_slots
    row 0  uid 3  [a b c d]  lp 0    row 0  uid 3  [a b c d]  lp 0
    row 1  ----   [p q r s]  free    row 1  uid 9  [0 0 x y]  lp 2, offset 2
    row 2  uid 5  [0 e f g]  lp 1    row 2  uid 5  [0 e f g]  lp 1
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    KVCache,
    LRUPromptCache,
)

LayerCaches = list[Any]  # one batch cache per layer, as a model's forward takes them


def _flat(caches: LayerCaches) -> list[Any]:
    out = []
    for c in caches:
        out += list(c.caches) if isinstance(c, CacheList) else [c]
    return out


def can_fill(running: LayerCaches, joiners: LayerCaches, lengths: Sequence[int]) -> bool:
    """True when every layer can take joiner rows of ``lengths`` tokens into slots: non-empty
    ``BatchKVCache`` with ``_idx >= max(lengths)`` or ``ArraysCache``, alike on both sides."""
    need = max(lengths, default=0)
    for r, q in zip(_flat(running), _flat(joiners), strict=True):
        if type(r) is not type(q):
            return False
        if isinstance(r, BatchKVCache):
            if r.keys is None or q.keys is None or r._idx < need or q._idx < need:
                return False
        elif isinstance(r, ArraysCache):
            if any(a is None for a in r.cache + q.cache):
                return False
        else:
            return False
    return True


def _put_rows(
    a: mx.array | None, slots: Sequence[int], src: mx.array | None, rows: Sequence[int], n_rows: int
) -> mx.array | None:
    """``a`` with ``a[slots[i]] = src[rows[i]]`` (``None``: zeros)."""
    if a is None and src is None:
        return None
    dtype = (src if src is not None else a).dtype
    a = mx.zeros((n_rows,), dtype) if a is None else a
    src = mx.zeros((max(rows) + 1,), dtype) if src is None else src
    where, gather = np.zeros(n_rows, bool), np.zeros(n_rows, np.int32)
    where[list(slots)], gather[list(slots)] = True, list(rows)
    return mx.where(mx.array(where), src[mx.array(gather)].astype(dtype), a)


def fill_slots(
    running: LayerCaches,
    slots: Sequence[int],
    joiners: LayerCaches,
    rows: Sequence[int],
    lengths: Sequence[int],
) -> None:
    """Write joiner row ``rows[i]`` (``lengths[i]`` tokens) into running slot ``slots[i]``, in
    place, lazily: right-aligned at ``_idx``, ``left_padding[slot] = _idx - lengths[i]``,
    ``offset[slot] = lengths[i]``; an ``ArraysCache`` slot's states replaced.

    Raises:
        ValueError: when :func:`can_fill` is False (nothing is changed then).
    """
    if not can_fill(running, joiners, lengths):
        raise ValueError("fill_slots: these caches cannot take joiners into slots (see can_fill)")
    for r, q in zip(_flat(running), _flat(joiners)):
        if isinstance(r, ArraysCache):
            n_rows = r.batch_size
            for e, state in enumerate(r.cache):
                for slot, j in zip(slots, rows):
                    state[slot : slot + 1] = q.cache[e][j : j + 1]
            r.left_padding = _put_rows(r.left_padding, slots, q.left_padding, rows, n_rows)
            r.lengths = _put_rows(r.lengths, slots, q.lengths, rows, n_rows)
            continue
        for slot, j, n in zip(slots, rows, lengths):
            for name in ("keys", "values"):
                for dst, src in zip(_parts(getattr(r, name)), _parts(getattr(q, name))):
                    _, H, _, D = src.shape  # [B, n_kv_heads, S, head_dim] (or a quantized part)
                    row = src[j : j + 1, :, q._idx - n : q._idx, :]
                    if r._idx > n:
                        row = mx.concatenate([mx.zeros((1, H, r._idx - n, D), src.dtype), row], axis=2)
                    dst[slot : slot + 1, :, : r._idx, :] = row
        order = list(range(len(slots)))
        r.left_padding = _put_rows(
            r.left_padding, slots, mx.array([r._idx - n for n in lengths]), order, len(r.offset)
        )
        r.offset = _put_rows(r.offset, slots, mx.array(list(lengths)), order, len(r.offset))


def _parts(keys: Any) -> tuple[mx.array, ...]:
    """``(keys,)`` for float keys, the ``(packed, scales, biases)`` tuple as is."""
    return tuple(keys) if isinstance(keys, (tuple, list)) else (keys,)


def write_index(cache: BatchKVCache) -> int:
    """A ``BatchKVCache``'s write index ``_idx`` (positions in use, the KV width)."""
    return cache._idx


def set_write_index(cache: BatchKVCache, idx: int) -> None:
    """Set a ``BatchKVCache``'s write index ``_idx``."""
    cache._idx = int(idx)


def pending_right_padding(cache: BatchKVCache) -> mx.array | None:
    """The right padding ``[B]`` a ``BatchKVCache`` holds between ``prepare`` and
    ``finalize`` (mlx-lm's ``_right_padding``), or ``None``."""
    return getattr(cache, "right_padding", None) if hasattr(cache, "bits") else cache._right_padding


def view_rows(caches: LayerCaches, keep: Sequence[int]) -> LayerCaches:
    """Shallow copies of ``caches`` with ``filter(keep)`` applied (lazy; originals unchanged)."""
    out = []
    for c in caches:
        if isinstance(c, CacheList):
            view = copy.copy(c)
            view.caches = tuple(view_rows(list(c.caches), keep))
        else:
            view = copy.copy(c)
            if isinstance(c, ArraysCache):
                view.cache = list(c.cache)
            view.filter(list(keep))
        out.append(view)
    return out


def fill_width(running: LayerCaches) -> int:
    """Most tokens a joiner may hold to fit a free slot: the smallest ``_idx`` (``0``: empty)."""
    widths = [c._idx if c.keys is not None else 0 for c in _flat(running) if isinstance(c, BatchKVCache)]
    return min(widths) if widths else 2**62


def trim_shared_padding(running: LayerCaches, longest_row_tokens: int) -> int:
    """Drop left padding every row shares once it is a quarter of the width (as the end of
    ``BatchKVCache.filter``); returns the positions dropped."""
    width = fill_width(running)
    m = width - longest_row_tokens
    if m <= 0 or 4 * m < width or width == 2**62:
        return 0
    for c in _flat(running):
        if isinstance(c, BatchKVCache):
            c.keys, c.values = (
                tuple(a[..., m:, :] for a in t) if isinstance(t, (tuple, list)) else t[..., m:, :]
                for t in (c.keys, c.values)
            )
            c._idx -= m
            c.left_padding = c.left_padding - m
    return m


def complete_loaded_cache(cache: Any) -> Any:
    """A cache from ``load_prompt_cache`` given the fields its ``state`` leaves out; returns it."""
    for sub in cache.caches if isinstance(cache, CacheList) else (cache,):
        if isinstance(sub, BatchKVCache) and not hasattr(sub, "_right_padding"):
            sub._right_padding = None
        if isinstance(sub, BatchRotatingKVCache) and not hasattr(sub, "_lengths"):
            sub._lengths = None
    return cache


def ring_position(cache: BatchRotatingKVCache) -> tuple[bool, int]:
    """``(wrapped, write_index)`` of a batch ring buffer: whether it has wrapped (older
    positions overwritten) and the ring slot written next."""
    wrapped = bool(cache.rotated or cache._idx >= cache.max_size)
    return wrapped, (0 if cache._idx >= cache.max_size else int(cache._idx))


def _handle(value: Any) -> Any:
    """New handles (``mx.view``) on ``value``'s MLX arrays, out of reach of in-place updates."""
    if isinstance(value, mx.array):
        return mx.view(value, value.dtype)
    if isinstance(value, list):
        return [_handle(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_handle(v) for v in value)
    return value


APPEND_ONLY = (
    KVCache,
    BatchKVCache,
)  # writes go past the write index only (subclasses: the quantized batch cache); rings overwrite old slots


def clone_cache(cache: Any, share_appended: bool = False) -> Any:
    """An independent copy of one mlx-lm cache object, copying no buffer until the next write;
    ``share_appended`` (per-call savepoints): append-only keys and values shared as is."""
    out = object.__new__(type(cache))
    fields = dict(vars(cache))
    shared = ("keys", "values") if share_appended and isinstance(cache, APPEND_ONLY) else ()
    for name, value in fields.items():
        if type(value) is mx.array:
            if name not in shared:
                fields[name] = mx.view(value, value.dtype)
        elif isinstance(value, (list, tuple)) and value:
            if isinstance(value[0], (mx.array, type(None), int)):
                fields[name] = _handle(value)
            else:  # CacheList members
                fields[name] = type(value)(clone_cache(v, share_appended) for v in value)
    out.__dict__.update(fields)
    return out


def clone_caches(caches: LayerCaches | None, share_appended: bool = False) -> LayerCaches | None:
    """:func:`clone_cache` of every layer (``None`` stays ``None``)."""
    return None if caches is None else [clone_cache(c, share_appended) for c in caches]


def clone_prompt_cache(lru: LRUPromptCache) -> LRUPromptCache:
    """An independent copy of an ``LRUPromptCache`` (trie and order copied, entries shared)."""
    entries = {}

    def walk(node: dict) -> None:
        for key, child in node.items():
            if key == "__value__":
                entries[id(child)] = child
            else:
                walk(child)

    for per_model in lru._trie._trie.values():
        walk(per_model)
    memo = dict(entries)
    return copy.deepcopy(lru, memo)
