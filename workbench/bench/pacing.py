"""The latency frontier: TTFT against inter-token latency for the workbench with pacing
(a per-iteration time budget, :mod:`workbench.engine.levers.pacing`) at several targets, as
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

And, once per run of :func:`frontier_runs`, the *floors* (:mod:`workbench.bench.floors`):
each request's TTFT with its prompt alone in an idle engine, and one decode step at
``max_batch`` rows, measured on the same clock as the engines. :func:`frontier_summary`
reports their p95 and :func:`versus` / :func:`floor_verdicts` their ratio to mlx-lm's
p95: a goal below that ratio is out of reach of any schedule on that machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pandas as pd

from ..engine.admission import ShortestPromptFirst
from ..engine.levers.pacing import Pacing
from ..observe.events import events_frame
from ..observe.metrics import SLO, meets_slo, request_metrics, token_gaps
from ..sim.clocks import VirtualClock
from ..sim.costmodel import CostedModel, CostModel
from .engines import Arrival, MlxLmEngine, WorkbenchEngine, drive
from .figures import target_of
from .floors import measure_floors
from .scenarios import MLX_LM, WORKBENCH, alternating

FIXED = WORKBENCH  # as shipped: one prefill_step_size chunk per iteration
SUMMARY_COLUMNS = [
    "engine",
    "target",
    "ttft_p50_s",
    "ttft_p95_s",
    "itl_p50_s",
    "itl_p95_s",
    "itl_p99_s",
    "itl_max_s",
    "e2e_p95_s",
    "goodput_req_per_s",
    "throughput_tok_per_s",
    "requests",
    "rounds",
    "ttft_floor_p95_s",
    "itl_floor_p95_s",
]
# The latency quantiles (seconds) the lab scripts print of a summary, each engine's and against mlx-lm's.
LATENCY_COLUMNS = ["ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s", "itl_max_s", "e2e_p95_s"]
FLOOR_OF = {
    "ttft_floor_p95_s": "ttft_p95_s",
    "itl_floor_p95_s": "itl_p95_s",
}  # a floor column -> what it bounds
GOALS = {"ttft": 0.6, "itl": 1.0}  # issue 17: p95 at most this x mlx-lm's, both at once


def paced_name(target_steps: float) -> str:
    """The engine name of a paced run at ``target_steps`` x the decode step (what
    :func:`workbench.bench.figures.target_of` reads back)."""
    return f"workbench, paced {target_steps:g}x step"


def frontier_factories(
    model: Any,
    tokenizer: Any,
    max_batch: int,
    prefill_step_size: int,
    targets_steps: Sequence[float],
    clock: Callable[[], float] = time.perf_counter,
    max_wait_s: float | None = None,
    cost_model: CostModel | None = None,
    history_size: int = 64,
) -> dict[str, Callable[[], Any]]:
    """Engine factories by name: mlx-lm (``MLX_LM``), the workbench as shipped
    (``FIXED``), and the workbench paced at each of ``targets_steps`` (multiples of its
    decode step, :func:`paced_name`) admitting shortest prompt first bounded by
    ``max_wait_s`` seconds of waiting (``None``: FCFS), with an optional prior
    ``cost_model``.

    Args:
        model, tokenizer: the model under test (maybe a
            :class:`~workbench.sim.costmodel.CostedModel`) and a tokenizer.
        max_batch: rows decoding at once; prefill_step_size: the longest chunk (tokens
            per row), for every engine.
        clock: ``() -> seconds`` stamping the events. history_size: the workbench's
            snapshots kept (``0``: none).

    Returns:
        ``{name: () -> engine}``; each call builds a fresh engine (``submit``,
        ``iterate``, ``idle``, ``events``, ``close``: :mod:`workbench.bench.engines`)."""
    policy = "fcfs" if max_wait_s is None else ShortestPromptFirst(max_wait_s=max_wait_s)
    out: dict[str, Callable[[], Any]] = {
        MLX_LM: lambda: MlxLmEngine(model, max_batch, prefill_step_size, clock=clock),
        FIXED: lambda: WorkbenchEngine(
            model, tokenizer, max_batch, prefill_step_size, clock=clock, history_size=history_size
        ),
    }
    for t in targets_steps:
        pacing = Pacing(itl_target_steps=t, cost_model=cost_model)
        out[paced_name(t)] = (
            lambda p: (
                lambda: WorkbenchEngine(
                    model,
                    tokenizer,
                    max_batch,
                    prefill_step_size,
                    clock=clock,
                    history_size=history_size,
                    pacing=p,
                    policy=policy,
                )
            )
        )(pacing)
    return out


def drive_virtual(engine: Any, arrivals: Sequence[Arrival], clock: VirtualClock, costed: CostedModel) -> None:
    """Run ``engine`` (built on ``costed`` and ``clock``) through ``arrivals`` on the
    virtual clock until every arrival is submitted and the engine is idle: each
    iteration's forwards advance it (``costed``'s cost per ``[B, L]`` forward), idle time
    is jumped to the next arrival, and each submit is stamped at its arrival time
    (``at_s`` seconds after the start). ``at_iteration`` is not used here."""
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


def frontier_runs(
    model: Any,
    tokenizer: Any,
    arrivals: Sequence[Arrival],
    max_batch: int,
    prefill_step_size: int,
    targets_steps: Sequence[float],
    rounds: int,
    mode: str = "measured",
    cost_model: CostModel | None = None,
    max_wait_s: float | None = None,
    echo: Callable[[str], None] = print,
    warmup: bool = True,
    floor_repeats: int = 2,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every engine of :func:`frontier_factories` through ``arrivals``, ``rounds`` times,
    alternating (A B C, C B A, ...). ``mode`` is ``measured`` or ``cost`` (then
    ``cost_model`` is required; it charges the forwards and is the paced engines' prior).
    ``max_batch`` (rows), ``prefill_step_size`` (tokens per row), ``targets_steps`` and
    ``max_wait_s`` (seconds) are :func:`frontier_factories`'; ``echo`` gets one progress
    line per run and one for the floors.
    In ``measured`` mode with ``warmup`` every engine first runs the arrivals once,
    discarded: the first run of a shape pays MLX's kernel compilation (seconds on CUDA) and
    buffer allocation, which would otherwise land on whichever engine runs first.

    Before the rounds, the floors (:func:`workbench.bench.floors.measure_floors`): every
    distinct prompt length alone, and ``max_batch`` prompts decoding together, in mlx-lm
    and the fixed-chunk workbench, ``floor_repeats`` times each in ``measured`` mode (the
    lowest kept), once on the cost clock (deterministic); ``floor_repeats=0`` skips them
    (the floor columns are NaN).

    Returns ``(requests, gaps)``: per request the
    :data:`~workbench.observe.metrics.REQUEST_COLUMNS` plus ``engine, round,
    makespan_s`` (its run's first submit to last token, seconds) and ``ttft_floor_s`` (its
    TTFT floor, seconds), and per token gap ``engine, round, uid, gap_s`` and
    ``itl_floor_s`` (the decode step at ``max_batch`` rows, seconds). Rows are in submit
    order, the arrivals' order.

    Raises:
        ValueError: for an unknown mode, or ``cost`` without a cost model, or
            ``floor_repeats < 0``."""
    if mode not in ("measured", "cost") or (mode == "cost" and cost_model is None):
        raise ValueError(f"mode must be 'measured' or 'cost' (with a cost_model), got {mode!r}")
    if not isinstance(floor_repeats, int) or floor_repeats < 0:
        raise ValueError(f"floor_repeats must be an int >= 0, got {floor_repeats!r}")
    requests, gaps = [], []
    names = list(frontier_factories(model, tokenizer, max_batch, prefill_step_size, targets_steps))

    run = _FrontierRun(
        model, tokenizer, max_batch, prefill_step_size, targets_steps, mode, cost_model, max_wait_s
    )
    if warmup and mode == "measured":
        for name in names:
            run(name, arrivals)
    ttft_floor_s, itl_floor_s = [float("nan")] * len(arrivals), float("nan")
    if floor_repeats:
        floors = measure_floors(
            run, [MLX_LM, FIXED], arrivals, max_batch, 1 if mode == "cost" else floor_repeats
        )
        ttft_floor_s, itl_floor_s = floors.ttft_s(arrivals), floors.itl_s
        echo(f"  {floors.text(arrivals)}")
    for rnd, name in alternating(names, rounds):
        events = run(name, arrivals)
        r = request_metrics(events)
        g = token_gaps(events)[["uid", "gap_s"]]
        makespan_s = (
            events[events.kind == "token"].time_s.max() - events[events.kind == "submit"].time_s.min()
        )
        requests.append(r.assign(engine=name, round=rnd, makespan_s=makespan_s, ttft_floor_s=ttft_floor_s))
        gaps.append(g.assign(engine=name, round=rnd, itl_floor_s=itl_floor_s))
        echo(
            f"  {name:<32} round {rnd}: TTFT p95 {r.ttft_s.quantile(0.95) * 1e3:8.1f} ms, "
            f"ITL p95 {g.gap_s.quantile(0.95) * 1e3:8.1f} ms"
        )
    return pd.concat(requests, ignore_index=True), pd.concat(gaps, ignore_index=True)


