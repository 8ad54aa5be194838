"""Reports: the event log and per-request metrics of a run, as pandas DataFrames.

Knows: events and metrics. Must not know: MLX, caches, the scheduler's internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from .events import Event, events_frame
from .metrics import percentiles, request_metrics, throughput_tok_per_s


@dataclass(frozen=True)
class Report:
    """What a run produced.

    Attributes:
        events: one row per :class:`workbench.observe.events.Event` (columns ``EVENT_COLUMNS``).
        requests: one row per request (``workbench.observe.metrics.REQUEST_COLUMNS``: uid,
            prompt_tokens, generated_tokens, queue_s, ttft_s, tpot_s, e2e_s,
            finish_reason, text).
        throughput_tok_per_s: generated tokens per second over the run.
    """

    events: pd.DataFrame
    requests: pd.DataFrame
    throughput_tok_per_s: float

    def summary(self) -> str:
        """One line: requests, generated tokens, throughput, TTFT and TPOT p50/p95."""
        r = self.requests
        ttft, tpot = percentiles(r.ttft_s), percentiles(r.tpot_s)
        return (
            f"{len(r)} requests, {int(r.generated_tokens.sum())} generated tokens, "
            f"throughput {self.throughput_tok_per_s:.1f} tok/s, "
            f"TTFT p50 {ttft['p50'] * 1e3:.1f} ms p95 {ttft['p95'] * 1e3:.1f} ms, "
            f"TPOT p50 {tpot['p50'] * 1e3:.2f} ms p95 {tpot['p95'] * 1e3:.2f} ms"
        )


def build_report(events: list[Event], decode: Callable[[list[int], int], str] | None = None) -> Report:
    """Assemble a :class:`Report` from an event list (see ``request_metrics`` for ``decode``)."""
    ev = events_frame(events)
    return Report(events=ev, requests=request_metrics(ev, decode), throughput_tok_per_s=throughput_tok_per_s(ev))
