"""Where a decode step's time goes in the engines as they are now (issue 28's missed goals:
B = 1 at 35% of the weight-read bound, B = 128 in 4 ms), and what fusing operations buys.

Six readings, each printed as JSON lines (``"part"`` names the reading):

- ``anatomy``: the workbench (as the GPU benchmark runs it) and mlx-lm's ``BatchGenerator``
  on the GPU benchmark's 1B-shaped bf16 llama and prompts, B rows decoding together. Every
  ``mx.async_eval`` and ``mx.eval`` call is timed (wrapped for the run), so a full-batch
  decode iteration splits into ``launch_ms`` (inside ``mx.async_eval``: MLX turning the
  step's graph into GPU kernels, host work), ``wait_ms`` (inside ``mx.eval``: blocked on the
  GPU for the previous step's tokens) and ``python_ms`` (the rest: building the graph in
  Python, the engine's bookkeeping; ``python_cpu_ms``: the same as the main thread's CPU
  time, which other processes' load does not inflate). mlx-lm reads its tokens with
  ``tolist``, so its wait counts as python there. Medians over the full-batch iterations.
- ``packed_profile``: where the packed step's host time goes: cProfile (on the main
  thread's CPU clock) over full-batch decode iterations of the packed layout at the largest
  B, the functions with the most time of their own (MLX's C++ calls count in their callers').
- ``kernels`` (CUDA; PyTorch's profiler on the GPU machine's image): every GPU kernel of
  ten full-batch decode iterations of each engine, timed by CUPTI: the GPU's busy time per
  step against the step's wall time, kernels per step, the costliest kernels.
- ``packed_anatomy``, ``packed_kernels``: ``anatomy`` and ``kernels`` with the packed layout
  beside the two engines, at the largest B.
- ``graph``: the primitives MLX runs for one decode forward of mlx-lm's model at each B
  (``mx.export_to_dot``), with the most frequent kinds: the kernels a step launches.
- ``fused``: the bare forward (pipelined like both engines, no scheduler) with mlx-lm's
  layers, then with each layer's q/k/v projections and gate/up projections fused into one
  matmul each (weights concatenated), then with the SwiGLU also under ``mx.compile``, then
  ``lean``: :class:`LeanBlock` s (few primitives: the module's ``LeanBlock`` docstring):
  median step, primitives per step. Tokens compared with the plain forward.
- ``quantized_kv``: the decode forward over a float, 8-bit and 4-bit KV cache through the
  path a scheduler takes (:func:`workbench.bench.quantized.step_cost`: on CUDA the step's
  keys and values are dequantized into MLX's fused attention).
- ``packed``: decode steps at full batch of the padded and packed layouts and mlx-lm
  (:func:`workbench.bench.gpu.gpu_runs`), B = 128.

Usage: ``python scripts/lab/gpu_step_anatomy.py [--quick] [--batch 1 32 128]
[--parts anatomy kernels graph fused quantized_kv packed]``
(``--quick``: the tiny model, B = 1 and 8, for a CPU check).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import workbench  # noqa: F401  first: sets MLX_ENABLE_TF32=0 unless the caller set it
from workbench.bench.engines import Arrival, MlxLmEngine, WorkbenchEngine
from workbench.bench.gpu import (
    GPU_CONFIG,
    GPU_QUICK_CONFIG,
    LLAMA_1B,
    gpu_runs,
    prompt_lengths,
)
from workbench.bench.gpu_packed import PACKED_SETTINGS
from workbench.bench.host_time import step_anatomy
from workbench.bench.model import QUICK, make_model
from workbench.runtime.loading import load
from workbench.workloads.workload import prompt_of_length

import mlx.core as mx
import mlx.nn as nn
import numpy as np

DECODE_TOKENS = 48
NO_KERNEL = {
    "Broadcast",
    "Reshape",
    "Squeeze",
    "ExpandDims",
    "Slice",
    "AsStrided",
    "Full",
    "Transpose",
    "Split",
    "Flatten",
    "Unflatten",
}


def emit(part: str, **fields) -> None:
    """Print one JSON line."""
    print(json.dumps({"part": part, **fields}), flush=True)


def arrivals_for(cfg, tokenizer, rows: int, decode_tokens: int) -> list[Arrival]:
    """The GPU benchmark's prompts for ``rows`` rows."""
    return [
        Arrival(tuple(prompt_of_length(tokenizer, n, start=97 * b)), decode_tokens)
        for b, n in enumerate(prompt_lengths(cfg, rows))
    ]


