"""What one call allocates: MLX's peak memory during it beyond what was active before.

Knows: ``mx.get_active_memory``, ``mx.get_peak_memory``, ``mx.reset_peak_memory``. Must not
know: the engine.

Used to tell whether an operation copied a buffer it should have written in place (a write
into a pool that copied it allocates the pool's bytes again)::

    grew = peak_growth(sched.step)   # bytes; compare with the buffer a copy would take
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx


def peak_growth(call: Callable[[], Any]) -> int:
    """Bytes MLX allocated at the peak of ``call()`` beyond those active before it (the
    streams synchronized before and after, so work in flight is counted). Resets MLX's
    peak-memory counter (``mx.reset_peak_memory``)."""
    mx.synchronize()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    call()
    mx.synchronize()
    return mx.get_peak_memory() - before