@dataclass(frozen=True)
class _FrontierRun:
    """``run(name, arrivals)``: engine ``name`` of :func:`frontier_factories` (the settings
    of :func:`frontier_runs`), fresh, through ``arrivals``, on the wall clock in
    ``measured`` mode or on a virtual clock charged by ``cost_model`` in ``cost`` mode (no
    snapshots kept); returns its events frame."""

    model: Any
    tokenizer: Any
    max_batch: int
    prefill_step_size: int
    targets_steps: Sequence[float]
    mode: str
    cost_model: CostModel | None
    max_wait_s: float | None

    def __call__(self, name: str, arrivals: Sequence[Arrival]) -> pd.DataFrame:
        if self.mode == "measured":
            engine = self._engine(name, self.model)
            go = partial(drive, engine, arrivals)
        else:
            clock = VirtualClock()
            costed = CostedModel(self.model, clock, self.cost_model)
            engine = self._engine(name, costed, clock=clock, history_size=0)
            go = partial(drive_virtual, engine, arrivals, clock, costed)
        try:
            go()
            return events_frame(engine.events)
        finally:
            engine.close()

    def _engine(self, name: str, model: Any, **clocking: Any) -> Any:
        factories = frontier_factories(
            model,
            self.tokenizer,
            self.max_batch,
            self.prefill_step_size,
            self.targets_steps,
            max_wait_s=self.max_wait_s,
            cost_model=self.cost_model,
            **clocking,
        )
        return factories[name]()