anatomy_run = step_anatomy  # the reading lives in the package (workbench.bench.host_time)


def engine_makers(model, tokenizer, cfg, packed: bool = False) -> dict:
    """name -> ``B -> engine``: the workbench as the GPU benchmark runs it, mlx-lm, and with
    ``packed`` the workbench's packed layout (:data:`PACKED_SETTINGS`)."""
    engines = {
        "workbench": lambda B: WorkbenchEngine(model, tokenizer, B, cfg.prefill_step_size, history_size=64),
        "mlx-lm": lambda B: MlxLmEngine(model, B, cfg.prefill_step_size),
    }
    if packed:
        engines["packed"] = lambda B: WorkbenchEngine(
            model, tokenizer, B, cfg.prefill_step_size, history_size=64, **PACKED_SETTINGS
        )
    return engines


def anatomy(model, tokenizer, cfg, sizes, rounds: int = 2, packed: bool = False) -> None:
    """The ``anatomy`` reading (module docstring), engines alternating over ``rounds``."""
    engines = engine_makers(model, tokenizer, cfg, packed)
    for B in sizes:
        arrivals = arrivals_for(cfg, tokenizer, B, DECODE_TOKENS)
        for make in engines.values():  # warm-up
            e = make(B)
            anatomy_run(e, [Arrival(a.prompt, 4) for a in arrivals])
            e.close()
        for r in range(rounds):
            for name in engines if r % 2 == 0 else list(engines)[::-1]:
                e = engines[name](B)
                emit("anatomy", engine=name, B=B, round=r, **anatomy_run(e, arrivals))
                e.close()


def packed_profile(model, tokenizer, cfg, B: int, steps: int = 20, top: int = 25) -> None:
    """The ``packed_profile`` reading (module docstring): one JSON line per function, its
    own and cumulative main-thread CPU ms per step."""
    import cProfile
    import pstats

    engine = warmed(
        engine_makers(model, tokenizer, cfg, True)["packed"](B), arrivals_for(cfg, tokenizer, B, 99)
    )
    prof = cProfile.Profile(time.thread_time)
    prof.runcall(lambda: [engine.iterate() for _ in range(steps)])
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, _, own s, cumulative s, _)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (path, line, name), (_, calls, own, cum, _) in rows:
        where = f"{Path(path).name}:{line}({name})"
        emit(
            "packed_profile",
            B=B,
            function=where,
            calls_per_step=calls / steps,
            own_ms=1e3 * own / steps,
            cumulative_ms=1e3 * cum / steps,
        )
    engine.close()


def warmed(engine, arrivals: list[Arrival], full_steps: int = 3):
    """``engine`` with every arrival submitted and ``full_steps`` full-batch decode
    iterations run (every row joined)."""
    for a in arrivals:
        engine.submit(a.prompt, a.max_tokens)
    seen = 0
    while seen < full_steps:
        seen = seen + 1 if engine.iterate() == len(arrivals) else 0
    return engine


