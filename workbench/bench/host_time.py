"""Where a decode step's wall time goes on the host: MLX's graph launch, the wait for the
device, and the engine's own Python (issue 40's "host time per step").

Knows: MLX's two evaluation calls (``mx.async_eval``, ``mx.eval``) and a benchmark
engine's ``submit`` / ``iterate`` / ``idle`` (:mod:`workbench.bench.engines`). Must not
know: any engine's internals.
"""

from __future__ import annotations

import collections
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import mlx.core as mx

from .engines import Arrival


@contextlib.contextmanager
def wrapped_evals(wrap: Callable[[str, Any], Any]) -> Iterator[None]:
    """Within the block, ``mx.async_eval`` is ``wrap("launch", mx.async_eval)`` and ``mx.eval``
    is ``wrap("wait", mx.eval)`` (each wrapper calls the function it is given); MLX's own are
    put back on exit, also on an exception."""
    real = {"launch": mx.async_eval, "wait": mx.eval}
    mx.async_eval, mx.eval = wrap("launch", real["launch"]), wrap("wait", real["wait"])
    try:
        yield
    finally:
        mx.async_eval, mx.eval = real["launch"], real["wait"]


@contextlib.contextmanager
def timed_mlx_calls(totals: dict[str, float]) -> Iterator[dict[str, float]]:
    """Within the block, every ``mx.async_eval`` and ``mx.eval`` call adds its wall seconds
    to ``totals["launch"]`` / ``totals["wait"]`` and the calling thread's CPU seconds in
    them to ``totals["mlx_cpu"]`` (MLX's functions are swapped for timed wrappers and put
    back on exit, also on an exception).

    Args:
        totals: seconds by key, e.g. a ``collections.defaultdict(float)``; updated in place.
    """

    def wrap(key: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return real(*args, **kwargs)
            finally:
                totals[key] += time.perf_counter() - start
                totals["mlx_cpu"] += time.thread_time() - cpu

        return call

    with wrapped_evals(wrap):
        yield totals


def step_anatomy(engine: Any, arrivals: Sequence[Arrival]) -> dict[str, float]:
    """Submit every arrival to ``engine``, iterate until idle, and split its full-batch decode
    iterations' wall time (those that made ``len(arrivals)`` tokens and followed one that
    did). Returns medians in milliseconds: ``step_ms`` (the whole iteration), ``launch_ms``
    (inside ``mx.async_eval``: MLX turning the graph into kernels), ``wait_ms`` (inside
    ``mx.eval``: blocked on the device), ``python_ms`` (the rest: the engine's Python and
    graph building), ``host_ms`` (``step_ms - wait_ms``: the host's share, launch + Python),
    ``python_cpu_ms`` (the thread's CPU seconds outside MLX's calls, which other processes'
    load inflates less than wall time), and ``steps`` (how many iterations were counted;
    ``{"steps": 0}`` alone when fewer than two full-batch iterations ran). mlx-lm reads its
    tokens with ``tolist``, so its wait counts as Python there.
    """
    for a in arrivals:
        engine.submit(a.prompt, a.max_tokens)
    rows, B = [], len(arrivals)
    while not engine.idle:
        totals: dict[str, float] = collections.defaultdict(float)
        start, cpu = time.perf_counter(), time.thread_time()
        with timed_mlx_calls(totals):
            made = engine.iterate()
        total = time.perf_counter() - start
        rows.append(
            (made, total, totals["launch"], totals["wait"], time.thread_time() - cpu - totals["mlx_cpu"])
        )
    full = [r for prev, r in zip(rows, rows[1:]) if r[0] == B and prev[0] == B]
    if not full:
        return {"steps": 0}

    def med(values: Any) -> float:
        return 1e3 * statistics.median(values)

    return {
        "steps": len(full),
        "step_ms": med(r[1] for r in full),
        "launch_ms": med(r[2] for r in full),
        "wait_ms": med(r[3] for r in full),
        "python_ms": med(r[1] - r[2] - r[3] for r in full),
        "host_ms": med(r[1] - r[3] for r in full),
        "python_cpu_ms": med(r[4] for r in full),
    }
