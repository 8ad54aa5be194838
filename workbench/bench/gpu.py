"""``workbench bench --device gpu``: the workbench against mlx-lm's ``BatchGenerator`` on a
GPU, a 1B-shaped bf16 llama at B = 1, 8, 32, 128, with the roofline of a decode step.

Knows: the engines and their driver (:mod:`workbench.bench.engines`), alternating runs
and token agreement (:mod:`workbench.bench.scenarios`), random-weight models
(:mod:`workbench.bench.model`), the roofline (:mod:`workbench.bench.roofline`), the device
and its float32 precision (:mod:`workbench.runtime`). Must not know: the CPU benchmark's
table and files (:mod:`workbench.bench.report`).

One *run*: ``B`` requests with prompts of ``prompt_tokens_min .. prompt_tokens_max``
tokens (seeded, the same for both engines) and ``decode_tokens`` new tokens each, all
submitted at once, ``max_batch = B``, greedy, no stop ids; the engines alternate
(A B, B A, ...) after one untimed warm-up run each (MLX compiles its GPU kernels on first
use). From each run's iterations:

- *decode step* ``step_s``: the median duration of iterations that produced ``B`` tokens
  and followed one that did (every row decoding, no prefill in them); decode tok/s =
  ``B / step_s``;
- *wall with prefill* ``wall_tok_per_s``: all generated tokens over the time from the
  first submit to the last iteration (prefill, joins and the tail included).

The roofline of a decode step at the runs' mean context ``C`` (mean prompt + half the
decode): ``bound_s = max(bytes / bandwidth, flops / bf16 matmul rate)`` with
:class:`~workbench.bench.roofline.DecodeCost`; ``% of bound`` = ``bound_s / step_s``.
Bandwidth is an MLX copy of ``bandwidth_bytes`` on the GPU, the rate a bf16
``[8192, 8192]`` matmul (on the CPU config: smaller sizes).

Example (the issue's starting point on an H200): 2.47 GB of weights at 3.48 TB/s bound a
B = 1 step at 0.71 ms; a 3.5 ms step runs at 20% of that bound.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pandas as pd

from ..runtime import precision
from ..runtime.device import device_report, on_gpu
from ..runtime.loading import load
from ..workloads.workload import prompt_of_length
from .engines import Arrival
from .model import QUICK, ModelShape, decode_weight_bytes, make_model, parameter_count
from .roofline import copy_bandwidth_bytes_per_s, decode_cost, matmul_flops_per_s
from .scenarios import (
    FAST_OFF,
    MLX_LM,
    WORKBENCH,
    alternating,
    engine_factories,
    run_once,
    tokens_by_uid,
    with_same_tokens,
)

# Llama-3.2-1B's shape (tied embeddings): 1.24B parameters, 2.47 GB in bf16.
LLAMA_1B = ModelShape.from_proportions(
    "llama-1b", 2048, 16, 32, 128256, mlp_ratio=4, tie_word_embeddings=True
)
ENGINES = (WORKBENCH, FAST_OFF, MLX_LM)  # FAST_OFF: the same engine before the decode fast paths


@dataclass(frozen=True)
class GpuBenchConfig:
    """Sizes of the GPU benchmark (see the module docstring); token counts in tokens,
    ``bandwidth_bytes`` the size of the copied array, ``matmul_n`` the matmul's side."""

    name: str
    shape: ModelShape
    dtype: str
    batch_sizes: tuple[int, ...]
    prompt_tokens_min: int
    prompt_tokens_max: int
    decode_tokens: int
    pairs: int
    prefill_step_size: int
    bandwidth_bytes: int
    matmul_n: int
    model: str | None = None  # an mlx-lm model path or a bundled / fetched name instead of ``shape``


# Every size of the GPU run and its quick variant side by side: field -> (full, quick).
_GPU_SIZES = {
    "batch_sizes": ((1, 8, 32, 128), (1, 8)),
    "prompt_tokens_min": (64, 16),
    "prompt_tokens_max": (512, 64),
    "decode_tokens": (128, 16),
    "pairs": (3, 1),
    "prefill_step_size": (2048, 128),
    "bandwidth_bytes": (4 * 2**30, 64 * 2**20),
    "matmul_n": (8192, 512),
}
GPU_CONFIG = GpuBenchConfig("gpu", LLAMA_1B, "bfloat16", **{f: full for f, (full, _) in _GPU_SIZES.items()})
GPU_QUICK_CONFIG = GpuBenchConfig(
    "gpu-quick", QUICK, "bfloat16", **{f: quick for f, (_, quick) in _GPU_SIZES.items()}
)


