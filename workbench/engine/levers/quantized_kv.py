"""Quantized KV cache in a batch: mlx-lm's ``QuantizedKVCache`` storage (packed values,
scales and biases) with ``BatchKVCache``'s rows (left padding, per-row offsets, ``extend``,
``filter``, ``extract``, ``merge``, ``prepare`` / ``finalize``, ``make_mask``).

Mirrors ``generate_step(..., quantized_kv_start=0)``: a row's first forward on float keys,
every later one on quantized keys (prompt-cache prefixes: ``docs/quantized-kv.md``). Axis
letters: ``B`` rows, ``H`` KV heads, ``S`` positions, ``D`` head dim, ``D_p = D * bits / 32``
packed uint32 words, ``G = D / group_size`` groups. Keys and values are each
``(packed [B, H, S, D_p] uint32, scales [B, H, S, G], biases [B, H, S, G])``, what
``mx.quantize`` returns and mlx-lm's ``quantized_scaled_dot_product_attention`` reads.

Worked example, 2 rows, 4 bits, ``group_size=32``, ``D=32`` (``D_p=4``, ``G=1``), after
``merge`` of a 3-token and a 1-token solo cache::

    packed [2, H, 3, 4]   row 0  [k0 k1 k2]   left_padding 0   offset 3
                          row 1  [0  0  k0]   left_padding 2   offset 1
    scales, biases [2, H, 3, 1]: 0 at padding, so a pad position dequantizes to 0 and
    the mask (``create_causal_mask(N, offset=3, left_padding=[0, 2])``) hides it.

Notes: ``docs/lab/engine-notes.md``, "levers/quantized_kv.py".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    CacheList,
    KVCache,
    QuantizedKVCache,
    dynamic_roll,
    make_prompt_cache,
)

from ..kv import cache_internals as internals
from .quantized_attention import ATTENTION_PATHS, choose_attention

ALLOWED_BITS = (4, 8)
ALLOWED_GROUP_SIZES = (32, 64, 128)
Quantized = tuple[mx.array, mx.array, mx.array]  # (packed, scales, biases), see the module docstring


@dataclass(frozen=True)
class KVQuant:
    """``bits`` per value (4 or 8), ``group_size`` values per scale and bias (32, 64, 128;
    divides the head dim), ``attention``: ``"quantized_matmul"`` or ``"dequantize"``."""

    bits: int
    group_size: int
    attention: str = "quantized_matmul"

    def __post_init__(self):
        if self.attention not in ATTENTION_PATHS:
            raise ValueError(f"KVQuant.attention must be one of {ATTENTION_PATHS}, got {self.attention!r}")


def kv_quant_from(kv_bits: Any, kv_group_size: Any) -> KVQuant | None:
    """Validate the scheduler's ``kv_bits`` / ``kv_group_size`` (``None`` bits: float cache).

    Raises:
        ValueError: naming the field and its allowed values.
    """
    if isinstance(kv_group_size, bool) or kv_group_size not in ALLOWED_GROUP_SIZES:  # also without kv_bits:
        raise ValueError(
            f"kv_group_size must be one of {ALLOWED_GROUP_SIZES}, got {kv_group_size!r}"
        )  # a typo is not silent
    if kv_bits is None:
        return None
    if isinstance(kv_bits, bool) or kv_bits not in ALLOWED_BITS:
        raise ValueError(f"kv_bits must be None (float cache) or one of {ALLOWED_BITS}, got {kv_bits!r}")
    return KVQuant(int(kv_bits), int(kv_group_size))


def check_model(model: Any, quant: KVQuant, max_kv_size: int | None = None) -> KVQuant:
    """Refuse a model whose KV cache mlx-lm cannot quantize at ``quant`` (a rotating layer, no
    ``KVCache`` layer, a head dim ``group_size`` does not divide); returns ``quant`` with the
    device's attention path (:func:`~workbench.engine.levers.quantized_attention.choose_attention`).

    Raises:
        ValueError: naming the layer, its cache type or head dim, and the allowed values;
            or, where the device runs no quantized attention path, the failing shape.
    """
    caches = make_prompt_cache(model, max_kv_size)
    for i, c in enumerate(caches):
        if not isinstance(c, (KVCache, ArraysCache, CacheList)):
            raise ValueError(
                f"kv_bits: layer {i} has a {type(c).__name__}, which mlx-lm cannot quantize "
                "(only full-attention KVCache layers); use kv_bits=None for this model"
            )
    if not any(isinstance(c, KVCache) for c in caches):
        raise ValueError(
            "kv_bits: the model has no full-attention KVCache layer to quantize (its layers: "
            f"{sorted({type(c).__name__ for c in caches})}); use kv_bits=None"
        )
    model(mx.array([[0]], dtype=mx.uint32), cache=caches)
    for i, c in enumerate(caches):
        if isinstance(c, KVCache):
            dims = {c.keys.shape[-1], c.values.shape[-1]}
            if any(d % quant.group_size for d in dims):
                fits = [g for g in ALLOWED_GROUP_SIZES if all(d % g == 0 for d in dims)]
                raise ValueError(
                    f"kv_group_size={quant.group_size} does not divide layer {i}'s head dim "
                    f"{sorted(dims)}; allowed for this model: {fits}"
                )
    keys = next(c for c in caches if isinstance(c, KVCache)).keys
    _, n_kv, _, dim = keys.shape
    return replace(quant, attention=choose_attention(n_kv, dim, keys.dtype, quant.group_size, quant.bits))


def device_runs_quantized_attention(
    head_dim: int = 64, n_kv_heads: int = 2, kv_bits: int = 4, kv_group_size: int = 32
) -> bool:
    """True when the default device runs mlx-lm's ``quantized_matmul`` attention at every probed
    shape for this head dim (CUDA not always: ``docs/gpu.md``)."""
    try:
        return (
            choose_attention(n_kv_heads, head_dim, mx.float32, kv_group_size, kv_bits) == "quantized_matmul"
        )
    except ValueError:
        return False


def _zeros_like_parts(parts: Quantized, B: int, S: int) -> Quantized:
    """Zero ``(packed, scales, biases)`` of ``B`` rows and ``S`` positions, shaped like ``parts``."""
    return tuple(mx.zeros((B, a.shape[1], S, a.shape[3]), a.dtype) for a in parts)


class BatchQuantizedKVCache(BatchKVCache):
    """mlx-lm's ``BatchKVCache`` with ``QuantizedKVCache`` storage and ``bits`` / ``group_size``,
    so mlx-lm's attention runs ``quantized_scaled_dot_product_attention`` on it.

    Args:
        left_padding: pad positions per row (tokens), as ``BatchKVCache``.
        group_size, bits: the quantization (validated by :func:`kv_quant_from`).
    """

    step = 256

    def __init__(self, left_padding: Sequence[int], group_size: int = 64, bits: int = 8):
        super().__init__(list(left_padding))
        self.group_size, self.bits = int(group_size), int(bits)
        self.right_padding: mx.array | None = None  # rows' right padding until finalize

    # -- the model's forward ----------------------------------------------------------
    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Quantized, Quantized]:
        """Quantize and write ``keys`` / ``values`` ``[B, H, N, D]``; return all positions so far
        (``QuantizedKVCache.update_and_fetch``)."""
        B, H, N, Dk = keys.shape  # [B, n_kv_heads, N, head_dim]
        prev = internals.write_index(self)
        if self.keys is None or prev + N > self.keys[0].shape[2]:
            new_steps = (self.step + N - 1) // self.step * self.step
            fresh_k = self._zeros(B, H, new_steps, Dk, keys.dtype)
            fresh_v = self._zeros(B, H, new_steps, values.shape[3], values.dtype)
            if self.keys is None:
                self.keys, self.values = fresh_k, fresh_v
            else:
                self.keys = tuple(
                    mx.concatenate([a[..., :prev, :], z], axis=2) for a, z in zip(self.keys, fresh_k)
                )
                self.values = tuple(
                    mx.concatenate([a[..., :prev, :], z], axis=2) for a, z in zip(self.values, fresh_v)
                )
        self.offset = self.offset + N
        internals.set_write_index(self, prev + N)
        for stored, new in ((self.keys, keys), (self.values, values)):
            for part, q in zip(stored, mx.quantize(new, group_size=self.group_size, bits=self.bits)):
                part[..., prev : prev + N, :] = q
        return self.keys_and_values()

    def _zeros(self, B: int, H: int, S: int, D: int, dtype: mx.Dtype) -> Quantized:
        """Zero ``(packed [B, H, S, D_p], scales [B, H, S, G], biases)``."""
        words = D * self.bits // 32
        return (
            mx.zeros((B, H, S, words), mx.uint32),
            mx.zeros((B, H, S, D // self.group_size), dtype),
            mx.zeros((B, H, S, D // self.group_size), dtype),
        )

    def keys_and_values(self) -> tuple[Quantized, Quantized]:
        """Keys and values over positions ``[0, KV width)``."""
        idx = internals.write_index(self)
        return tuple(a[..., :idx, :] for a in self.keys), tuple(a[..., :idx, :] for a in self.values)

    # -- mlx-lm's right-padding protocol ----------------------------------------------
    def prepare(self, *, left_padding=None, lengths=None, right_padding=None) -> None:
        """``BatchKVCache.prepare``."""
        super().prepare(left_padding=left_padding, lengths=lengths)
        if right_padding is not None and max(right_padding) > 0:
            self.right_padding = mx.array(right_padding)

    def finalize(self) -> None:
        """``BatchKVCache.finalize``: roll each row right by its right padding."""
        if self.right_padding is None:
            return
        pad = self.right_padding
        self.keys = tuple(dynamic_roll(a, pad[:, None], axis=2) for a in self.keys)
        self.values = tuple(dynamic_roll(a, pad[:, None], axis=2) for a in self.values)
        self.offset = self.offset - pad
        self.left_padding = self.left_padding + pad
        self.right_padding = None

    # -- rows ---------------------------------------------------------------------------
    def filter(self, batch_indices: Sequence[int]) -> None:
        """``BatchKVCache.filter``."""
        idx = mx.array(list(batch_indices), dtype=mx.int32)
        if self.keys is not None:
            self.keys = tuple(a[idx] for a in self.keys)
            self.values = tuple(a[idx] for a in self.values)
        self.offset, self.left_padding = self.offset[idx], self.left_padding[idx]
        shared = min(self.left_padding.tolist())
        if shared > 0:
            if self.keys is not None:
                self.keys = tuple(a[..., shared:, :] for a in self.keys)
                self.values = tuple(a[..., shared:, :] for a in self.values)
            internals.set_write_index(self, internals.write_index(self) - shared)
            self.left_padding = self.left_padding - shared

    def extend(self, other: "BatchQuantizedKVCache") -> None:
        """``BatchKVCache.extend``: append ``other``'s rows in place.

        Raises:
            ValueError: when ``other`` is not a :class:`BatchQuantizedKVCache` of the same
                ``bits`` and ``group_size``.
        """
        if not isinstance(other, BatchQuantizedKVCache) or (other.bits, other.group_size) != (
            self.bits,
            self.group_size,
        ):
            raise ValueError(
                f"extend: a {self.bits}-bit group-{self.group_size} cache cannot take "
                f"{type(other).__name__} rows of another quantization"
            )
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        ref = self if self.keys is not None else other
        width = max(internals.write_index(self), internals.write_index(other))
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        parts = [self._aligned(c, ref, width, size) for c in (self, other)]
        self.keys = tuple(mx.concatenate(z) for z in zip(parts[0][0], parts[1][0]))
        self.values = tuple(mx.concatenate(z) for z in zip(parts[0][1], parts[1][1]))
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([parts[0][2], parts[1][2]])
        internals.set_write_index(self, width)

    @staticmethod
    def _aligned(c: "BatchQuantizedKVCache", ref: "BatchQuantizedKVCache", width: int, size: int):
        """``c``'s parts padded to ``size`` positions, its write index moved to ``width``."""
        Bc = c.offset.shape[0]
        keys = c.keys if c.keys is not None else _zeros_like_parts(ref.keys, Bc, 0)
        values = c.values if c.values is not None else _zeros_like_parts(ref.values, Bc, 0)
        left = width - internals.write_index(c)
        right = size - keys[0].shape[2] - left
        if right < 0:
            keys, values = (tuple(a[..., :right, :] for a in t) for t in (keys, values))
            right = 0
        if left or right:
            keys, values = (
                tuple(mx.pad(a, [(0, 0), (0, 0), (left, right), (0, 0)]) for a in t) for t in (keys, values)
            )
        return keys, values, c.left_padding + left

    def extract(self, idx: int) -> QuantizedKVCache:
        """``BatchKVCache.extract``: row ``idx`` as a ``QuantizedKVCache``."""
        out = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        pad, end = int(self.left_padding[idx].item()), internals.write_index(self)
        out.keys = tuple(mx.contiguous(a[idx : idx + 1, :, pad:end]) for a in self.keys)
        out.values = tuple(mx.contiguous(a[idx : idx + 1, :, pad:end]) for a in self.values)
        out.offset = end - pad
        return out

    @classmethod
    def merge(
        cls, caches: Sequence[Any], group_size: int | None = None, bits: int | None = None
    ) -> "BatchQuantizedKVCache":
        """``BatchKVCache.merge`` of ``QuantizedKVCache`` rows (empty rows allowed).

        Raises:
            ValueError: a row holding float keys, or rows of different quantizations, or
                no quantization known.
        """
        held = [c for c in caches if c.keys is not None]
        if any(not isinstance(c, QuantizedKVCache) for c in held):
            raise ValueError("merge: a row holds float keys; quantize it first (mlx-lm's to_quantized)")
        kinds = {(c.group_size, c.bits) for c in held} | ({(group_size, bits)} if bits is not None else set())
        if len(kinds) != 1:
            raise ValueError(f"merge: rows of different (group_size, bits) {sorted(kinds)} or none known")
        ((group_size, bits),) = kinds
        lengths = [c.offset if c.keys is not None else 0 for c in caches]
        width = max(lengths)
        out = cls([width - n for n in lengths], group_size, bits)
        if width == 0:
            return out
        out.keys = _zeros_like_parts(held[0].keys, len(caches), width)
        out.values = _zeros_like_parts(held[0].values, len(caches), width)
        for b, (c, n) in enumerate(zip(caches, lengths)):
            for stored, row in ((out.keys, c.keys), (out.values, c.values)):
                for part, src in zip(stored, row or ()):
                    part[b : b + 1, :, width - n : width] = src[..., :n, :]
        out.offset = out.offset + width
        internals.set_write_index(out, width)
        return out

    @classmethod
    def from_float(cls, cache: BatchKVCache, group_size: int, bits: int) -> "BatchQuantizedKVCache":
        """A float ``BatchKVCache`` quantized (``KVCache.to_quantized``); it is not changed."""
        out = cls([0], group_size, bits)
        out.left_padding, out.offset = cache.left_padding, cache.offset
        internals.set_write_index(out, internals.write_index(cache))
        out.right_padding = internals.pending_right_padding(cache)
        if cache.keys is not None:
            out.keys = tuple(mx.quantize(cache.keys, group_size=group_size, bits=bits))
            out.values = tuple(mx.quantize(cache.values, group_size=group_size, bits=bits))
        return out

    @property
    def state(self):
        """``BatchKVCache.state``, keys and values as ``(packed, scales, biases)``."""
        return self.keys, self.values, self.offset, self.left_padding, internals.write_index(self)

    @state.setter
    def state(self, v):
        self.keys, self.values, self.offset, self.left_padding, idx = v
        internals.set_write_index(self, idx)

    @property
    def nbytes(self) -> int:
        """Bytes allocated, capacity included."""
        if self.keys is None:
            return 0
        return int(sum(a.nbytes for a in self.keys + self.values))


