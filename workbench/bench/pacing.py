"""The latency frontier: TTFT against inter-token latency for the workbench with pacing
(a per-iteration time budget, :mod:`workbench.engine.pacing`) at several targets, as
shipped (one fixed chunk per iteration), and mlx-lm's ``BatchGenerator``, on the same
arrivals, alternating.

Knows: the two engines behind :mod:`workbench.bench.engines`, the event-log metrics
(:mod:`workbench.observe.metrics`), the virtual clock and cost model of
:mod:`workbench.sim`. Must not know: how results are printed or drawn.

Two clocks:

- ``measured``: real time (``time.perf_counter``); the driver sleeps until arrivals are
  due (:func:`workbench.bench.engines.drive`). What ``workbench bench`` reports.
- ``cost``: a :class:`~workbench.sim.clocks.VirtualClock` advanced by a
  :class:`~workbench.sim.costmodel.CostModel` for every forward either engine runs (the
  model is wrapped in :class:`~workbench.sim.costmodel.CostedModel`, charging during each
  iteration), idle gaps jumped. Deterministic: the same table on every run, for
  notebooks and tests; it compares the *scheduling* of the two engines under the same
  cost of each forward, not their Python overheads.

Measures per engine (seconds): TTFT p50/p95 (first token - submit), ITL p50/p95 (gaps
between a request's consecutive tokens), E2E p95 (last token - submit); goodput
(requests per second of makespan that met the SLO: TTFT and mean TPOT both within their
limits, :func:`workbench.observe.metrics.meets_slo`); and throughput (generated tokens /
makespan).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import pandas as pd

from ..engine.pacing import Pacing
from ..engine.policies import ShortestPromptFirst
from ..observe.events import events_frame
from ..observe.metrics import SLO, meets_slo, request_metrics, token_gaps
from ..sim.clocks import VirtualClock
from ..sim.costmodel import CostedModel, CostModel
from .engines import Arrival, MlxLmEngine, WorkbenchEngine, drive
from .figures import target_of
from .scenarios import MLX_LM, WORKBENCH, alternating

FIXED = WORKBENCH  # as shipped: one prefill_step_size chunk per iteration
SUMMARY_COLUMNS = ["engine", "target", "ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s", "itl_p99_s", "itl_max_s",
                   "e2e_p95_s",
                   "goodput_req_per_s", "throughput_tok_per_s", "requests", "rounds"]


def paced_name(target_steps: float) -> str:
    """The engine name of a paced run at ``target_steps`` x the decode step."""
    return f"workbench, paced {target_steps:g}x step"


def frontier_factories(model: Any, tokenizer: Any, max_batch: int, prefill_step_size: int,
                       targets_steps: Sequence[float], clock: Callable[[], float] = time.perf_counter,
                       max_wait_s: float | None = None, cost_model: CostModel | None = None,
                       history_size: int = 64) -> dict[str, Callable[[], Any]]:
    """Engine factories: mlx-lm, the workbench as shipped (``FIXED``), and the workbench
    paced at each target (a multiple of its decode step) with shortest-prompt-first
    bounded by ``max_wait_s`` (``None``: FCFS) and an optional prior ``cost_model``."""
    policy = "fcfs" if max_wait_s is None else ShortestPromptFirst(max_wait_s=max_wait_s)
    out: dict[str, Callable[[], Any]] = {
        MLX_LM: lambda: MlxLmEngine(model, max_batch, prefill_step_size, clock=clock),
        FIXED: lambda: WorkbenchEngine(model, tokenizer, max_batch, prefill_step_size, clock=clock,
                                       history_size=history_size)}
    for t in targets_steps:
        pacing = Pacing(itl_target_steps=t, cost_model=cost_model)
        out[paced_name(t)] = (lambda p: lambda: WorkbenchEngine(
            model, tokenizer, max_batch, prefill_step_size, clock=clock, history_size=history_size,
            pacing=p, policy=policy))(pacing)
    return out


def drive_virtual(engine: Any, arrivals: Sequence[Arrival], clock: VirtualClock, costed: CostedModel) -> None:
    """Run ``engine`` (built on ``costed`` and ``clock``) through ``arrivals`` on the
    virtual clock: each iteration's forwards advance it; idle time is jumped."""
    start_s, done = clock(), 0
    while done < len(arrivals) or not engine.idle:
        if engine.idle:
            clock.jump_to(start_s + arrivals[done].at_s)
        while done < len(arrivals) and start_s + arrivals[done].at_s <= clock():
            with clock.pinned(start_s + arrivals[done].at_s):
                engine.submit(arrivals[done].prompt, arrivals[done].max_tokens)
            done += 1
        with costed.charging():
            engine.iterate()