@dataclass
class GpuBenchResult:
    """What a GPU benchmark measured: ``runs`` (one row per measured run), ``roofline``
    (one row per B), ``table`` (one row per B: the comparison) and ``meta`` (model,
    device, precision, versions, bandwidth, date)."""

    config: GpuBenchConfig
    runs: pd.DataFrame
    roofline: pd.DataFrame
    table: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)


def prompt_lengths(cfg: GpuBenchConfig, rows: int, seed: int = 0) -> list[int]:
    """``rows`` prompt lengths drawn uniformly from ``prompt_tokens_min .. max`` (inclusive),
    seeded, so every engine and repeat gets the same ones."""
    rng = np.random.default_rng(seed + rows)
    return rng.integers(cfg.prompt_tokens_min, cfg.prompt_tokens_max + 1, size=rows).tolist()


def full_batch_step_s(iterations: pd.DataFrame, rows: int) -> float:
    """Median seconds of the iterations that produced ``rows`` tokens and followed one
    that did (pure decode steps of the full batch); NaN when there are none.

    >>> it = pd.DataFrame({"time_s": [1.0, 3.0, 4.0, 5.5], "tokens": [0, 2, 2, 2]})
    >>> full_batch_step_s(it, 2)
    1.25
    """
    full = (iterations.tokens == rows).to_numpy()
    gaps = np.diff(iterations.time_s.to_numpy())[full[1:] & full[:-1]]
    return float(np.median(gaps)) if gaps.size else float("nan")


def gpu_runs(
    factories: dict[str, Callable[[], Any]],
    arrivals: list[Arrival],
    pairs: int,
    echo: Callable[[str], None] = print,
) -> pd.DataFrame:
    """Alternating runs of every engine on ``arrivals`` (after one untimed warm-up each,
    with 4 new tokens). Returns one row per measured run: ``engine``, ``B``, ``pair``,
    ``step_s``, ``decode_tok_per_s``, ``wall_s``, ``tokens``, ``wall_tok_per_s`` and
    ``same_tokens`` (1.0 when its tokens equal the first engine's of that pair, NaN for
    the first engine)."""
    rows_n = len(arrivals)
    for factory in factories.values():
        run_once(factory, [Arrival(a.prompt, 4) for a in arrivals])
    out, tokens = [], {}
    for pair, name in alternating(list(factories), pairs):
        iterations, events = run_once(factories[name], arrivals)
        tokens[pair, name] = tokens_by_uid(events)
        step_s = full_batch_step_s(iterations, rows_n)
        wall_s = float(iterations.time_s.iloc[-1] - iterations.attrs["start_s"])
        made = int(iterations.tokens.sum())
        out.append(
            {
                "engine": name,
                "B": rows_n,
                "pair": pair,
                "step_s": step_s,
                "decode_tok_per_s": rows_n / step_s,
                "wall_s": wall_s,
                "tokens": made,
                "wall_tok_per_s": made / wall_s,
            }
        )
        echo(
            f"  B={rows_n:<4} {name:<10} pair {pair}: step {step_s * 1e3:7.2f} ms, wall {made / wall_s:9.1f} tok/s"
        )
    return with_same_tokens(out, tokens, next(iter(factories)))


