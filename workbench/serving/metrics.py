"""``/metrics``: the served engine in Prometheus' text format, from its own events.

Knows: :class:`~workbench.observe.events.Event` kinds and fields, ``prometheus-client``.
Must not know: HTTP, OpenAI, MLX.

Each engine call's new events (``Scheduler.events`` past a cursor) update, with the
definitions of :mod:`workbench.observe.metrics` (seconds of the scheduler's clock):

- ``workbench_ttft_seconds`` (histogram): first ``token`` time − ``submit`` time, per
  request (queue included);
- ``workbench_itl_seconds`` (histogram): every gap between consecutive ``token`` events of a
  request (its per-request mean is TPOT);
- ``workbench_requests_running`` / ``_queued`` / ``_prefilling`` (gauges): the occupancy
  of :func:`workbench.observe.metrics.occupancy`, counted per uid: ``submit`` and ``preempt``
  queue a uid, ``admit`` makes it prefill, ``join`` run, ``evict`` (or ``finish`` while
  queued) ends it;
- ``workbench_preemptions_total``, ``workbench_generated_tokens_total``,
  ``workbench_requests_finished_total{finish_reason}`` (counters);
- ``workbench_kv_bytes`` (gauge): the running batch's cache bytes in the engine's latest
  recorded snapshot (``Snapshot.kv_bytes``; ``Scheduler.snapshot()`` when it records none).

Prometheus' histograms keep only bucket counts and a sum, so a quantile read from them is
the bucket's bound, not the sample's; ``count`` and ``sum`` are exact.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Seconds: from a tiny model's CPU step (about a millisecond) to a loaded server's queue wait.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_QUEUED, _PREFILLING, _RUNNING = "queued", "prefilling", "running"


class EngineMetrics:
    """Prometheus collectors fed from a scheduler's event log, in its own registry.

    :meth:`observe` is called by the engine thread after each engine call; :meth:`text`
    by any thread (``prometheus-client`` collectors are thread-safe).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "workbench_ttft_seconds", "Time to first token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "workbench_itl_seconds", "Inter-token latency", buckets=LATENCY_BUCKETS, registry=r
        )
        self.running = Gauge("workbench_requests_running", "Rows in the running batch", registry=r)
        self.queued = Gauge("workbench_requests_queued", "Requests waiting for admission", registry=r)
        self.prefilling = Gauge("workbench_requests_prefilling", "Requests being prefilled", registry=r)
        self.kv_bytes = Gauge("workbench_kv_bytes", "Bytes of the running batch's KV caches", registry=r)
        self.preemptions = Counter("workbench_preemptions", "Rows preempted", registry=r)
        self.tokens = Counter("workbench_generated_tokens", "Generated tokens", registry=r)
        self.finished = Counter(
            "workbench_requests_finished", "Finished requests", ["finish_reason"], registry=r
        )
        self._cursor = 0
        self._submitted: dict[int, float] = {}  # uid -> submit time, until its first token
        self._last_token: dict[int, float] = {}  # uid -> its latest token's time
        self._where: dict[int, str] = {}  # uid -> queued / prefilling / running
        self._lock = threading.Lock()

    def observe(self, sched: Any) -> None:
        """Count ``sched``'s events since the last call and read its latest KV bytes."""
        with self._lock:
            events = sched.events
            if len(events) < self._cursor:  # a rolled-back call took events back: count from there
                self._cursor = len(events)
            for e in events[self._cursor :]:
                self._event(e)
            self._cursor = len(events)
            counts = {_QUEUED: 0, _PREFILLING: 0, _RUNNING: 0}
            for where in self._where.values():
                counts[where] += 1
            self.queued.set(counts[_QUEUED])
            self.prefilling.set(counts[_PREFILLING])
            self.running.set(counts[_RUNNING])
            history = sched.history
            snap = history[-1] if len(history) else None
            self.kv_bytes.set(snap.kv_bytes if snap is not None else sched.snapshot().kv_bytes)

    def _event(self, e: Any) -> None:
        if e.kind == "submit":
            self._submitted[e.uid] = e.time_s
            self._where[e.uid] = _QUEUED
        elif e.kind == "preempt":
            self.preemptions.inc()
            self._where[e.uid] = _QUEUED
        elif e.kind == "admit":
            self._where[e.uid] = _PREFILLING
        elif e.kind == "join":
            self._where[e.uid] = _RUNNING
        elif e.kind == "token":
            self.tokens.inc()
            if e.uid in self._submitted:
                self.ttft.observe(e.time_s - self._submitted.pop(e.uid))
            elif e.uid in self._last_token:
                self.itl.observe(e.time_s - self._last_token[e.uid])
            self._last_token[e.uid] = e.time_s
        elif e.kind == "finish":
            self.finished.labels(e.finish_reason).inc()
            self._submitted.pop(e.uid, None)
            self._last_token.pop(e.uid, None)
            if self._where.get(e.uid) == _QUEUED:  # aborted in the queue: it never gets an evict
                del self._where[e.uid]
        elif e.kind == "evict":
            self._where.pop(e.uid, None)

    def text(self) -> bytes:
        """The registry in Prometheus' text exposition format (``text/plain; version=0.0.4``)."""
        return generate_latest(self.registry)