def frontier_runs(model: Any, tokenizer: Any, arrivals: Sequence[Arrival], max_batch: int, prefill_step_size: int,
                  targets_steps: Sequence[float], rounds: int, mode: str = "measured",
                  cost_model: CostModel | None = None, max_wait_s: float | None = None,
                  echo: Callable[[str], None] = print, warmup: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every engine of :func:`frontier_factories` through ``arrivals``, ``rounds`` times,
    alternating (A B C, C B A, ...). ``mode`` is ``measured`` or ``cost`` (then
    ``cost_model`` is required; it charges the forwards and is the paced engines' prior).
    In ``measured`` mode with ``warmup`` every engine first runs the arrivals once,
    discarded: the first run of a shape pays MLX's kernel compilation (seconds on CUDA) and
    buffer allocation, which would otherwise land on whichever engine runs first.

    Returns ``(requests, gaps)``: per request the
    :data:`~workbench.observe.metrics.REQUEST_COLUMNS` plus ``engine, round,
    makespan_s`` (its run's first submit to last token), and per token gap ``engine,
    round, uid, gap_s``.

    Raises:
        ValueError: for an unknown mode, or ``cost`` without a cost model."""
    if mode not in ("measured", "cost") or (mode == "cost" and cost_model is None):
        raise ValueError(f"mode must be 'measured' or 'cost' (with a cost_model), got {mode!r}")
    requests, gaps = [], []
    names = list(frontier_factories(model, tokenizer, max_batch, prefill_step_size, targets_steps))
    if warmup and mode == "measured":
        for name in names:
            _run(name, model, tokenizer, arrivals, max_batch, prefill_step_size, targets_steps, mode, cost_model,
                 max_wait_s)
    for rnd, name in alternating(names, rounds):
        events = _run(name, model, tokenizer, arrivals, max_batch, prefill_step_size, targets_steps, mode,
                      cost_model, max_wait_s)
        r = request_metrics(events)
        g = token_gaps(events)[["uid", "gap_s"]]
        makespan_s = events[events.kind == "token"].time_s.max() - events[events.kind == "submit"].time_s.min()
        requests.append(r.assign(engine=name, round=rnd, makespan_s=makespan_s))
        gaps.append(g.assign(engine=name, round=rnd))
        echo(f"  {name:<32} round {rnd}: TTFT p95 {r.ttft_s.quantile(0.95) * 1e3:8.1f} ms, "
             f"ITL p95 {g.gap_s.quantile(0.95) * 1e3:8.1f} ms")
    return pd.concat(requests, ignore_index=True), pd.concat(gaps, ignore_index=True)


def _run(name, model, tokenizer, arrivals, max_batch, prefill_step_size, targets_steps, mode, cost_model,
         max_wait_s) -> pd.DataFrame:
    """One engine, fresh, through the arrivals: its events frame."""
    if mode == "measured":
        engine = frontier_factories(model, tokenizer, max_batch, prefill_step_size, targets_steps,
                                    max_wait_s=max_wait_s, cost_model=cost_model)[name]()
        try:
            drive(engine, arrivals)
            return events_frame(engine.events)
        finally:
            engine.close()
    clock = VirtualClock()
    costed = CostedModel(model, clock, cost_model)
    engine = frontier_factories(costed, tokenizer, max_batch, prefill_step_size, targets_steps, clock=clock,
                                max_wait_s=max_wait_s, cost_model=cost_model, history_size=0)[name]()
    try:
        drive_virtual(engine, arrivals, clock, costed)
        return events_frame(engine.events)
    finally:
        engine.close()


def frontier_summary(requests: pd.DataFrame, gaps: pd.DataFrame, slo: SLO) -> pd.DataFrame:
    """One row per engine (``SUMMARY_COLUMNS``), every round pooled: quantiles over all
    requests / gaps; goodput and throughput summed over rounds and divided by the summed
    makespans (first submit to last finish of each round)."""
    rows = []
    for name, r in requests.groupby("engine", sort=False):
        g = gaps[gaps.engine == name]
        makespan = r.groupby("round").makespan_s.first().sum()
        good = int(meets_slo(r, slo).sum())
        rows.append({"engine": name, "target": target_of(name), "ttft_p50_s": r.ttft_s.median(),
                     "ttft_p95_s": r.ttft_s.quantile(0.95), "itl_p50_s": g.gap_s.median(),
                     "itl_p95_s": g.gap_s.quantile(0.95), "itl_p99_s": g.gap_s.quantile(0.99),
                     "itl_max_s": g.gap_s.max(), "e2e_p95_s": r.e2e_s.quantile(0.95),
                     "goodput_req_per_s": good / makespan, "throughput_tok_per_s": r.generated_tokens.sum() / makespan,
                     "requests": len(r), "rounds": r["round"].nunique()})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def versus(summary: pd.DataFrame, reference: str = MLX_LM) -> pd.DataFrame:
    """Each measure divided by ``reference``'s (lower is better for latencies, higher for
    goodput and throughput)."""
    t = summary.set_index("engine")
    cols = [c for c in SUMMARY_COLUMNS if c.endswith("_s") or c.endswith("_per_s")]
    return (t[cols] / t.loc[reference, cols]).reset_index()