def gpu_roofline(
    model: Any, cfg: GpuBenchConfig, runs: pd.DataFrame, bandwidth_bytes_per_s: float, flops_per_s: float
) -> pd.DataFrame:
    """One row per B: ``context_tokens`` (mean prompt + half the decode), ``bytes_per_step``,
    ``memory_s``, ``compute_s``, ``bound_s`` (their max), the median measured step of each
    engine (``workbench_step_s``, ``mlx_lm_step_s``) and each one's ``% of bound``."""
    cost = decode_cost(model)
    med = runs.groupby(["engine", "B"]).step_s.median()
    out = []
    for B in cfg.batch_sizes:
        context = float(np.mean(prompt_lengths(cfg, B))) + cfg.decode_tokens / 2
        memory_s = cost.bytes_per_step(B, context) / bandwidth_bytes_per_s
        compute_s = cost.flops_per_step(B, context) / flops_per_s
        bound_s = max(memory_s, compute_s)
        wb, ml = med[(WORKBENCH, B)], med[(MLX_LM, B)]
        off = med.get((FAST_OFF, B), np.nan)
        out.append(
            {
                "B": B,
                "context_tokens": context,
                "bytes_per_step": cost.bytes_per_step(B, context),
                "memory_s": memory_s,
                "compute_s": compute_s,
                "bound_s": bound_s,
                "workbench_step_s": wb,
                "fast_off_step_s": off,
                "mlx_lm_step_s": ml,
                "workbench_pct_of_bound": 100 * bound_s / wb,
                "mlx_lm_pct_of_bound": 100 * bound_s / ml,
            }
        )
    return pd.DataFrame(out)


def _pair_ratio(runs: pd.DataFrame, B: int, column: str) -> pd.Series:
    """Per pair, the workbench's ``column`` over mlx-lm's at batch size ``B``."""
    r = runs[runs.B == B].pivot_table(index="pair", columns="engine", values=column)
    return r[WORKBENCH] / r[MLX_LM]


def gpu_table(runs: pd.DataFrame, roofline: pd.DataFrame) -> pd.DataFrame:
    """One row per B: median decode steps (ms), decode and wall throughput ratios
    (workbench / mlx-lm: medians of per-pair ratios, with their range) and the workbench's
    % of the decode-step bound."""
    out = []
    for _, rf in roofline.iterrows():
        B = int(rf.B)
        dec, wall = _pair_ratio(runs, B, "decode_tok_per_s"), _pair_ratio(runs, B, "wall_tok_per_s")
        wall_med = runs[runs.B == B].groupby("engine").wall_tok_per_s.median()
        out.append(
            {
                "B": B,
                "workbench_step_ms": 1e3 * rf.workbench_step_s,
                "fast_off_step_ms": 1e3 * rf.fast_off_step_s,
                "mlx_lm_step_ms": 1e3 * rf.mlx_lm_step_s,
                "decode_ratio": dec.median(),
                "decode_ratio_range": f"{dec.min():.2f}..{dec.max():.2f}",
                "workbench_wall_tok_per_s": wall_med[WORKBENCH],
                "mlx_lm_wall_tok_per_s": wall_med[MLX_LM],
                "wall_ratio": wall.median(),
                "wall_ratio_range": f"{wall.min():.2f}..{wall.max():.2f}",
                "bound_ms": 1e3 * rf.bound_s,
                "workbench_pct_of_bound": rf.workbench_pct_of_bound,
                "mlx_lm_pct_of_bound": rf.mlx_lm_pct_of_bound,
            }
        )
    return pd.DataFrame(out)


