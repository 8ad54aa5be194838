"""Static batching, the baseline continuous batching improves on, driven through the
scheduler's public calls: a new batch is formed only when the last one has fully drained,
so every batch waits for its longest member and finished rows leave idle slots.

Knows: the scheduler's public ``submit / admit / step / filter / snapshot``. Must not know:
its internals (this is a way of *calling* the same engine, not another engine).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..observe.report import Report


def run_static(sched: Any, requests: Iterable[Any]) -> Report:
    """Submit ``requests`` (all at once) and serve them in static batches of up to
    ``sched.max_batch``: ``admit()`` only into an empty batch (until that batch is full or
    the queue is empty), then ``step(); filter()`` until every row has finished.
    ``sched.run()`` on the same requests is continuous batching (``admit()`` every step).

    Args:
        sched: an idle :class:`~workbench.engine.scheduler.Scheduler`.
        requests: :class:`~workbench.engine.request.Request` objects (or dicts).

    Returns:
        ``sched.report()``: the events and per-request metrics.

    Raises:
        ValueError: when ``sched`` is not idle, or as ``submit`` (a bad request field).
        RuntimeError: when ``admit()`` admits nobody into an empty batch (a KV budget
            that no queued request fits).
    """
    if not sched.idle:
        raise ValueError("run_static needs an idle scheduler (nothing queued, prefilling or running)")
    for request in requests:
        sched.submit(request)
    while not sched.idle:
        if not sched.snapshot().batch_size:  # the last batch has drained: form the next one
            while True:
                events = sched.admit()
                snap = sched.snapshot()
                if not snap.prefilling and (snap.batch_size >= sched.max_batch or not snap.queue):
                    break
                if not events:
                    raise RuntimeError(
                        f"admit() admitted nobody into an empty batch; queue {list(snap.queue)}"
                    )
        sched.step()
        sched.filter()
    return sched.report()
