"""Step-speed levers of issue 15, measured on the bare model (no scheduler) on a GPU.

Usage: ``python scripts/lab/gpu_levers.py [--quick] [--rounds 5] [--no-profile] [--prefill]`` (prints a
CSV-ish table: each variant's median step over alternating rounds and its range; then a
cProfile of both engines at the largest B; docs/gpu.md records the H200's numbers). Each
variant runs the decode forward of the 1B-shaped bf16 llama (:data:`workbench.bench.gpu.LLAMA_1B`) on a batch cache of
``B`` rows at ``CONTEXT`` tokens (random keys and values, no padding), ``STEPS`` times,
and reports the median step after warm-up. Variants:

- ``sync``: build a step, ``mx.eval`` it, read the tokens (a host sync per step);
- ``pipelined``: launch step t+1 from step t's unread tokens with ``mx.async_eval``, then
  read step t (what the engine and mlx-lm do);
- ``no mask``: pipelined, with the batch caches' ``make_mask`` returning ``None`` for a
  one-token step (valid only where no row is padded);
- ``compiled MLP``: pipelined, each layer's MLP wrapped in ``mx.compile`` (fused SiLU*gate);
- ``compiled MLP + no mask``: both.

It also measures the same model's weights-only roofline (one copy of the weights).
Run it twice, with ``MLX_ENABLE_TF32=0`` and ``=1``, to see whether the flag changes bf16
speed.
"""

from __future__ import annotations

import argparse
import os
import time

import workbench  # noqa: F401  first: sets MLX_ENABLE_TF32=0 unless the caller set it
from workbench.bench.gpu import LLAMA_1B
from workbench.bench.model import QUICK, decode_weight_bytes, make_model

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache

CONTEXT, STEPS, WARM = 350, 30, 5


def filled_caches(model, rows: int, context: int) -> list[BatchKVCache]:
    """One BatchKVCache per layer holding ``context`` random tokens for each of ``rows`` rows."""
    caches = []
    for layer in model.layers:
        a = layer.self_attn
        B, H, S, D = rows, a.n_kv_heads, context, model.args.head_dim  # [B, n_kv_heads, S, head_dim]
        c = BatchKVCache([0] * rows)
        c.update_and_fetch(
            mx.random.normal((B, H, S, D)).astype(mx.bfloat16),
            mx.random.normal((B, H, S, D)).astype(mx.bfloat16),
        )
        caches.append(c)
    mx.eval([c.state for c in caches])
    return caches


def step_times(model, rows: int, pipelined: bool) -> float:
    """Median seconds per decode step over ``STEPS`` steps after ``WARM`` (see the module docstring)."""
    caches = filled_caches(model, rows, CONTEXT)
    tok = mx.zeros((rows,), dtype=mx.uint32)

    def launch(t):
        logits = model(t.reshape(-1, 1), cache=caches)[:, -1, :]
        return mx.argmax(logits, axis=-1).astype(mx.uint32)

    times = []
    if pipelined:
        nxt = launch(tok)
        mx.async_eval(nxt)
        for _ in range(WARM + STEPS):
            start = time.perf_counter()
            cur, nxt = nxt, launch(nxt)
            mx.async_eval(nxt)
            cur.tolist()
            times.append(time.perf_counter() - start)
    else:
        for _ in range(WARM + STEPS):
            start = time.perf_counter()
            tok = launch(tok)
            mx.eval(tok)
            tok.tolist()
            times.append(time.perf_counter() - start)
    return float(np.median(times[WARM:]))


class NoMask:
    """Context manager: BatchKVCache.make_mask returns None for one-token steps."""

    def __enter__(self):
        self.old = BatchKVCache.make_mask
        old = self.old
        BatchKVCache.make_mask = lambda c, N, **kw: None if N == 1 else old(c, N, **kw)

    def __exit__(self, *exc):
        BatchKVCache.make_mask = self.old


def bandwidth_bytes_per_s(n_bytes: int) -> float:
    """Best (read + write) bytes per second of an MLX copy of ``n_bytes``."""
    from workbench.bench.roofline import copy_bandwidth_bytes_per_s

    return copy_bandwidth_bytes_per_s(n_bytes, backend="mlx")