def _versions() -> dict[str, str]:
    out = {}
    for pkg in ("mlx", "mlx-cuda-13", "mlx-lm"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def needs_gpu(command: str) -> None:
    """Refuse a GPU benchmark before it starts where MLX's default device is not a GPU.

    Raises:
        ValueError: ``"<command> needs a GPU, but MLX runs on <device>"`` with the install hint.
    """
    if not on_gpu():
        raise ValueError(
            f"{command} needs a GPU, but MLX runs on {device_report().text()} "
            f'(NVIDIA: pip install -e ".[cuda]", docs/gpu.md)'
        )


def start_gpu_bench(
    cfg: GpuBenchConfig, echo: Callable[[str], None], command: str | None
) -> tuple[Any, Any, str, str]:
    """What every GPU benchmark does first: refuse without a GPU (:func:`needs_gpu`, unless
    ``command`` is None), echo the device and precision, build ``cfg``'s model (the random
    ``cfg.shape`` in ``cfg.dtype``, or ``cfg.model`` loaded as it is) and the tokenizer its
    prompts are cut with, echo the model. Returns ``(model, tokenizer, described, dtype)``.

    Raises:
        ValueError: from :func:`needs_gpu`.
    """
    if command is not None:
        needs_gpu(command)
    echo(f"device: {device_report().text()}; {precision.describe()}")
    if cfg.model is None:
        model = make_model(cfg.shape, dtype=getattr(mx, cfg.dtype))
        _, tokenizer = load()  # the bundled tokenizer: prompts are cut from its prompt set
        described = cfg.shape.describe()
    else:
        model, tokenizer = load(cfg.model)  # prompts are cut from the bundled prompt set, in its tokenizer
        described = (
            f"{cfg.model}: {type(model).__module__.rsplit('.', 1)[-1]}, {len(model.layers)} layers, "
            f"{decode_weight_bytes(model) / 1e6:,.1f} MB of weights read per step"
        )
    dtype = cfg.dtype if cfg.model is None else "weights as loaded"
    echo(f"model {described}, {parameter_count(model) / 1e6:,.1f}M parameters, {dtype}")
    return model, tokenizer, described, dtype


def bench_meta(
    cfg: GpuBenchConfig, model: tuple[str, str], rates: tuple[float, float], started_s: float, **measured: Any
) -> dict[str, Any]:
    """A GPU benchmark's ``meta``: date, package versions, device, precision, the model
    (``(described, dtype)``), the measured ``rates`` (copy bandwidth in bytes/s, matmul rate in
    flop/s), ``measured`` (the benchmark's own readings; they replace ``cfg``'s fields of the
    same name), the wall seconds since ``started_s`` (``time.perf_counter``) and ``cfg``'s sizes."""
    return {
        "date": datetime.date.today().isoformat(),
        **_versions(),
        "device": device_report().text(),
        "precision": precision.describe(),
        "model": model[0],
        "dtype": model[1],
        "copy_bandwidth_bytes_per_s": rates[0],
        "matmul_flops_per_s": rates[1],
        **measured,
        "wall_s": time.perf_counter() - started_s,
        **{k: v for k, v in asdict(cfg).items() if k not in ("name", "shape", "model", "dtype", *measured)},
    }


def run_gpu_bench(
    cfg: GpuBenchConfig = GPU_CONFIG, echo: Callable[[str], None] = print, require_gpu: bool = True
) -> GpuBenchResult:
    """Run the GPU benchmark of ``cfg`` (see the module docstring), echoing progress
    (``require_gpu=False`` lets a CPU test run the quick config through the same code).

    Raises:
        ValueError: when MLX's default device is not a GPU and ``require_gpu``.
    """
    started_s = time.perf_counter()
    model, tokenizer, described, dtype = start_gpu_bench(cfg, echo, "--device gpu" if require_gpu else None)
    frames = []
    for B in cfg.batch_sizes:
        arrivals = [
            Arrival(tuple(prompt_of_length(tokenizer, n, start=97 * b)), cfg.decode_tokens)
            for b, n in enumerate(prompt_lengths(cfg, B))
        ]
        frames.append(
            gpu_runs(
                engine_factories(model, tokenizer, B, cfg.prefill_step_size, ENGINES),
                arrivals,
                cfg.pairs,
                echo,
            )
        )
    runs = pd.concat(frames, ignore_index=True)
    bandwidth = copy_bandwidth_bytes_per_s(cfg.bandwidth_bytes, backend="mlx")
    flops = matmul_flops_per_s(cfg.matmul_n, 5, cfg.dtype)
    roofline = gpu_roofline(model, cfg, runs, bandwidth, flops)
    same = runs.same_tokens.dropna()
    meta = bench_meta(
        cfg,
        (described, dtype),
        (bandwidth, flops),
        started_s,
        parameters=parameter_count(model),
        same_tokens_runs=f"{int(same.sum())}/{len(same)}",
    )
    return GpuBenchResult(cfg, runs, roofline, gpu_table(runs, roofline), meta)


def gpu_markdown(result: GpuBenchResult) -> str:
    """The result as markdown: what ran, the table, the roofline line, the meta."""
    m, cfg = result.meta, result.config
    lines = [
        f"Measured {m['date']} on {m['device']}; mlx {m['mlx']}, mlx-cuda-13 {m['mlx-cuda-13']}, "
        f"mlx-lm {m['mlx-lm']}; {m['precision']}.",
        f"Model: {m['model']} ({m['parameters'] / 1e6:,.1f}M parameters, {m['dtype']}). Prompts "
        f"{cfg.prompt_tokens_min}-{cfg.prompt_tokens_max} tokens, {cfg.decode_tokens} new tokens, "
        f"prefill_step_size {cfg.prefill_step_size}, {cfg.pairs} alternating pairs; tokens equal between the "
        f"engines in {m['same_tokens_runs']} runs.",
        "",
        "| B | workbench step | fast decode off | mlx-lm step | decode tok/s ratio (range) "
        "| wall tok/s workbench / mlx-lm | wall ratio (range) | step bound | workbench % of bound "
        "| mlx-lm % of bound |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for _, r in result.table.iterrows():
        lines.append(
            f"| {r.B} | {r.workbench_step_ms:.2f} ms | {r.fast_off_step_ms:.2f} ms | {r.mlx_lm_step_ms:.2f} ms "
            f"| {r.decode_ratio:.2f} "
            f"({r.decode_ratio_range}) | {r.workbench_wall_tok_per_s:,.0f} / {r.mlx_lm_wall_tok_per_s:,.0f} "
            f"| {r.wall_ratio:.2f} ({r.wall_ratio_range}) | {r.bound_ms:.2f} ms "
            f"| {r.workbench_pct_of_bound:.0f}% | {r.mlx_lm_pct_of_bound:.0f}% |"
        )
    lines += [
        "",
        f"Roofline: copy bandwidth {m['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, {cfg.dtype} matmul "
        f"{m['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s; step bound = max(bytes / bandwidth, flops / rate) "
        f"at the mean context; decode ratio = workbench tok/s / mlx-lm tok/s (> 1: workbench faster); "
        f"fast decode off = the workbench with `fast_decode=False` (mlx-lm's forward as it is: a mask in "
        f"every step, MLPs not compiled), in the same alternation.",
    ]
    return "\n".join(lines)


def write_bench(
    out: Path, name: str, frames: dict[str, pd.DataFrame], text: str, echo: Callable[[str], None]
) -> int:
    """Write ``out/<name>.md`` (``text``) and ``out/<name>/<key>.csv`` for each frame, echo the
    text and where it went. Returns 0 (the job's exit status).

    Raises:
        OSError: when a file cannot be written.
    """
    (out / name).mkdir(parents=True, exist_ok=True)
    for key, frame in frames.items():
        frame.to_csv(out / name / f"{key}.csv", index=False)
    (out / f"{name}.md").write_text(text + "\n")
    echo(text)
    echo(f"wrote {out / (name + '.md')} and {out / name}/ ({', '.join(frames)} CSV)")
    return 0


def gpu_bench_job(
    quick: bool = False,
    out_dir: Path | None = None,
    echo: Callable[[str], None] = print,
    model: str | None = None,
) -> int:
    """The job behind ``workbench bench --device gpu [--model M]``: run the GPU benchmark (or
    its ``quick`` smoke form) on the 1B-shaped random llama, or on ``model`` (an mlx-lm path,
    or a bundled or fetched name such as ``smollm2-135m``: the real 4-bit chat model) at the
    same sizes, write ``gpu-bench.md`` and ``gpu-bench/{runs,roofline,table,meta}.csv``
    under ``out_dir`` (default ``workbench-out``), print the markdown. Returns 0.

    Raises:
        ValueError: when MLX's default device is not a GPU (before anything runs).
        OSError: when ``out_dir`` cannot be created (before anything runs).
    """
    out = Path(out_dir) if out_dir is not None else Path("workbench-out")
    (out / "gpu-bench").mkdir(parents=True, exist_ok=True)
    cfg = GPU_QUICK_CONFIG if quick else GPU_CONFIG
    if model is not None:
        cfg = replace(cfg, name=f"{cfg.name}-{Path(model).name}", model=model)
    result = run_gpu_bench(cfg, echo)
    frames = {"runs": result.runs, "roofline": result.roofline, "table": result.table}
    frames["meta"] = pd.DataFrame({"key": list(result.meta), "value": list(result.meta.values())})
    return write_bench(out, "gpu-bench", frames, gpu_markdown(result), echo)
