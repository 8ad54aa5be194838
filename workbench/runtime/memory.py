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

Reading memory device-true (what a buffer really takes, :func:`allocation_bytes`; what the
device really holds, :func:`settled_active_memory`; allocations free of the buffer cache,
:func:`exact_allocations`): on CUDA MLX rounds every buffer up (8 bytes, a power of two,
or whole 16 KiB pages), releases a kernel's temporaries only when its stream completes, and
may hand a freed, somewhat larger buffer back for a smaller request, counting its own size.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

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
        return CacheStatus(
            before,
            before,
            f"MLX's cache limit {before / 2**20:,.0f} MiB kept (already >= {wanted / 2**20:,.0f} MiB)",
        )
    return CacheStatus(
        before,
        int(wanted),
        f"MLX's cache limit raised from {before / 2**20:,.0f} MiB to "
        f"{wanted / 2**20:,.0f} MiB (freed KV-sized buffers are reused)",
    )


STATUS = raise_cache_limit()


BACKENDS = ("cuda", "metal", "cpu")
CUDA_PAGE_BYTES = 16384  # mlx/backend/cuda/allocator.cpp: page_size
CUDA_SMALL_BLOCK_BYTES = 8  # small_block_size: the scalar pool's block


def allocation_bytes(nbytes: int, backend: str | None = None) -> int:
    """Bytes MLX's allocator takes (and counts in ``mx.get_active_memory()``) for one buffer
    of ``nbytes`` bytes: what the memory readings of an array really cost on a device.

    Mirrors ``CudaAllocator::malloc`` (``mlx/backend/cuda/allocator.cpp``): on CUDA a buffer
    of 1 to 8 bytes takes 8 (an empty one, 0), one under 16 KiB the next power of two, a larger one a whole
    number of 16 KiB pages (measured on an H200: a ``[333, 777]`` bf16 array of 517,482
    bytes took 524,288, ``docs/gpu.md``). The CPU allocator (``CommonAllocator``) takes
    ``nbytes`` exactly. Metal is not modelled (returns ``nbytes``). A lower bound when MLX's
    buffer cache holds freed buffers: both allocators may hand back a cached buffer somewhat
    larger than asked (measured on the CPU: 19,712 bytes for 16,385), and count its size.

    Args:
        nbytes: an array's ``nbytes`` (bytes, >= 0).
        backend: ``"cuda"``, ``"metal"`` or ``"cpu"``; ``None``: the default device's
            (:func:`workbench.runtime.device.backend`).

    Raises:
        ValueError: ``nbytes`` is not an int >= 0, or ``backend`` not one of :data:`BACKENDS`.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")
    if backend is None:
        from .device import backend as default_backend

        backend = default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if backend != "cuda" or nbytes == 0:
        return int(nbytes)
    if nbytes <= CUDA_SMALL_BLOCK_BYTES:
        return CUDA_SMALL_BLOCK_BYTES
    if nbytes < CUDA_PAGE_BYTES:
        return 1 << (int(nbytes) - 1).bit_length()
    return -(-int(nbytes) // CUDA_PAGE_BYTES) * CUDA_PAGE_BYTES


def settled_active_memory(tries: int = 50) -> int:
    """MLX's active memory once the device is idle (bytes): the default stream synchronized
    (on CUDA a kernel's temporaries are released by its stream's completion handlers, which
    ``mx.synchronize`` waits for), unreachable arrays collected, and two readings in a row
    equal (at most ``tries``, 2 ms apart; the last one otherwise). ``mx.get_active_memory()``
    read mid-forward counts that forward's buffers too."""
    reading = None
    for _ in range(max(1, tries)):
        mx.synchronize()
        gc.collect()
        now = int(mx.get_active_memory())
        if now == reading:
            break
        reading = now
        time.sleep(0.002)
    return now


@contextlib.contextmanager
def exact_allocations() -> Iterator[None]:
    """MLX's buffer cache emptied and off (limit 0) while the body runs, then its limit
    restored: every buffer allocated inside is fresh, at :func:`allocation_bytes` of its
    size (a cached buffer handed back for a smaller request counts at its own size: on CUDA
    up to two 16 KiB pages more, on the CPU seen 19,712 bytes for 16,385), and a freed one
    leaves active memory at once. Slower (no reuse): for measurements, not for serving."""
    mx.synchronize()
    mx.clear_cache()
    limit = mx.set_cache_limit(0)
    try:
        yield
    finally:
        mx.set_cache_limit(limit)