def engine_profile(model, rows: int, decode_tokens: int, top: int = 12) -> None:
    """cProfile one bench run (:mod:`workbench.bench.gpu`'s arrivals, ``rows`` rows) of each
    engine; print its wall seconds and the ``top`` functions by own time: where a step's
    host time goes."""
    import cProfile
    import pstats

    from workbench.bench.engines import Arrival
    from workbench.bench.gpu import ENGINES, GPU_CONFIG, prompt_lengths
    from workbench.bench.scenarios import engine_factories, run_once
    from workbench.runtime.loading import load
    from workbench.workloads.workload import prompt_of_length

    _, tokenizer = load()
    arrivals = [
        Arrival(tuple(prompt_of_length(tokenizer, n, start=97 * b)), decode_tokens)
        for b, n in enumerate(prompt_lengths(GPU_CONFIG, rows))
    ]
    for name, factory in engine_factories(
        model, tokenizer, rows, GPU_CONFIG.prefill_step_size, ENGINES
    ).items():
        run_once(factory, [Arrival(a.prompt, 4) for a in arrivals])  # warm-up
        prof = cProfile.Profile()
        start = time.perf_counter()
        prof.enable()
        run_once(factory, arrivals)
        prof.disable()
        wall = time.perf_counter() - start
        stats = pstats.Stats(prof)
        print(
            f"== profile {name}, B={rows}, {decode_tokens} tokens: wall {wall:.2f} s (profiled); MLX calls "
            f"(graph building, eval, tolist) are invisible to cProfile and count as their caller's own time"
        )
        stats.sort_stats("tottime").print_stats(top)


def prefill_chunks(
    model, cfg, sizes: tuple[int, ...], chunks: tuple[int, ...], decode_tokens: int, pairs: int
) -> None:
    """Wall throughput (prefill included) of both engines at each prefill chunk size, with
    the prompts of ``cfg`` (a :class:`workbench.bench.gpu.GpuBenchConfig`) and few new
    tokens, so prefill dominates the wall."""
    from workbench.bench.engines import Arrival
    from workbench.bench.gpu import ENGINES, gpu_runs, prompt_lengths
    from workbench.bench.scenarios import engine_factories
    from workbench.runtime.loading import load
    from workbench.workloads.workload import prompt_of_length

    _, tokenizer = load()
    print("prefill_step_size,B,engine,wall_tok_per_s_median,wall_s_median")
    for B in sizes:
        arrivals = [
            Arrival(tuple(prompt_of_length(tokenizer, n, start=97 * b)), decode_tokens)
            for b, n in enumerate(prompt_lengths(cfg, B))
        ]
        for chunk in chunks:
            runs = gpu_runs(
                engine_factories(model, tokenizer, B, chunk, ENGINES), arrivals, pairs, echo=lambda _: None
            )
            for name, g in runs.groupby("engine", sort=False):
                print(f"{chunk},{B},{name},{g.wall_tok_per_s.median():.0f},{g.wall_s.median():.3f}")


def main() -> None:
    """Alternate every variant over ``--rounds`` rounds at B = 1 and 128 (``--quick``: a tiny
    model, B = 1 and 8); print each variant's median step and range; then profile the engines."""
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--prefill", action="store_true", help="only the prefill chunk sizes' wall throughput")
    args = p.parse_args()
    shape, sizes = (QUICK, (1, 8)) if args.quick else (LLAMA_1B, (1, 128))
    model = make_model(shape, dtype=mx.bfloat16)
    if args.prefill:
        from workbench.bench.gpu import GPU_CONFIG, GPU_QUICK_CONFIG

        prefill_chunks(
            model,
            GPU_QUICK_CONFIG if args.quick else GPU_CONFIG,
            (4,) if args.quick else (32, 128),
            (16, 64) if args.quick else (256, 512, 2048),
            8,
            1 if args.quick else 2,
        )
        return
    bw = bandwidth_bytes_per_s(64 * 2**20 if args.quick else 4 * 2**30)
    bound_s = decode_weight_bytes(model) / bw
    print(
        f"MLX_ENABLE_TF32={os.environ.get('MLX_ENABLE_TF32')}; device {mx.default_device()}; weights "
        f"{decode_weight_bytes(model) / 1e9:.2f} GB, copy {bw / 1e12:.2f} TB/s: "
        f"weight-read bound {bound_s * 1e3:.3f} ms"
    )
    mlps = [layer.mlp for layer in model.layers]
    compiled = [mx.compile(lambda x, mlp=mlp: mlp(x)) for mlp in mlps]

    def variant(name: str, B: int) -> float:
        for layer, plain, fast in zip(model.layers, mlps, compiled):
            layer.mlp = fast if "compiled" in name else plain
        if "no mask" in name:
            with NoMask():
                return step_times(model, B, True)
        return step_times(model, B, name != "sync")

    names = ["sync", "pipelined", "no mask", "compiled MLP", "compiled MLP + no mask"]
    times = {(n, B): [] for n in names for B in sizes}
    for r in range(args.rounds):
        for B in sizes:
            for n in names if r % 2 == 0 else names[::-1]:
                times[n, B].append(variant(n, B))
    variant("pipelined", 1)  # the plain MLPs back
    print("lever,B,step_ms_median,step_ms_min,step_ms_max,pct_of_weight_bound")
    for (n, B), ts in times.items():
        med = float(np.median(ts))
        print(f"{n},{B},{med * 1e3:.3f},{min(ts) * 1e3:.3f},{max(ts) * 1e3:.3f},{100 * bound_s / med:.0f}")
    if not args.no_profile:
        engine_profile(model, sizes[-1], 16 if args.quick else 64)


if __name__ == "__main__":
    main()
