"""Sweeps: the comparison table over a grid of configurations, run by any
``concurrent.futures``-compatible executor.

Knows: :mod:`workbench.sim.compare` (one row per config), :class:`~workbench.runtime.modelref.ModelRef`
(what workers load), ``concurrent.futures``. Must not know: the scheduler's internals.
There is no task farm here: local processes are a ``ProcessPoolExecutor`` (``spawn``
start method: MLX does not survive ``fork``), and a cluster is whatever executor the
user brings, e.g. Dask distributed's::

    from dask.distributed import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        table = sweep(workload, grid(policy=["fcfs", "shortest-prompt-first"], max_batch=[4, 8]),
                      ModelRef(standin=True), cost_model=cost, executor=client.get_executor())

Each task replays the whole workload under one config in a worker (which loads the
model once per process) and returns one table row, so only small dicts travel back. In
``cost`` mode the table is the same whichever executor ran it.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from ..observe.metrics import SLO
from ..runtime.modelref import ModelRef
from ..workloads.workload import Workload
from .compare import COMPARE_COLUMNS, summary_row
from .costmodel import CostModel
from .replay import check_config, replay


def grid(base: Mapping[str, Any] | None = None, **axes: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Named configs from the product of ``axes`` on top of ``base``.

    Example: ``grid({"max_batch": 4}, policy=["fcfs", "priority"], prefill_step_size=[64])``
    gives ``{"policy=fcfs prefill_step_size=64": {"max_batch": 4, "policy": "fcfs",
    "prefill_step_size": 64}, "policy=priority prefill_step_size=64": {...}}``.

    Raises:
        ValueError: for a key that is not a Scheduler option (see ``check_config``).
    """
    keys = list(axes)
    out = {}
    for values in itertools.product(*(axes[k] for k in keys)):
        cfg = check_config({**(base or {}), **dict(zip(keys, values))})
        out[" ".join(f"{k}={v}" for k, v in zip(keys, values)) or "base"] = cfg
    return out


def run_config(
    workload: Workload,
    name: str,
    config: dict[str, Any],
    model: ModelRef,
    mode: str | None,
    cost_model: CostModel | None,
    slo: SLO,
) -> dict[str, Any]:
    """One sweep task: replay ``workload`` under ``config`` and return its table row.
    Module-level so every executor can pickle it."""
    return summary_row(
        replay(workload, *model.load(), config, mode=mode, cost_model=cost_model, name=name), slo
    )


def local_processes(max_workers: int | None = None) -> ProcessPoolExecutor:
    """A ``ProcessPoolExecutor`` with the ``spawn`` start method (default workers: CPUs)."""
    return ProcessPoolExecutor(
        max_workers=max_workers or os.cpu_count() or 1, mp_context=multiprocessing.get_context("spawn")
    )


def sweep(
    workload: Workload,
    configs: Mapping[str, dict[str, Any]],
    model: ModelRef = ModelRef(),
    *,
    slo: SLO = SLO(),
    mode: str | None = None,
    cost_model: CostModel | None = None,
    executor: Executor | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """The comparison table (``COMPARE_COLUMNS``, rows in the order of ``configs``), one
    task per config on ``executor``.

    Args:
        model: a :class:`ModelRef` (picklable; workers load it).
        executor: anything with ``submit(fn, *args) -> future`` whose futures have
            ``result()`` (``concurrent.futures`` executors, ``dask`` ``Client.get_executor()``).
            ``None``: :func:`local_processes` with one worker per config up to the CPU count,
            shut down at the end.
        slo, mode, cost_model, progress: as in :func:`workbench.sim.compare.compare`.

    Raises:
        ValueError: for a bad config (checked before anything is submitted).
    """
    if not isinstance(model, ModelRef):
        raise ValueError(f"sweep needs a ModelRef (picklable), got {type(model).__name__}")
    configs = {name: check_config(cfg) for name, cfg in configs.items()}
    own = executor is None
    if own:
        executor = local_processes(min(len(configs), os.cpu_count() or 1) or 1)
    try:
        futures = [
            executor.submit(run_config, workload, name, cfg, model, mode, cost_model, slo)
            for name, cfg in configs.items()
        ]
        rows = [f.result() for f in tqdm(futures, desc="sweep", disable=not progress, leave=False)]
    finally:
        if own:
            executor.shutdown()
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)
