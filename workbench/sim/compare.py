"""Compare scheduler configurations on one workload: a table of latency percentiles,
throughput, goodput, KV use and padding waste, one row per configuration.

Knows: :mod:`workbench.sim.replay` (runs), :mod:`workbench.observe.metrics` (every number is
computed there, from events, or from the replay's per-step samples for KV and padding).
Must not know: the scheduler's internals, views.

Columns of :func:`summarize` / :func:`compare` (``COMPARE_COLUMNS``; seconds unless
named otherwise):

=======================  ==============================================================
``config``               the configuration's name
``requests``             requests submitted; ``finished``: of them, finished
``ttft_p50_s`` ...       TTFT, TPOT and E2E at p50, p95 and p99 (over finished values)
``throughput_tok_per_s`` generated tokens / span (first submit to last token)
``goodput_req_per_s``    requests meeting the SLO / span (:class:`~workbench.observe.metrics.SLO`)
``slo_attainment``       share of requests meeting the SLO (0..1)
``peak_kv_bytes``        most bytes the running batch's caches held at a decode step
``peak_kv_tokens``       most KV slots (rows x KV width) at a decode step: model-free
``paged_peak_bytes_b16`` most bytes a paged cache of 16-token blocks would hold for the same
                         rows at a step (:mod:`workbench.observe.paged`; NaN without layouts)
``padding_tax``          share of the padded batch's bytes, summed over steps, that those
                         16-token blocks would not hold (padding, growth step, free slots
                         minus the blocks' own last-block waste)
``padding_waste``        share of KV slots, over all decode steps, that held left padding
``mean_batch_size``      rows per decode step, averaged over steps that had rows
``makespan_s``           first submit to last token (the span)
=======================  ==============================================================
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from ..observe.metrics import SLO, goodput_req_per_s, meets_slo, padding_waste_overall, percentiles, span_s
from ..observe.paged import padding_tax
from ..runtime.modelref import ModelRef
from ..workloads.workload import Workload
from .costmodel import CostModel
from .replay import Replay, replay

LATENCIES = ("ttft", "tpot", "e2e")
QUANTILES = (50, 95, 99)
COMPARE_COLUMNS = (
    ["config", "requests", "finished"]
    + [f"{m}_p{q}_s" for m in LATENCIES for q in QUANTILES]
    + [
        "throughput_tok_per_s",
        "goodput_req_per_s",
        "slo_attainment",
        "peak_kv_bytes",
        "peak_kv_tokens",
        "paged_peak_bytes_b16",
        "padding_tax",
        "padding_waste",
        "mean_batch_size",
        "makespan_s",
    ]
)


def summary_row(run: Replay, slo: SLO = SLO()) -> dict[str, Any]:
    """One ``COMPARE_COLUMNS`` row (a dict) for a replay."""
    req, ev, s = run.report.requests, run.report.events, run.samples
    span = span_s(ev)
    row: dict[str, Any] = {
        "config": run.name,
        "requests": len(req),
        "finished": int(req.finish_reason.isin(["stop", "length"]).sum()),
    }
    for m in LATENCIES:
        for q, v in percentiles(req[f"{m}_s"], QUANTILES).items():
            row[f"{m}_{q}_s"] = v
    decoding = s[s.batch_size > 0]
    row.update(
        {
            "throughput_tok_per_s": run.report.throughput_tok_per_s,
            "goodput_req_per_s": goodput_req_per_s(req, span, slo),
            "slo_attainment": float(meets_slo(req, slo).mean()) if len(req) else math.nan,
            "peak_kv_bytes": int(s.kv_bytes.max()) if len(s) else 0,
            "peak_kv_tokens": int(s.kv_slots_tokens.max()) if len(s) else 0,
            "paged_peak_bytes_b16": int(run.layouts.paged_bytes_b16.max()) if len(run.layouts) else math.nan,
            "padding_tax": padding_tax(run.layouts, 16) if len(run.layouts) else math.nan,
            "padding_waste": padding_waste_overall(s.padding_tokens, s.kv_slots_tokens),
            "mean_batch_size": float(decoding.batch_size.mean()) if len(decoding) else math.nan,
            "makespan_s": span,
        }
    )
    return row


def summarize(runs: Mapping[str, Replay] | Iterable[Replay], slo: SLO = SLO()) -> pd.DataFrame:
    """The comparison table: one ``COMPARE_COLUMNS`` row per replay, in the given order."""
    runs = runs.values() if isinstance(runs, Mapping) else runs
    return pd.DataFrame([summary_row(r, slo) for r in runs], columns=COMPARE_COLUMNS)


def model_pair(model: ModelRef | tuple[Any, Any]) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a :class:`ModelRef` or a pair itself."""
    return model.load() if isinstance(model, ModelRef) else model


def replay_many(
    workload: Workload,
    configs: Mapping[str, dict[str, Any]],
    model: ModelRef | tuple[Any, Any] = ModelRef(),
    *,
    mode: str | None = None,
    cost_model: CostModel | None = None,
    progress: bool = False,
) -> dict[str, Replay]:
    """Replay ``workload`` once per named config, in this process (see
    :func:`workbench.sim.replay.replay` for ``mode`` and ``cost_model``; :mod:`workbench.sim.sweep`
    for many configs in parallel).

    Returns:
        ``{name: Replay}`` in the order of ``configs``.
    """
    pair = model_pair(model)
    return {
        name: replay(workload, *pair, cfg, mode=mode, cost_model=cost_model, name=name, progress=progress)
        for name, cfg in tqdm(configs.items(), desc="configs", disable=not progress, leave=False)
    }


def compare(
    workload: Workload,
    configs: Mapping[str, dict[str, Any]],
    model: ModelRef | tuple[Any, Any] = ModelRef(),
    *,
    slo: SLO = SLO(),
    mode: str | None = None,
    cost_model: CostModel | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Run the same workload under each config and return the comparison table
    (``COMPARE_COLUMNS``, one row per config). ``summarize(replay_many(...), slo)`` gives
    the same table and keeps the runs for figures (:mod:`workbench.views.replay`)."""
    return summarize(
        replay_many(workload, configs, model, mode=mode, cost_model=cost_model, progress=progress), slo
    )


def comparison_text(table: pd.DataFrame) -> str:
    """Deterministic text of a comparison table, one column per config and one line per
    measure: latencies in ms (one decimal), rates with two decimals, shares in percent."""
    t = table.set_index("config")
    ms = lambda v: f"{v * 1e3:.1f}"
    lines: dict[str, pd.Series] = {"finished": t.finished.astype(str) + "/" + t.requests.astype(str)}
    for m in LATENCIES:
        for q in QUANTILES:
            lines[f"{m.upper()} p{q} (ms)"] = t[f"{m}_p{q}_s"].map(ms)
    lines.update(
        {
            "throughput (tok/s)": t.throughput_tok_per_s.map(lambda v: f"{v:.2f}"),
            "goodput (req/s)": t.goodput_req_per_s.map(lambda v: f"{v:.2f}"),
            "SLO attainment": t.slo_attainment.map(lambda v: f"{v:.0%}"),
            "peak KV (slots)": t.peak_kv_tokens.astype(str),
            "padding waste": t.padding_waste.map(lambda v: f"{v:.1%}"),
            "mean batch size": t.mean_batch_size.map(lambda v: f"{v:.2f}"),
            "makespan (s)": t.makespan_s.map(lambda v: f"{v:.2f}"),
        }
    )
    return pd.DataFrame(lines).T.to_string()