def is_quantized(cache: Any) -> bool:
    """True for a layer cache whose attention runs quantized (it has ``bits``)."""
    return hasattr(cache, "bits")


def quantize_batch(caches: list[Any], quant: KVQuant) -> list[Any]:
    """A new list with every float full-attention layer quantized (mirrors
    ``maybe_quantize_kv_cache(caches, quantized_kv_start=0, ...)``); other layers kept."""
    out = []
    for c in caches:
        if type(c) is BatchKVCache:
            c = BatchQuantizedKVCache.from_float(c, quant.group_size, quant.bits)
        elif type(c) is KVCache:
            solo = [c]
            maybe_quantize_kv_cache(solo, 0, quant.group_size, quant.bits)
            c = solo[0]
        out.append(c)
    return out


def merge_rows(solo: list[list[Any]], quant: KVQuant) -> list[Any]:
    """One batch cache from per-row solo caches, quantized layers by :meth:`BatchQuantizedKVCache.merge`."""
    out = []
    for layer in zip(*solo):
        if any(isinstance(c, QuantizedKVCache) for c in layer):
            out.append(BatchQuantizedKVCache.merge(list(layer), quant.group_size, quant.bits))
        else:
            out.append(type(layer[0]).merge(list(layer)))
    return out


def configure(model: Any, kv_bits: Any, kv_group_size: Any, max_kv_size: int | None = None) -> KVQuant | None:
    """The scheduler's ``kv_bits`` / ``kv_group_size`` checked against the model; ``None``: float.
    Raises ``ValueError`` as :func:`kv_quant_from` and :func:`check_model`."""
    quant = kv_quant_from(kv_bits, kv_group_size)
    if quant is None:
        return None
    return check_model(model, quant, max_kv_size)
