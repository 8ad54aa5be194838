"""Reports: the event log and per-request metrics of a run, as pandas DataFrames.

Knows: events and metrics. Must not know: MLX, caches, the scheduler's internals.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from .events import Event, events_frame
from .metrics import percentiles, request_metrics, throughput_tok_per_s
from .speculation import acceptance
from .top_logprobs import top_logprobs_frame


class Report:
    """What a run produced, built when first read (so ``run()`` costs the same at event
    30,000 as at event 3).

    Args:
        events: the event log: a list of :class:`Event` (only its first ``n_events`` are
            this report's; later ones are ignored) or an events frame.
        requests, throughput_tok_per_s: given values for a hand-built report (else
            computed from ``events``).
        decode: ``decode(tokens, uid) -> text`` for the ``text`` column.
        n_events: how many events of a list belong to the report (default: all now).

    Attributes:
        events: one row per :class:`workbench.observe.events.Event` (columns ``EVENT_COLUMNS``).
        requests: one row per request (``workbench.observe.metrics.REQUEST_COLUMNS``: uid,
            prompt_tokens, generated_tokens, queue_s, ttft_s, tpot_s, e2e_s,
            finish_reason, text).
        throughput_tok_per_s: generated tokens per second over the run.
        top_logprobs: the top-k log-probs of every token of requests that asked
            (``Request(top_logprobs=k)``), one row per token and rank
            (:func:`workbench.observe.top_logprobs.top_logprobs_frame`).
        speculation: per request that produced a token, its draft tokens verified and
            accepted, acceptance rate and tokens per verify forward
            (:func:`workbench.observe.speculation.acceptance`; no drafts without
            ``Scheduler(speculative=...)``).
    """

    def __init__(
        self,
        events: pd.DataFrame | Sequence[Event],
        requests: pd.DataFrame | None = None,
        throughput_tok_per_s: float | None = None,
        decode: Callable[[list[int], int], str] | None = None,
        n_events: int | None = None,
    ):
        self._log = events
        self._n = len(events) if n_events is None else n_events
        self._decode = decode
        if requests is not None:
            self.__dict__["requests"] = requests
        if throughput_tok_per_s is not None:
            self.__dict__["throughput_tok_per_s"] = throughput_tok_per_s

    @functools.cached_property
    def events(self) -> pd.DataFrame:
        """The events frame (built on first read)."""
        if isinstance(self._log, pd.DataFrame):
            return self._log
        return events_frame(list(self._log[: self._n]))

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        """Per-request metrics (built on first read)."""
        return request_metrics(self.events, self._decode)

    @functools.cached_property
    def top_logprobs(self) -> pd.DataFrame:
        """Top-k log-probs per token and rank (built on first read)."""
        return top_logprobs_frame(self.events)

    @functools.cached_property
    def throughput_tok_per_s(self) -> float:
        """Generated tokens per second over the run."""
        return throughput_tok_per_s(self.events)

    @functools.cached_property
    def speculation(self) -> pd.DataFrame:
        """Per-request speculation readings (built on first read)."""
        return acceptance(self.events)

    def __repr__(self) -> str:
        return f"Report({self._n} events)"

    def to_csv(self, folder: str | Path) -> dict[str, Path]:
        """Write ``events.csv`` and ``requests.csv`` (no index column; pandas' ``to_csv``) into
        ``folder`` (created if missing). Returns ``{"events": path, "requests": path}``.
        Raises: OSError when the folder cannot be written."""
        return self._write(Path(folder), "csv", lambda frame, path: frame.to_csv(path, index=False))

    def to_parquet(self, folder: str | Path) -> dict[str, Path]:
        """Write ``events.parquet`` and ``requests.parquet`` (pandas' ``to_parquet`` through
        pyarrow, column types kept) into ``folder`` (created if missing). Returns
        ``{"events": path, "requests": path}``. Raises: ImportError naming the ``parquet`` extra
        when pyarrow is not installed (the base install leaves it out); OSError when it cannot be
        written."""
        if importlib.util.find_spec("pyarrow") is None:
            raise ImportError(
                'Report.to_parquet needs pyarrow: pip install -e ".[parquet]" (or pip install pyarrow); '
                "Report.to_csv needs nothing more"
            )
        return self._write(Path(folder), "parquet", lambda frame, path: frame.to_parquet(path, index=False))

    def _write(
        self, folder: Path, suffix: str, write: Callable[[pd.DataFrame, Path], None]
    ) -> dict[str, Path]:
        folder.mkdir(parents=True, exist_ok=True)
        paths = {name: folder / f"{name}.{suffix}" for name in ("events", "requests")}
        write(self.events, paths["events"])
        write(self.requests, paths["requests"])
        return paths

    def summary(self) -> str:
        """One line: requests, generated tokens, throughput (tok/s), TTFT and TPOT p50/p95 (ms,
        one decimal)."""
        r = self.requests
        ttft, tpot = percentiles(r.ttft_s), percentiles(r.tpot_s)
        return (
            f"{len(r)} requests, {int(r.generated_tokens.sum())} generated tokens, "
            f"throughput {self.throughput_tok_per_s:.1f} tok/s, "
            f"TTFT p50 {ttft['p50'] * 1e3:.1f} ms p95 {ttft['p95'] * 1e3:.1f} ms, "
            f"TPOT p50 {tpot['p50'] * 1e3:.1f} ms p95 {tpot['p95'] * 1e3:.1f} ms"
        )


def build_report(events: Sequence[Event], decode: Callable[[list[int], int], str] | None = None) -> Report:
    """A :class:`Report` of the events logged so far (later appends to ``events`` are not
    its); frames are built when first read (see ``request_metrics`` for ``decode``)."""
    return Report(events, decode=decode, n_events=len(events))