def kernels(model, tokenizer, cfg, sizes, steps: int = 10, packed: bool = False) -> None:
    """The ``kernels`` reading (CUDA only): PyTorch's profiler (CUPTI) records every GPU
    kernel of the process, MLX's included, over ``steps`` full-batch decode iterations of
    each engine (``packed``: also the packed layout); the kernels' summed time against the
    iterations' wall time says how much of a step the GPU is busy (the rest: the GPU waits
    for the host)."""
    import torch  # the GPU machine's image has it; CUPTI sees MLX's kernels too
    from torch.profiler import ProfilerActivity, profile

    torch.zeros(1, device="cuda")
    engines = engine_makers(model, tokenizer, cfg, packed)
    for B in sizes:
        arrivals = arrivals_for(cfg, tokenizer, B, 10 * steps)
        for name, make in engines.items():
            engine = warmed(make(B), arrivals)
            mx.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                start = time.perf_counter()
                made = sum(engine.iterate() for _ in range(steps))
                mx.synchronize()
                wall = time.perf_counter() - start
            engine.close()
            averages = prof.key_averages()
            busy_us = sum(a.self_device_time_total for a in averages)
            launches = sum(a.count for a in averages if a.self_device_time_total > 0)
            top = sorted(averages, key=lambda a: -a.self_device_time_total)[:8]
            emit(
                "kernels",
                engine=name,
                B=B,
                tokens=made,
                step_ms=1e3 * wall / steps,
                gpu_busy_ms=busy_us / 1e3 / steps,
                kernels_per_step=launches / steps,
                top=[
                    (a.key[:60], round(a.self_device_time_total / 1e3 / steps, 3), a.count // steps)
                    for a in top
                ],
            )


def primitives(*outputs: mx.array) -> collections.Counter:
    """Counts of the primitives in the graph that computes ``outputs`` (not evaluated)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "g.dot"
        mx.export_to_dot(str(path), *outputs)
        return collections.Counter(re.findall(r'label ="([^"]+)", shape=rectangle', path.read_text()))


def filled_caches(model, rows: int, context: int):
    """One mlx-lm ``BatchKVCache`` per layer, ``rows`` rows of ``context`` random keys and
    values ``[B, n_kv_heads, S, head_dim]``, no padding."""
    from mlx_lm.models.cache import BatchKVCache

    caches = []
    for _ in model.layers:
        shape = (rows, model.args.num_key_value_heads, context, model.args.head_dim)
        c = BatchKVCache([0] * rows)
        c.update_and_fetch(
            mx.random.normal(shape).astype(model_dtype(model)),
            mx.random.normal(shape).astype(model_dtype(model)),
        )
        caches.append(c)
    mx.eval([c.state for c in caches])
    return caches


def model_dtype(model) -> mx.Dtype:
    """The dtype of the model's embedding weights."""
    return model.model.embed_tokens.weight.dtype


def graph(model, sizes, context: int = 350) -> None:
    """The ``graph`` reading."""
    for B in sizes:
        caches = filled_caches(model, B, context)
        logits = model(mx.zeros((B, 1), dtype=mx.uint32), cache=caches)
        count = primitives(mx.argmax(logits[:, -1, :], axis=-1))
        kernels = sum(n for k, n in count.items() if k not in NO_KERNEL)
        emit("graph", B=B, primitives=sum(count.values()), kernels=kernels, top=count.most_common(12))


class FusedAttention(nn.Module):
    """mlx-lm llama attention with q/k/v as one matmul (``[q; k; v]`` weights), else the same."""

    def __init__(self, attn):
        super().__init__()
        self.attn = attn
        self.qkv = mx.concatenate([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], axis=0)
        hd = attn.q_proj.weight.shape[0] // attn.n_heads
        self.splits = [attn.n_heads * hd, attn.n_heads * hd + attn.n_kv_heads * hd]

    def __call__(self, x, mask=None, cache=None):
        from mlx_lm.models.base import scaled_dot_product_attention

        a = self.attn
        B, L, _ = x.shape
        q, k, v = mx.split(x @ self.qkv.T, self.splits, axis=-1)
        q = q.reshape(B, L, a.n_heads, -1).transpose(0, 2, 1, 3)
        k = k.reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = v.reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q, k = a.rope(q, offset=cache.offset), a.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=a.scale, mask=mask)
        return a.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class FusedMLP(nn.Module):
    """mlx-lm llama MLP with gate and up as one matmul; ``compiled``: SwiGLU under ``mx.compile``."""

    def __init__(self, mlp, compiled: bool):
        super().__init__()
        self.mlp = mlp
        self.gate_up = mx.concatenate([mlp.gate_proj.weight, mlp.up_proj.weight], axis=0)
        self.hidden = mlp.gate_proj.weight.shape[0]
        swiglu = lambda g, u: nn.silu(g) * u  # noqa: E731
        self.swiglu = mx.compile(swiglu) if compiled else swiglu

    def __call__(self, x):
        g, u = mx.split(x @ self.gate_up.T, [self.hidden], axis=-1)
        return self.mlp.down_proj(self.swiglu(g, u))


