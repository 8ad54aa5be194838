"""MLX's buffer cache on the CPU backend: keep freed KV-sized buffers for reuse.

Knows: ``mlx.core``'s cache limit (``set_cache_limit``), the environment. Must not know:
models, requests.

MLX's CPU allocator keeps at most 32 MiB of freed buffers for reuse (``CommonAllocator``:
``cache_limit_(32UL << 20)``), where its Metal allocator keeps up to its memory limit.
A batch's KV cache is tens to hundreds of MB per layer, so on Linux every such buffer the
engine frees (a cache that grew by ``BatchKVCache.step``, the old rows after ``extend`` or
``filter``, a prefill chunk's attention scores) goes back to the operating system, and
the next allocation of that size page-faults fresh memory. Measured on this project's
2-core machine, a 42 MB ``mx.concatenate`` ran at 1.6-3 GB/s into fresh pages and at
11-24 GB/s into a reused buffer; joining one row into 32 rows of 1,024 tokens by
``extend`` (155M-parameter llama) took 437 ms with the default limit and 60 ms with a
4 GiB one (``docs/benchmarks.md``).

``import workbench`` raises the limit to ``WORKBENCH_MLX_CACHE_BYTES`` (bytes; default a
quarter of MLX's memory limit), never lowers it (Metal's default is already larger), and
``WORKBENCH_MLX_CACHE_BYTES=0`` keeps MLX's default. The scheduler still returns the cache
to the operating system every ``clear_cache_every`` steps (``mx.clear_cache()``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import mlx.core as mx

ENV = "WORKBENCH_MLX_CACHE_BYTES"


@dataclass(frozen=True)
class CacheStatus:
    """What :func:`raise_cache_limit` did: MLX's limit before and after (bytes), and why."""

    before_bytes: int
    after_bytes: int
    note: str


def raise_cache_limit() -> CacheStatus:
    """Raise MLX's buffer-cache limit (see the module docstring); returns what it did.

    Raises:
        ValueError: ``WORKBENCH_MLX_CACHE_BYTES`` is not an int >= 0 (names the variable).
    """
    text = os.environ.get(ENV, "").strip()
    try:
        wanted = int(text) if text else mx.get_memory_limit() // 4
    except ValueError:
        wanted = -1
    if wanted < 0:
        raise ValueError(f"{ENV} must be an int >= 0 (bytes), got {text!r}")
    before = mx.set_cache_limit(int(wanted)) if wanted else None
    if before is None:
        limit = mx.set_cache_limit(0)
        mx.set_cache_limit(limit)
        return CacheStatus(limit, limit, f"{ENV}=0: MLX's default cache limit {limit / 2**20:,.0f} MiB")
    if before >= wanted:  # never lower it
        mx.set_cache_limit(before)
        return CacheStatus(before, before, f"MLX's cache limit {before / 2**20:,.0f} MiB kept (already >= "
                                           f"{wanted / 2**20:,.0f} MiB)")
    return CacheStatus(before, int(wanted), f"MLX's cache limit raised from {before / 2**20:,.0f} MiB to "
                                            f"{wanted / 2**20:,.0f} MiB (freed KV-sized buffers are reused)")


STATUS = raise_cache_limit()
