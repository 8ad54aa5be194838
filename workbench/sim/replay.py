"""Replay a :class:`~workbench.workloads.workload.Workload` through the real Scheduler, on a wall
or a virtual clock.

Knows: the Scheduler's public API (constructor keywords, ``submit / admit / step /
filter``, ``idle``, ``snapshot``, ``report``), :mod:`workbench.sim.clocks`,
:mod:`workbench.sim.costmodel`. Must not know: the scheduler's internals, views.

One *iteration* of the driver (the same loop as ``Scheduler.run``, driven by time)::

    submit every arrival with arrival_s <= now   (each pinned to its arrival time)
    admit()  ─ snapshot (a sample: what the decode step sees) ─  step()  ─  filter()
    when the engine is idle: wait (wall) or jump (virtual) to the next arrival

Modes (``mode=``):

============  =========================================================================
``wall``      real time (:class:`~workbench.sim.clocks.WallClock`); sleeps through idle gaps
``measured``  virtual time advanced by the measured duration of each engine call; idle
              gaps are skipped, the driver's own bookkeeping is not counted
``cost``      virtual time advanced by a :class:`~workbench.sim.costmodel.CostModel`: inside
              ``admit()`` by each forward as it runs (:class:`CostedModel`), so
              ``prefill`` and ``join`` events carry their forward's end; each ``step()``
              by ``decode_s(B, KV width)`` *before* it runs, so its token events carry
              the step's end. Deterministic: the same workload and config give the same
              table on every run (and, with ``stop_ids=[]``, on every machine)
============  =========================================================================

A *config* is a dict of Scheduler keywords (``policy``, ``max_batch``,
``prefill_step_size``, ``interleave_prefill``, ``prompt_concurrency``, ... and any the
engine adds later, such as ``kv_budget_bytes``): checked against the Scheduler's
signature, so policies are configuration, never forks of the loop. ``clock`` is the
replay's; ``history_size`` defaults to 0 (no snapshot ring, less overhead).
"""

from __future__ import annotations

import inspect
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ..engine.scheduler import Scheduler
from ..observe.paged import layout_columns, step_layout
from ..observe.report import Report
from ..observe.snapshot import Snapshot
from ..workloads.workload import Workload
from .clocks import VirtualClock, WallClock
from .costmodel import CostedModel, CostModel

MODES = ("wall", "measured", "cost")
SAMPLE_COLUMNS = [
    "time_s",
    "step",
    "batch_size",
    "queued",
    "prefilling",
    "kv_bytes",
    "kv_width_tokens",
    "kv_slots_tokens",
    "padding_tokens",
]
_NOT_CONFIG = {"self", "model", "tokenizer", "config", "clock"}


def scheduler_options() -> list[str]:
    """The Scheduler keywords a config may set (from its signature, so options the
    engine adds later are accepted as they appear)."""
    return [p for p in inspect.signature(Scheduler).parameters if p not in _NOT_CONFIG]


def check_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """``config`` as a new dict, after checking its keys.

    Raises:
        ValueError: naming unknown keys (or ``clock``) and listing the accepted ones.
    """
    config = dict(config or {})
    unknown = sorted(set(config) - set(scheduler_options()))
    if unknown:
        raise ValueError(
            f"config key(s) {unknown} are not Scheduler options of this engine; "
            f"accepted: {scheduler_options()} (the replay supplies the clock)"
        )
    return config


def sample_of(snap: Snapshot, time_s: float) -> tuple:
    """One ``SAMPLE_COLUMNS`` row from the snapshot the next decode step sees."""
    return (
        time_s,
        snap.step,
        snap.batch_size,
        len(snap.queue),
        len(snap.prefilling),
        snap.kv_bytes,
        snap.kv_width_tokens,
        snap.batch_size * snap.kv_width_tokens,
        int(np.clip(snap.left_padding, 0, None).sum()),
    )