def frontier_summary(requests: pd.DataFrame, gaps: pd.DataFrame, slo: SLO) -> pd.DataFrame:
    """One row per engine (``SUMMARY_COLUMNS``), every round pooled: quantiles over all
    requests / gaps (seconds); goodput (requests/s) and throughput (tokens/s) summed over
    rounds and divided by the summed makespans (first submit to last finish of each
    round). ``ttft_floor_p95_s`` is the p95 of the requests' TTFT floors and
    ``itl_floor_p95_s`` that of the gaps' (the decode step at ``max_batch`` rows): the
    lowest p95 any schedule could reach; NaN for frames without floor columns (runs
    stored before the floors were measured).

    Args:
        requests, gaps: as :func:`frontier_runs` returns them (or read back from CSV).
        slo: the goodput's TTFT and TPOT limits.
    """
    rows = []
    for name, r in requests.groupby("engine", sort=False):
        g = gaps[gaps.engine == name]
        makespan = r.groupby("round").makespan_s.first().sum()
        good = int(meets_slo(r, slo).sum())
        rows.append(
            {
                "engine": name,
                "target": target_of(name),
                "ttft_p50_s": r.ttft_s.median(),
                "ttft_p95_s": r.ttft_s.quantile(0.95),
                "itl_p50_s": g.gap_s.median(),
                "itl_p95_s": g.gap_s.quantile(0.95),
                "itl_p99_s": g.gap_s.quantile(0.99),
                "itl_max_s": g.gap_s.max(),
                "e2e_p95_s": r.e2e_s.quantile(0.95),
                "goodput_req_per_s": good / makespan,
                "throughput_tok_per_s": r.generated_tokens.sum() / makespan,
                "requests": len(r),
                "rounds": r["round"].nunique(),
                "ttft_floor_p95_s": _p95(r, "ttft_floor_s"),
                "itl_floor_p95_s": _p95(g, "itl_floor_s"),
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _p95(frame: pd.DataFrame, column: str) -> float:
    """The column's p95, NaN when the frame has no such column (or only empty cells)."""
    if column not in frame:
        return float("nan")
    return pd.to_numeric(frame[column], errors="coerce").quantile(0.95)


def versus(summary: pd.DataFrame, reference: str = MLX_LM) -> pd.DataFrame:
    """Each measure divided by ``reference``'s (lower is better for latencies, higher for
    goodput and throughput); a floor column is divided by the reference's *measured* p95
    it bounds (``ttft_floor_p95_s`` by its ``ttft_p95_s``), so it reads as the lowest
    ratio any schedule could reach, against issue 17's goals (0.6 and 1.0).

    Raises:
        KeyError: when ``reference`` is not an engine of ``summary``."""
    t = summary.set_index("engine")
    cols = [c for c in SUMMARY_COLUMNS if (c.endswith("_s") or c.endswith("_per_s")) and c not in FLOOR_OF]
    out = t[cols] / t.loc[reference, cols]
    for floor, bounded in FLOOR_OF.items():
        out[floor] = t[floor] / t.loc[reference, bounded]
    return out.reset_index()


def floor_verdicts(summary: pd.DataFrame, reference: str = MLX_LM) -> pd.DataFrame:
    """Whether issue 17's goals (:data:`GOALS`) are within reach of any schedule: per
    measure (``ttft``, ``itl``), ``floor_p95_s`` (the floors' p95, seconds),
    ``reference_p95_s`` (``reference``'s measured p95, seconds), ``floor_ratio`` (floor /
    reference), ``goal_ratio`` and ``reachable`` (``floor_ratio <= goal_ratio``; ``False``
    means no schedule meets the goal on that machine and those arrivals; ``True`` only that
    the floor does not rule it out). NaN / ``False`` without floors.

    Raises:
        KeyError: when ``reference`` is not an engine of ``summary``."""
    row = summary.set_index("engine").loc[reference]
    out = []
    for measure, goal in GOALS.items():
        floor_s, ref_s = row[f"{measure}_floor_p95_s"], row[f"{measure}_p95_s"]
        out.append(
            {
                "measure": measure,
                "floor_p95_s": floor_s,
                "reference_p95_s": ref_s,
                "floor_ratio": floor_s / ref_s,
                "goal_ratio": goal,
                "reachable": bool(floor_s / ref_s <= goal),
            }
        )
    return pd.DataFrame(out)
