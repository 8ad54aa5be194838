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
class BenchConfig:
    """Sizes of every scenario: rows, tokens, repeats."""

    name: str
    shape: ModelShape
    batch_sizes: tuple[int, ...]
    prompt_tokens: int  # decode runs: prompt length of every row
    decode_tokens: int  # decode runs: max_tokens of every row
    pairs: int  # decode runs: measured runs per engine variant
    prefill_step_size: int  # decode and latency runs, both engines
    latency_requests: int
    latency_max_batch: int
    latency_arrival_steps: float  # one arrival every this many decode steps
    latency_rounds: int
    latency_loaded_arrival_steps: float  # the loaded variant: one arrival every this many steps
    pacing_targets: tuple[float, ...]  # the frontier: paced runs at these multiples of the step
    pacing_max_wait_steps: float  # paced runs' shortest-first age bound, in decode steps
    join_rows: int
    join_context_tokens: int
    join_repeats: int
    hol_rows: int
    hol_prompt_tokens: int
    hol_chunk_tokens: int
    session_steps: int  # the long-session scenario's decode steps (first and last 200 compared)
    real_batch_sizes: tuple[int, ...]  # the real model's decode runs (:mod:`workbench.bench.realmodel`)
    real_prompt_tokens: int
    real_decode_tokens: int
    real_pairs: int


FULL_CONFIG = BenchConfig(
    "full",
    FULL,
    batch_sizes=(1, 8, 32),
    prompt_tokens=16,
    decode_tokens=24,
    pairs=8,
    prefill_step_size=512,
    latency_requests=16,
    latency_max_batch=8,
    latency_arrival_steps=8,
    latency_rounds=2,
    latency_loaded_arrival_steps=3,
    pacing_targets=(2, 4, 8),
    pacing_max_wait_steps=30,
    join_rows=32,
    join_context_tokens=1024,
    join_repeats=3,
    hol_rows=4,
    hol_prompt_tokens=4096,
    hol_chunk_tokens=512,
    session_steps=30_000,
    real_batch_sizes=(1, 8, 32),
    real_prompt_tokens=8,
    real_decode_tokens=8,
    real_pairs=2,
)
QUICK_CONFIG = replace(  # the same scenarios, smaller: only the sizes that differ from full
    FULL_CONFIG,
    name="quick",
    shape=QUICK,
    batch_sizes=(1, 8),
    decode_tokens=16,
    pairs=3,
    prefill_step_size=128,
    latency_requests=6,
    latency_max_batch=4,
    latency_arrival_steps=4,
    latency_rounds=1,
    latency_loaded_arrival_steps=2,
    pacing_targets=(DEFAULT_TARGET,),  # the paced rows read the default target's runs
    join_rows=8,
    join_context_tokens=256,
    hol_rows=2,
    hol_prompt_tokens=512,
    hol_chunk_tokens=64,
    session_steps=600,
    real_batch_sizes=(1, 4),
    real_decode_tokens=6,
    real_pairs=1,
)


@dataclass
class BenchResult:
    """Everything a run measured, as frames (one row per measurement) and ``meta``
    (``key -> value`` strings and numbers: model, machine, load, bandwidth, ...)."""

    config: BenchConfig
    runs: pd.DataFrame  # decode runs: engine, B, pair, tok_per_s, window_s, tokens, step_s, same_tokens
    requests: pd.DataFrame  # latency (staggered): engine, round, uid, prompt_tokens, ttft_s, tpot_s, ...
    gaps: pd.DataFrame  # latency (staggered): engine, round, uid, gap_s
    loaded_requests: pd.DataFrame  # the same, arrivals latency_loaded_arrival_steps apart
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
    for B in cfg.batch_sizes:
        context = cfg.prompt_tokens + cfg.decode_tokens / 2
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
            "case": f"bare forward B={cfg.join_rows}",
            "B": cfg.join_rows,
            "context_tokens": cfg.join_context_tokens,
            **bounds_tok_per_s(
                cost, cfg.join_rows, cfg.join_context_tokens, bandwidth_bytes_per_s, flops_per_s
            ),
            "workbench_tok_per_s": cfg.join_rows / step_s,
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
                equal_prompts(tokenizer, B, cfg.prompt_tokens),
                cfg.decode_tokens,
                cfg.pairs,
                echo,
            )
            for B in cfg.batch_sizes
        ],
        ignore_index=True,
    )

    near = min(cfg.batch_sizes, key=lambda b: abs(b - cfg.latency_max_batch))
    step_s = runs[runs.B == near].step_s.median()
    interval_s = cfg.latency_arrival_steps * step_s
    frontier = lambda interval, targets: frontier_runs(  # noqa: E731
        model,
        tokenizer,
        staggered_arrivals(tokenizer, cfg.latency_requests, interval),
        cfg.latency_max_batch,
        cfg.prefill_step_size,
        targets,
        cfg.latency_rounds,
        max_wait_s=cfg.pacing_max_wait_steps * step_s,
        echo=echo,
    )
    section("staggered-arrival latency and the pacing frontier")
    requests, gaps = frontier(interval_s, cfg.pacing_targets)
    section("loaded staggered arrivals")
    loaded_requests, loaded_gaps = frontier(cfg.latency_loaded_arrival_steps * step_s, (DEFAULT_TARGET,))

    section("join cost")
    join = join_cost(model, cfg.join_rows, cfg.join_context_tokens, cfg.join_repeats)

    section("head-of-line")
    hol = head_of_line(
        engine_factories(
            model, tokenizer, cfg.hol_rows + 1, cfg.hol_chunk_tokens, (WORKBENCH, MLX_LM, PREFILL_FIRST)
        ),
        tokenizer,
        cfg.hol_rows,
        cfg.hol_prompt_tokens,
        cfg.hol_chunk_tokens,
        echo=echo,
    )

    section("checkpoint")
    checkpoint = checkpoint_cost(model, cfg.join_rows, cfg.join_context_tokens, cfg.join_repeats)

    section(f"long session ({cfg.session_steps:,} steps, bundled model)")
    session = session_cost(*load(), cfg.session_steps)

    section(
        f"real model: decode throughput (alternating runs), B = {', '.join(map(str, cfg.real_batch_sizes))}"
    )
    real_runs, real_meta = real_decode_runs(
        cfg.real_batch_sizes,
        cfg.real_prompt_tokens,
        cfg.real_decode_tokens,
        cfg.real_pairs,
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
    sizes = {k: v for k, v in asdict(cfg).items() if k not in ("name", "shape")}
    meta = {
        "mode": cfg.name,
        **sizes,
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