class LeanBlock(nn.Module):
    """A llama decoder layer for one-token decode steps with few primitives: the hidden
    state stays ``[B, D]`` (no flatten / unflatten around each matmul), q/k/v and gate/up
    are one matmul each over weights stored transposed (no transpose view per call), the
    heads are split by reshapes alone (``L = 1``), the SwiGLU under ``mx.compile``. The
    norms, RoPE, the cache's ``update_and_fetch`` and the attention are mlx-lm's / MLX's."""

    def __init__(self, layer, transposed: bool = True):
        super().__init__()
        a, m = layer.self_attn, layer.mlp
        self.layer, self.transposed = layer, transposed
        store = (lambda w: mx.contiguous(w.T)) if transposed else (lambda w: w)
        self.wqkv = store(mx.concatenate([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        self.wo = store(a.o_proj.weight)
        self.wgu = store(mx.concatenate([m.gate_proj.weight, m.up_proj.weight]))
        self.wd = store(m.down_proj.weight)
        hd = a.q_proj.weight.shape[0] // a.n_heads
        self.hd, self.splits = hd, [a.n_heads * hd, (a.n_heads + a.n_kv_heads) * hd]
        self.hidden = m.gate_proj.weight.shape[0]
        self.swiglu = mx.compile(lambda gu: nn.silu(gu[:, : self.hidden]) * gu[:, self.hidden :])
        mx.eval(self.wqkv, self.wo, self.wgu, self.wd)

    def __call__(self, x, mask, cache):
        from mlx_lm.models.base import scaled_dot_product_attention

        a, B = self.layer.self_attn, x.shape[0]
        mm = (lambda x, w: x @ w) if self.transposed else (lambda x, w: x @ w.T)
        q, k, v = mx.split(mm(self.layer.input_layernorm(x), self.wqkv), self.splits, axis=-1)
        q = a.rope(q.reshape(B, a.n_heads, 1, self.hd), offset=cache.offset)
        k = a.rope(k.reshape(B, a.n_kv_heads, 1, self.hd), offset=cache.offset)
        k, v = cache.update_and_fetch(k, v.reshape(B, a.n_kv_heads, 1, self.hd))
        o = scaled_dot_product_attention(q, k, v, cache=cache, scale=a.scale, mask=mask)
        h = x + mm(o.reshape(B, -1), self.wo)
        return h + mm(self.swiglu(mm(self.layer.post_attention_layernorm(h), self.wgu)), self.wd)


def lean_forward(model, blocks):
    """``tokens [B] -> logits [B, V]`` through :class:`LeanBlock` s (``L = 1``)."""
    from mlx_lm.models.base import create_attention_mask

    inner = model.model

    def forward(tokens, cache):
        h = inner.embed_tokens(tokens)  # [B, D]
        mask = create_attention_mask(h[:, None], cache[0])
        for block, c in zip(blocks, cache):
            h = block(h, mask, c)
        h = inner.norm(h)
        return inner.embed_tokens.as_linear(h) if model.args.tie_word_embeddings else model.lm_head(h)

    return forward


@contextlib.contextmanager
def fused_layers(model, variant: str):
    """Within the block, the model's layers run ``variant``: ``plain``, ``fused`` or
    ``fused+compiled`` (module docstring)."""
    saved = [(layer.self_attn, layer.mlp) for layer in model.layers]
    if variant != "plain":
        for layer, (attn, mlp) in zip(model.layers, saved):
            layer.self_attn, layer.mlp = FusedAttention(attn), FusedMLP(mlp, "compiled" in variant)
    try:
        yield
    finally:
        for layer, (attn, mlp) in zip(model.layers, saved):
            layer.self_attn, layer.mlp = attn, mlp


def pipelined_steps(model, rows: int, steps: int = 30, warm: int = 5, context: int = 350, lean=None):
    """Median seconds per pipelined decode step over ``steps`` (after ``warm``), the step's
    primitive count and the greedy tokens of the last step; ``lean``: a
    :func:`lean_forward` instead of the model's forward."""
    caches = filled_caches(model, rows, context)

    def launch(t):
        if lean is not None:
            return mx.argmax(lean(t, caches), axis=-1).astype(mx.uint32)
        return mx.argmax(model(t.reshape(-1, 1), cache=caches)[:, -1, :], axis=-1).astype(mx.uint32)

    nxt = launch(mx.zeros((rows,), dtype=mx.uint32))
    count = primitives(nxt)
    mx.async_eval(nxt)
    times, toks = [], []
    for _ in range(warm + steps):
        start = time.perf_counter()
        cur, nxt = nxt, launch(nxt)
        mx.async_eval(nxt)
        toks.append(cur.tolist())
        times.append(time.perf_counter() - start)
    return float(np.median(times[warm:])), sum(count.values()), toks


def fused(model, sizes, rounds: int = 3) -> None:
    """The ``fused`` reading, variants alternating over ``rounds``."""
    variants = ["plain", "fused", "fused+compiled", "lean", "lean, weights as stored"]
    leans = {
        "lean": lean_forward(model, [LeanBlock(layer) for layer in model.layers]),
        "lean, weights as stored": lean_forward(model, [LeanBlock(layer, False) for layer in model.layers]),
    }
    for B in sizes:
        times = collections.defaultdict(list)
        prims, tokens = {}, {}
        for r in range(rounds):
            for v in variants if r % 2 == 0 else variants[::-1]:
                mx.random.seed(B)  # the same random caches for every variant
                with fused_layers(model, "plain" if v in leans else v):
                    s, prims[v], tokens[v] = pipelined_steps(model, B, lean=leans.get(v))
                times[v].append(s)
        for v in variants:
            emit(
                "fused",
                B=B,
                variant=v,
                step_ms=1e3 * statistics.median(times[v]),
                range_ms=[1e3 * min(times[v]), 1e3 * max(times[v])],
                primitives=prims[v],
                same_tokens=tokens[v] == tokens["plain"],
            )


def quantized_kv(model, sizes, contexts=(512, 2048)) -> None:
    """The ``quantized_kv`` reading."""
    from workbench.bench.quantized import step_cost

    g = min(64, model.args.head_dim)  # a group spans at most one head's dims
    settings = [(None, g), (8, g), (4, g)]
    for B in sizes:
        for ctx in contexts:
            frame = step_cost(model, B, ctx, settings, repeats=3)
            for row in frame.to_dict("records"):
                emit(
                    "quantized_kv",
                    **{k: (float(v) if isinstance(v, np.floating) else v) for k, v in row.items()},
                )


def packed(model, tokenizer, cfg, sizes) -> None:
    """The ``packed`` reading: padded, packed and mlx-lm, alternating (``gpu_runs``)."""
    for B in sizes:
        make = {
            "padded": lambda B=B: WorkbenchEngine(
                model, tokenizer, B, cfg.prefill_step_size, history_size=64
            ),
            "packed": lambda B=B: WorkbenchEngine(
                model,
                tokenizer,
                B,
                cfg.prefill_step_size,
                history_size=64,
                **PACKED_SETTINGS,
            ),
            "mlx-lm": lambda B=B: MlxLmEngine(model, B, cfg.prefill_step_size),
        }
        runs = gpu_runs(make, arrivals_for(cfg, tokenizer, B, DECODE_TOKENS), 2, echo=lambda _: None)
        for row in runs.to_dict("records"):
            emit(
                "packed",
                **{k: (float(v) if isinstance(v, (np.floating, float)) else v) for k, v in row.items()},
            )


def main() -> None:
    """Run the readings named by ``--parts`` (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--batch", type=int, nargs="+")
    p.add_argument(
        "--parts", nargs="+", default=["anatomy", "kernels", "graph", "fused", "quantized_kv", "packed"]
    )
    args = p.parse_args()
    shape, cfg = (QUICK, GPU_QUICK_CONFIG) if args.quick else (LLAMA_1B, GPU_CONFIG)
    sizes = args.batch or ([1, 8] if args.quick else [1, 32, 128])
    model = make_model(shape, dtype=mx.bfloat16)
    _, tokenizer = load()
    emit("meta", device=str(mx.default_device()), mlx=mx.__version__, shape=shape.name, sizes=sizes)
    steps = {
        "anatomy": lambda: anatomy(model, tokenizer, cfg, sizes),
        "graph": lambda: graph(model, sizes),
        "kernels": lambda: kernels(model, tokenizer, cfg, sizes),
        "packed_kernels": lambda: kernels(model, tokenizer, cfg, [max(sizes)], packed=True),
        "packed_anatomy": lambda: anatomy(model, tokenizer, cfg, [max(sizes)], packed=True),
        "packed_profile": lambda: packed_profile(model, tokenizer, cfg, max(sizes)),
        "fused": lambda: fused(model, sizes),
        "quantized_kv": lambda: quantized_kv(model, [s for s in sizes if s > 1] or sizes),
        "packed": lambda: packed(model, tokenizer, cfg, [max(sizes)]),
    }
    for part in args.parts:
        start = time.perf_counter()
        steps[part]()
        emit("timing", reading=part, seconds=round(time.perf_counter() - start, 1))


if __name__ == "__main__":
    main()
