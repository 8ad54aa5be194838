"""What a checkpoint costs: time to take it, the extra work of the step after it, and the
bytes it keeps alive, for a batch of ``B`` rows at ``S`` tokens of context.

Knows: the batch caches of the join-cost scenario (random K/V, :mod:`workbench.bench.scenarios`),
:func:`workbench.engine.kv.cache_internals.clone_caches` (what ``Scheduler.checkpoint``
does to the caches; the rest of a checkpoint is Python lists of request states), MLX's
memory counters. Must not know: the scheduler's loop.

A checkpoint shares the cache buffers (MLX arrays are immutable), so taking it copies
nothing. While it lives, MLX cannot update a shared buffer in place: the next decode
step's cache write copies every layer's keys and values once (the live batch then owns
new buffers and later steps write in place again), and the checkpoint's buffers stay
allocated until it is dropped.
"""

from __future__ import annotations

import gc
from typing import Any

import mlx.core as mx
import pandas as pd

from ..engine.kv import caches as kv
from ..engine.kv.cache_internals import clone_caches
from .scenarios import _filled_rows, _timed

COLUMNS = ["measure", "value", "unit"]


def checkpoint_cost(
    model: Any, rows: int, context_tokens: int, repeats: int = 3, warm_steps: int = 3
) -> pd.DataFrame:
    """Measure a checkpoint of a ``rows`` x ``context_tokens`` batch.

    Returns one row per measurement (``measure``, ``value``, ``unit``): ``kv_bytes`` (the
    batch's cache bytes), ``clone_s`` (taking the checkpoint's cache handles), ``step_s``
    (a decode step, no checkpoint alive), ``first_step_after_s`` (the step right after a
    checkpoint, with its one-time copy), ``later_step_s`` (the step after that),
    ``clone_bytes`` (memory allocated by taking it) and ``held_bytes`` (memory the
    checkpoint keeps alive once the live batch has moved on); medians over ``repeats``.
    """
    running = kv.merge_rows(_filled_rows(model, rows, context_tokens))
    mx.eval([c.state for c in running])
    token = mx.zeros((rows, 1), dtype=mx.uint32)
    step = lambda: mx.argmax(model(token, cache=running)[:, -1, :], axis=-1)  # noqa: E731
    for _ in range(warm_steps):
        _timed(step)
    samples: dict[str, list[float]] = {
        k: []
        for k in ("clone_s", "step_s", "first_step_after_s", "later_step_s", "clone_bytes", "held_bytes")
    }
    for _ in range(repeats):
        samples["step_s"].append(_timed(step))
        gc.collect()
        before = mx.get_active_memory()
        held = []
        samples["clone_s"].append(_timed(lambda held=held: held.append(clone_caches(running)) or []))
        samples["clone_bytes"].append(mx.get_active_memory() - before)
        samples["first_step_after_s"].append(_timed(step))
        samples["later_step_s"].append(_timed(step))
        gc.collect()
        with_checkpoint = mx.get_active_memory()
        held.clear()
        gc.collect()
        samples["held_bytes"].append(with_checkpoint - mx.get_active_memory())
    rows_out = [("kv_bytes", float(kv.kv_bytes(running)), "bytes")]
    rows_out += [
        (k, float(pd.Series(v).median()), "bytes" if k.endswith("bytes") else "s") for k, v in samples.items()
    ]
    return pd.DataFrame(rows_out, columns=COLUMNS)