@dataclass(frozen=True)
class Replay:
    """What one replay produced.

    Attributes:
        name: the config's name. config: the Scheduler keywords used. mode: see module.
        report: events and per-request metrics (submit times are arrival times).
        samples: one row per iteration, ``SAMPLE_COLUMNS``: the running batch as the
            decode step saw it (clock time, rows, queue, prefilling group, KV bytes, KV
            width, ``rows x width`` slots and left-padding tokens).
        wall_s: real seconds the replay took.
        layouts: one row per sample, the padded batch's bytes beside a paged layout's
            (:func:`workbench.observe.paged.step_layout`, block sizes 16, 32, 64).
    """

    name: str
    config: dict[str, Any]
    mode: str
    report: Report
    samples: pd.DataFrame = field(repr=False)
    wall_s: float = 0.0
    layouts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=layout_columns()), repr=False)

    def text(self) -> str:
        """One line: the replay's name, mode and its report's summary (requests, tokens,
        throughput, TTFT and TPOT p50/p95)."""
        return f"{self.name} [{self.mode}]: {self.report.summary()}"


def _mode(mode: str | None, cost_model: CostModel | None) -> str:
    mode = mode or ("cost" if cost_model is not None else "measured")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "cost" and cost_model is None:
        raise ValueError(
            "mode 'cost' needs a cost_model (a workbench.sim.costmodel.CostModel: "
            "CostModel.load(path), or workbench.sim.calibrate.calibrate(model, tokenizer))"
        )
    return mode


def replay(
    workload: Workload,
    model: Any,
    tokenizer: Any,
    config: dict[str, Any] | None = None,
    *,
    mode: str | None = None,
    cost_model: CostModel | None = None,
    name: str = "",
    progress: bool = False,
) -> Replay:
    """Run ``workload`` through a new Scheduler with ``config`` (see the module docstring).

    Args:
        workload: the arrivals.
        model, tokenizer: an mlx-lm pair (e.g. ``ModelRef(...).load()``).
        config: Scheduler keywords, e.g. ``{"policy": "shortest-prompt-first", "max_batch": 8}``.
        mode: ``wall``, ``measured`` or ``cost``; ``None`` means ``cost`` when a
            ``cost_model`` is given, else ``measured``.
        cost_model: the :class:`CostModel` for ``cost`` mode.
        progress: a tqdm bar over finished requests.

    Raises:
        ValueError: for a bad config or mode, a request the engine refuses at submit.
        RuntimeError: if an iteration makes no progress while work remains.
    """
    config = check_config(config)
    mode = _mode(mode, cost_model)
    clock = WallClock() if mode == "wall" else VirtualClock()
    around_admit = around_call = clock.measuring if mode == "measured" else nullcontext
    if mode == "cost":
        model = CostedModel(model, clock, cost_model)
        around_admit = model.charging
    sched = Scheduler(model, tokenizer, clock=clock, **{"history_size": 0, **config})
    arrivals, i, samples, layouts = workload.arrivals, 0, [], []
    started = time.perf_counter()
    with tqdm(total=len(arrivals), desc=name or workload.name, disable=not progress, leave=False) as bar:
        while i < len(arrivals) or not sched.idle:
            if sched.idle:
                clock.wait_until(arrivals[i][0])
            now_s = clock()
            while i < len(arrivals) and arrivals[i][0] <= now_s:
                with clock.pinned(arrivals[i][0]):
                    sched.submit(arrivals[i][1])
                i += 1
            with around_admit():
                events = sched.admit()
            snap = sched.snapshot()
            samples.append(sample_of(snap, clock()))
            layouts.append(step_layout(snap))
            if mode == "cost":
                clock.advance(cost_model.decode_s(snap.batch_size, snap.kv_width_tokens))
            with around_call():
                events += sched.step()
            with around_call():
                events += sched.filter()
            if not events and not sched.idle:
                raise RuntimeError(
                    f"replay made no progress at step {sched.step_index} with work left "
                    f"(queue {list(snap.queue)}); check the config's limits"
                )
            bar.update(sum(e.kind == "finish" for e in events))
    return Replay(
        name=name or workload.name,
        config=config,
        mode=mode,
        report=sched.report(),
        samples=pd.DataFrame(samples, columns=SAMPLE_COLUMNS),
        wall_s=time.perf_counter() - started,
        layouts=pd.DataFrame(layouts, columns=layout_columns()),
    )
