"""KV budget: projected cache bytes of a request, from the model's real layer shapes.

Knows: how each mlx-lm cache kind grows (full attention: per token; rotating: per token up
to its window; recurrent ``ArraysCache``: a fixed state). Must not know: the queue.

The per-layer sizes are measured once with a probe: a fresh single-sequence cache
(``make_prompt_cache``) after a one-token forward gives each layer's bytes per token
(keys + values: ``2 * n_kv_heads * head_dim * dtype bytes``) or its fixed state bytes.

Example: a 4-layer model with 2 KV heads of dim 32 in float32 stores
``4 * 2 * 2 * 32 * 4 = 2048`` bytes per token; a request with a 100-token prompt and
``max_tokens=28`` projects ``128 * 2048 = 262,144`` bytes. Quantized to 4 bits in groups of 32 (``kv_bits=4,
kv_group_size=32``) each key or value vector of 32 floats is 4 uint32 words plus one
float32 scale and bias (24 bytes instead of 128): ``4 * 2 * 2 * 24 = 384`` bytes per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)


@dataclass(frozen=True)
class LayerBytes:
    """One layer's cache growth: ``per_token_bytes`` up to ``window_tokens`` (None: no
    limit) plus ``fixed_bytes``."""

    per_token_bytes: int
    window_tokens: int | None
    fixed_bytes: int


def _layer_bytes(c: Any) -> list[LayerBytes]:
    if isinstance(c, CacheList):
        return [lb for sub in c.caches for lb in _layer_bytes(sub)]
    if isinstance(c, (KVCache, RotatingKVCache)):
        capacity = c.keys.shape[2]
        per_token = (c.keys.nbytes + c.values.nbytes) // capacity
        return [LayerBytes(per_token, c.max_size if isinstance(c, RotatingKVCache) else None, 0)]
    if isinstance(c, QuantizedKVCache):  # (packed, scales, biases) of keys and values
        return [LayerBytes(int(c.nbytes) // c.keys[0].shape[2], None, 0)]
    if isinstance(c, ArraysCache):
        return [LayerBytes(0, None, int(c.nbytes))]
    return [LayerBytes(0, None, int(getattr(c, "nbytes", 0)))]


def kv_profile(model: Any, max_kv_size: int | None = None, kv_quant: Any = None) -> list[LayerBytes]:
    """Every layer's cache growth, by a one-token probe forward (with ``kv_quant``, its caches
    quantized first by ``maybe_quantize_kv_cache``)."""
    caches = make_prompt_cache(model, max_kv_size)
    model(mx.array([[0]], dtype=mx.uint32), cache=caches)
    if kv_quant is not None:
        maybe_quantize_kv_cache(caches, 0, kv_quant.group_size, kv_quant.bits)
    mx.eval([c.state for c in caches])
    return [lb for c in caches for lb in _layer_bytes(c)]


def projected_bytes(profile: list[LayerBytes], total_tokens: int) -> int:
    """Bytes one request's cache reaches with ``total_tokens`` (prompt + max_tokens)."""
    return sum(
        lb.per_token_bytes * (min(total_tokens, lb.window_tokens) if lb.window_tokens else total_tokens)
        + lb.fixed_bytes
        for lb in profile
    )
