"""The job behind ``workbench bench``: every scenario of :mod:`workbench.bench.scenarios`
on one random-weight model, the decode runs again on the fetched real model (the second
shape, :mod:`workbench.bench.realmodel`; skipped, saying why, when it is not fetched),
with the machine's state recorded.

Knows: the run's sizes (:data:`FULL_CONFIG` for the docs, :data:`QUICK_CONFIG` for the CI
smoke run), the order of the scenarios, the load average while they run. Must not know:
how results are printed, drawn or written (:mod:`workbench.bench.report`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import mlx.core as mx
import pandas as pd
from tqdm import tqdm

from ..engine.levers.pacing import Pacing
from ..runtime.loading import load
from .checkpoint import checkpoint_cost
from .model import FULL, QUICK, ModelShape, make_model, parameter_count
from .pacing import frontier_runs
from .realmodel import real_decode_runs
from .roofline import bounds_tok_per_s, copy_bandwidth_bytes_per_s, decode_cost, matmul_flops_per_s
from .scenarios import (
    MLX_LM,
    PACED,
    PREFILL_FIRST,
    WORKBENCH,
    WORKBENCH_OFF,
    decode_runs,
    engine_factories,
    equal_prompts,
    head_of_line,
    join_cost,
    staggered_arrivals,
)
from .session import session_cost

DEFAULT_TARGET = Pacing().itl_target_steps  # what pacing=True runs at
NO_REAL_MODEL = "--no-real-model was given"


@dataclass(frozen=True)
class DecodeSizes:
    """The decode runs' sizes: at each ``B`` of ``batch_sizes``, ``B`` equal requests of
    ``prompt_tokens`` prompt tokens and ``max_tokens`` new tokens, ``pairs`` measured runs
    per engine variant."""

    batch_sizes: tuple[int, ...]
    prompt_tokens: int
    max_tokens: int
    pairs: int


@dataclass(frozen=True)
class LatencySizes:
    """The staggered-arrival scenario: ``requests`` arrivals into ``max_batch`` rows, one
    every ``arrival_steps`` decode steps (the loaded variant: every ``loaded_arrival_steps``),
    ``rounds`` rounds per engine."""

    requests: int
    max_batch: int
    arrival_steps: float
    rounds: int
    loaded_arrival_steps: float


@dataclass(frozen=True)
class PacingSizes:
    """The pacing frontier: paced runs at ``targets`` (multiples of the decode step), with a
    shortest-first age bound of ``max_wait_steps`` decode steps."""

    targets: tuple[float, ...]
    max_wait_steps: float


@dataclass(frozen=True)
class JoinSizes:
    """The join (and checkpoint) scenario: one row into a batch of ``rows`` rows of
    ``context_tokens`` tokens each, ``repeats`` timed repeats."""

    rows: int
    context_tokens: int
    repeats: int


@dataclass(frozen=True)
class HolSizes:
    """The head-of-line scenario: ``rows`` decoding rows while one ``prompt_tokens``-token
    request joins in chunks of ``chunk_tokens``."""

    rows: int
    prompt_tokens: int
    chunk_tokens: int


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of every scenario, one group a scenario (rows, tokens, repeats): ``decode`` on
    the random-weight ``shape``, ``real`` the same runs on the fetched real model
    (:mod:`workbench.bench.realmodel`), ``prefill_step_size`` for the decode and latency
    runs of both engines, ``session_steps`` decode steps of the long session (its first and
    last 200 compared). :meth:`sizes` flattens them into ``meta.csv``'s keys."""

    name: str
    shape: ModelShape
    decode: DecodeSizes
    prefill_step_size: int
    latency: LatencySizes
    pacing: PacingSizes
    join: JoinSizes
    hol: HolSizes
    session_steps: int
    real: DecodeSizes

    def sizes(self) -> dict[str, Any]:
        """Every size under one flat key, ``<scenario>_<field>`` (``name`` and ``shape`` left out).

        >>> FULL_CONFIG.sizes()["join_rows"], QUICK_CONFIG.sizes()["real_batch_sizes"]
        (32, (1, 4))
        """
        flat = {}
        for key, value in asdict(self).items():
            if key in ("name", "shape"):
                continue
            flat |= {f"{key}_{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value}
        return flat


FULL_CONFIG = BenchConfig(
    "full",
    FULL,
    decode=DecodeSizes(batch_sizes=(1, 8, 32), prompt_tokens=16, max_tokens=24, pairs=8),
    prefill_step_size=512,
    latency=LatencySizes(requests=16, max_batch=8, arrival_steps=8, rounds=2, loaded_arrival_steps=3),
    pacing=PacingSizes(targets=(2, 4, 8), max_wait_steps=30),
    join=JoinSizes(rows=32, context_tokens=1024, repeats=3),
    hol=HolSizes(rows=4, prompt_tokens=4096, chunk_tokens=512),
    session_steps=30_000,
    real=DecodeSizes(batch_sizes=(1, 8, 32), prompt_tokens=8, max_tokens=8, pairs=2),
)
QUICK_CONFIG = replace(  # the same scenarios, smaller: only the sizes that differ from full
    FULL_CONFIG,
    name="quick",
    shape=QUICK,
    decode=replace(FULL_CONFIG.decode, batch_sizes=(1, 8), max_tokens=16, pairs=3),
    prefill_step_size=128,
    latency=LatencySizes(requests=6, max_batch=4, arrival_steps=4, rounds=1, loaded_arrival_steps=2),
    pacing=replace(FULL_CONFIG.pacing, targets=(DEFAULT_TARGET,)),  # the paced rows read the default's runs
    join=replace(FULL_CONFIG.join, rows=8, context_tokens=256),
    hol=HolSizes(rows=2, prompt_tokens=512, chunk_tokens=64),
    session_steps=600,
    real=replace(FULL_CONFIG.real, batch_sizes=(1, 4), max_tokens=6, pairs=1),
)


@dataclass
class BenchResult:
    """Everything a run measured, as frames (one row per measurement) and ``meta``
    (``key -> value`` strings and numbers: model, machine, load, bandwidth, ...)."""

    config: BenchConfig
    runs: pd.DataFrame  # decode runs: engine, B, pair, tok_per_s, window_s, tokens, step_s, same_tokens
    requests: pd.DataFrame  # latency (staggered): engine, round, uid, prompt_tokens, ttft_s, tpot_s, ...
    gaps: pd.DataFrame  # latency (staggered): engine, round, uid, gap_s
    loaded_requests: pd.DataFrame  # the same, arrivals latency.loaded_arrival_steps apart
    loaded_gaps: pd.DataFrame
    join: pd.DataFrame  # method, seconds
    hol: pd.DataFrame  # engine, kind, uid, time_s, role
    roofline: pd.DataFrame  # B, context_tokens, bytes_per_step, bounds, measured tok/s
    checkpoint: pd.DataFrame  # measure, value, unit (a checkpoint of the join scenario's batch)
    session: pd.DataFrame  # step, seconds, events (every run(max_steps=1) of a long session)
    real_runs: pd.DataFrame  # decode runs on the real model (as ``runs``; no rows when it is not fetched)
    meta: dict[str, Any] = field(default_factory=dict)


def load_1min() -> float:
    """The 1-minute load average (``os.getloadavg``)."""
    return os.getloadavg()[0]


def roofline_frame(
    model: Any,
    cfg: BenchConfig,
    runs: pd.DataFrame,
    join: pd.DataFrame,
    bandwidth_bytes_per_s: float,
    flops_per_s: float,
) -> pd.DataFrame:
    """One row per decode-run batch size (mean context: prompt + half the decode) and one
    for the join scenario's bare forward, with the bounds and the measured tok/s."""
    cost = decode_cost(model)
    med = runs.groupby(["engine", "B"]).tok_per_s.median()
    rows = []
    for B in cfg.decode.batch_sizes:
        context = cfg.decode.prompt_tokens + cfg.decode.max_tokens / 2
        rows.append(
            {
                "case": f"decode B={B}",
                "B": B,
                "context_tokens": context,
                **bounds_tok_per_s(cost, B, context, bandwidth_bytes_per_s, flops_per_s),
                "workbench_tok_per_s": med[(WORKBENCH, B)],
                "mlx_lm_tok_per_s": med[(MLX_LM, B)],
            }
        )
    step_s = join[join.method == "step"].seconds.median()
    rows.append(
        {
            "case": f"bare forward B={cfg.join.rows}",
            "B": cfg.join.rows,
            "context_tokens": cfg.join.context_tokens,
            **bounds_tok_per_s(
                cost, cfg.join.rows, cfg.join.context_tokens, bandwidth_bytes_per_s, flops_per_s
            ),
            "workbench_tok_per_s": cfg.join.rows / step_s,
            "mlx_lm_tok_per_s": float("nan"),
        }
    )
    return pd.DataFrame(rows)


SECTIONS = 9  # the section() calls of run_bench: its progress bar's total


def run_bench(
    cfg: BenchConfig = FULL_CONFIG,
    echo: Callable[[str], None] = print,
    progress: bool = False,
    real_model: bool = True,
) -> BenchResult:
    """Run every scenario of ``cfg`` in order (decode, latency, join, head-of-line,
    roofline), echoing progress (and with ``progress``, a tqdm bar over the
    :data:`SECTIONS` sections on stderr), and return what was measured; without
    ``real_model`` the real-model decode rows are skipped, saying so."""
    started_s, loads = time.perf_counter(), []
    bar = tqdm(total=SECTIONS, desc="bench", unit="section", disable=not progress)

    def section(title: str) -> None:
        loads.append(load_1min())
        if loads[1:]:
            bar.update(1)
        bar.set_postfix_str(title.split(" (")[0][:40])
        echo(f"{title} (load average {loads[-1]:.2f}, {time.perf_counter() - started_s:.0f} s in)")

    model = make_model(cfg.shape)
    _, tokenizer = load()  # the bundled tokenizer: prompts are cut from its prompt set
    echo(f"model {cfg.shape.describe()}, {parameter_count(model) / 1e6:.1f}M parameters, float32")

    section("decode throughput (alternating runs)")
    names = (WORKBENCH, WORKBENCH_OFF, PACED, MLX_LM)
    runs = pd.concat(
        [
            decode_runs(
                engine_factories(model, tokenizer, B, cfg.prefill_step_size, names),
                equal_prompts(tokenizer, B, cfg.decode.prompt_tokens),
                cfg.decode.max_tokens,
                cfg.decode.pairs,
                echo,
            )
            for B in cfg.decode.batch_sizes
        ],
        ignore_index=True,
    )

    near = min(cfg.decode.batch_sizes, key=lambda b: abs(b - cfg.latency.max_batch))
    step_s = runs[runs.B == near].step_s.median()
    interval_s = cfg.latency.arrival_steps * step_s
    frontier = lambda interval, targets: frontier_runs(  # noqa: E731
        model,
        tokenizer,
        staggered_arrivals(tokenizer, cfg.latency.requests, interval),
        cfg.latency.max_batch,
        cfg.prefill_step_size,
        targets,
        cfg.latency.rounds,
        max_wait_s=cfg.pacing.max_wait_steps * step_s,
        echo=echo,
    )
    section("staggered-arrival latency and the pacing frontier")
    requests, gaps = frontier(interval_s, cfg.pacing.targets)
    section("loaded staggered arrivals")
    loaded_requests, loaded_gaps = frontier(cfg.latency.loaded_arrival_steps * step_s, (DEFAULT_TARGET,))

    section("join cost")
    join = join_cost(model, cfg.join.rows, cfg.join.context_tokens, cfg.join.repeats)

    section("head-of-line")
    hol = head_of_line(
        engine_factories(
            model, tokenizer, cfg.hol.rows + 1, cfg.hol.chunk_tokens, (WORKBENCH, MLX_LM, PREFILL_FIRST)
        ),
        tokenizer,
        cfg.hol.rows,
        cfg.hol.prompt_tokens,
        cfg.hol.chunk_tokens,
        echo=echo,
    )

    section("checkpoint")
    checkpoint = checkpoint_cost(model, cfg.join.rows, cfg.join.context_tokens, cfg.join.repeats)

    section(f"long session ({cfg.session_steps:,} steps, bundled model)")
    session = session_cost(*load(), cfg.session_steps)

    section(
        f"real model: decode throughput (alternating runs), B = {', '.join(map(str, cfg.real.batch_sizes))}"
    )
    real_runs, real_meta = real_decode_runs(
        cfg.real.batch_sizes,
        cfg.real.prompt_tokens,
        cfg.real.max_tokens,
        cfg.real.pairs,
        cfg.prefill_step_size,
        echo,
        skip=None if real_model else NO_REAL_MODEL,
    )

    section("roofline")
    bandwidth = copy_bandwidth_bytes_per_s()
    flops = matmul_flops_per_s()
    roofline = roofline_frame(model, cfg, runs, join, bandwidth, flops)
    loads.append(load_1min())
    bar.update(1)
    bar.close()
    meta = {
        "mode": cfg.name,
        **cfg.sizes(),
        "model": cfg.shape.describe(),
        "parameters": parameter_count(model),
        "dtype": "float32",
        "device": str(mx.default_device()),
        "copy_bandwidth_bytes_per_s": bandwidth,
        "mlx_copy_bytes_per_s": copy_bandwidth_bytes_per_s(backend="mlx"),
        "matmul_flops_per_s": flops,
        "latency_arrival_interval_s": interval_s,
        "latency_step_s": step_s,
        "load_1min_samples": " ".join(f"{x:.2f}" for x in loads),
        "load_1min_min": min(loads),
        "load_1min_max": max(loads),
        "wall_s": time.perf_counter() - started_s,
        **real_meta,
    }
    return BenchResult(
        cfg,
        runs,
        requests,
        gaps,
        loaded_requests,
        loaded_gaps,
        join,
        hol,
        roofline,
        checkpoint,
        session,
        real_runs,
        meta,
    )
