"""The floor of a decode step's host time on MLX 0.32 (issue 40's GPU goals: host <= 1 ms at
B = 128, B = 128 <= 4 ms, B = 1 >= 40% of the weight-read bound): the whole one-token step of
the 1B-shaped llama under ``mx.compile`` with every shape fixed, against mlx-lm's model
called as the engines call it, on the same caches, pipelined the same way.

The compiled step (:func:`compiled_step`) takes the tokens ``[B]``, the write position (an
array, so one trace serves every step) and per layer fixed-size key and value buffers
``[B, n_kv_heads, S_max, head_dim]``; it writes the step's keys and values with
``mx.slice_update`` at the position, attends all ``S_max`` columns under a mask of the
written ones (MLX's fused attention), and returns the greedy tokens and the new buffers. No
Python runs per layer after the first trace: what is left of the host's time is MLX's own
dispatch of the compiled graph's kernels. So no engine written over MLX 0.32's Python API
(which offers no captured CUDA graph) launches a step for less than this; if it misses a
goal, the goal is out of reach of the engine's code on this MLX.

Per B, alternating ``--rounds`` times: ``plain`` (mlx-lm's model over ``BatchKVCache`` s) and
``compiled``: median ms per pipelined step (launch step t + 1, then read step t), the time
inside ``mx.async_eval`` (launch) and the graph's primitives. JSON lines.

    python scripts/lab/compiled_step_floor.py --device gpu --batch 1 32 128
    python scripts/lab/compiled_step_floor.py --quick            # the CPU, a small shape
"""

import argparse
import json
import statistics
import time
from dataclasses import replace

import workbench  # noqa: F401  (first: TF32 off, the optimized CPU BLAS)
from workbench.bench.gpu import LLAMA_1B
from workbench.bench.model import QUICK, make_model

import mlx.core as mx
import mlx.nn as nn


def compiled_step(model, S_max: int):
    """``(tokens [B] uint32, pos [1] int32, keys, values) -> (next tokens [B], keys, values)``
    for ``model`` (mlx-lm llama), ``keys`` / ``values`` lists of per-layer
    ``[B, n_kv_heads, S_max, head_dim]`` buffers, under ``mx.compile``."""
    inner, args = model.model, model.args
    H, Hkv = args.num_attention_heads, args.num_key_value_heads
    hd = args.head_dim

    def step(tokens, pos, keys, values):
        B = tokens.shape[0]
        h = inner.embed_tokens(tokens)  # [B, D]
        valid = (mx.arange(S_max) <= pos)[None, None, None, :]  # [1, 1, 1, S_max]
        new_k, new_v = [], []
        for layer, K, V in zip(inner.layers, keys, values):
            a, m = layer.self_attn, layer.mlp
            x = layer.input_layernorm(h)
            q = a.rope(a.q_proj(x).reshape(B, H, 1, hd), offset=pos)
            k = a.rope(a.k_proj(x).reshape(B, Hkv, 1, hd), offset=pos)
            v = a.v_proj(x).reshape(B, Hkv, 1, hd)
            K = mx.slice_update(K, k, pos, axes=(2,))
            V = mx.slice_update(V, v, pos, axes=(2,))
            o = mx.fast.scaled_dot_product_attention(q, K, V, scale=a.scale, mask=valid)
            h = h + a.o_proj(o.reshape(B, H * hd))
            x = layer.post_attention_layernorm(h)
            h = h + m.down_proj(nn.silu(m.gate_proj(x)) * m.up_proj(x))
            new_k.append(K)
            new_v.append(V)
        logits = (
            model.lm_head(inner.norm(h))
            if not args.tie_word_embeddings
            else inner.embed_tokens.as_linear(inner.norm(h))
        )
        return mx.argmax(logits, axis=-1).astype(mx.uint32), new_k, new_v

    return mx.compile(step)


def primitives(*outputs) -> int:
    import re
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".dot") as f:
        mx.export_to_dot(f.name, *outputs)
        return len(re.findall(r"label =", open(f.name).read()))


def run_plain(model, B, context, steps, warm):
    from mlx_lm.models.cache import BatchKVCache

    args, dt = model.args, model.model.embed_tokens.weight.dtype
    caches = []
    for _ in model.layers:
        c = BatchKVCache([0] * B)
        shape = (B, args.num_key_value_heads, context, args.head_dim)
        c.update_and_fetch(mx.random.normal(shape).astype(dt), mx.random.normal(shape).astype(dt))
        caches.append(c)
    mx.eval([c.state for c in caches])

    def launch(t):
        return mx.argmax(model(t.reshape(-1, 1), cache=caches)[:, -1, :], axis=-1).astype(mx.uint32)

    return pipelined(launch, B, steps, warm)


def run_compiled(model, B, context, steps, warm):
    args, dt = model.args, model.model.embed_tokens.weight.dtype
    S_max = context + warm + steps + 8
    shape = (B, args.num_key_value_heads, S_max, args.head_dim)
    state = {
        "k": [mx.random.normal(shape).astype(dt) for _ in model.layers],
        "v": [mx.random.normal(shape).astype(dt) for _ in model.layers],
        "pos": context,
    }
    mx.eval(state["k"], state["v"])
    step = compiled_step(model, S_max)

    def launch(t):
        nxt, state["k"], state["v"] = step(
            t, mx.array([state["pos"]], dtype=mx.int32), state["k"], state["v"]
        )
        state["pos"] += 1
        return nxt

    return pipelined(launch, B, steps, warm)


def pipelined(launch, B, steps, warm):
    real = mx.async_eval
    inside = [0.0]

    def timed(*a):
        t = time.perf_counter()
        real(*a)
        inside[0] += time.perf_counter() - t

    nxt = launch(mx.zeros((B,), dtype=mx.uint32))
    count = primitives(nxt)
    mx.async_eval(nxt)
    times, launches = [], []
    for _ in range(warm + steps):
        inside[0] = 0.0
        start = time.perf_counter()
        cur, nxt = nxt, launch(nxt)
        timed(nxt)
        cur.tolist()
        times.append(time.perf_counter() - start)
        launches.append(inside[0])
    return statistics.median(times[warm:]), statistics.median(launches[warm:]), count


def agrees(model, B=4, context=20) -> float:
    """One step of the compiled step and of
    mlx-lm's model over the same keys and values (the compiled step's buffers hold them in
    their first ``context`` columns); True when the tokens are equal."""
    from mlx_lm.models.cache import BatchKVCache

    args, dt = model.args, model.model.embed_tokens.weight.dtype
    shape = (B, args.num_key_value_heads, context, args.head_dim)
    pad = mx.zeros((B, args.num_key_value_heads, 8, args.head_dim), dtype=dt)
    caches, keys, values = [], [], []
    for _ in model.layers:
        k, v = mx.random.normal(shape).astype(dt), mx.random.normal(shape).astype(dt)
        c = BatchKVCache([0] * B)
        c.update_and_fetch(k, v)
        caches.append(c)
        keys.append(mx.concatenate([k, pad], axis=2))
        values.append(mx.concatenate([v, pad], axis=2))
    tokens = mx.arange(1, B + 1).astype(mx.uint32)
    plain = mx.argmax(model(tokens.reshape(-1, 1), cache=caches)[:, -1, :], axis=-1)
    got, _, _ = compiled_step(model, context + 8)(tokens, mx.array([context], dtype=mx.int32), keys, values)
    return plain.tolist() == got.tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--quick", action="store_true", help="the small CPU shape")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--context", type=int, default=350)
    args = ap.parse_args()
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    shape = QUICK if args.quick else replace(LLAMA_1B, tie_word_embeddings=False)
    model = make_model(shape, dtype=mx.float32 if args.quick else mx.bfloat16)
    print(json.dumps({"compiled_tokens_equal_plain": agrees(model)}), flush=True)
    for B in args.batch:
        got = {"plain": [], "compiled": []}
        for r in range(args.rounds):
            for name in ("plain", "compiled") if r % 2 == 0 else ("compiled", "plain"):
                mx.random.seed(B)
                fn = run_plain if name == "plain" else run_compiled
                got[name].append(fn(model, B, args.context, args.steps, 5))
        for name, runs in got.items():
            line = {
                "B": B,
                "engine": name,
                "shape": shape.name,
                "device": args.device,
                "step_ms": round(1e3 * statistics.median(r[0] for r in runs), 3),
                "step_ms_rounds": [round(1e3 * r[0], 3) for r in runs],
                "launch_ms": round(1e3 * statistics.median(r[1] for r in runs), 3),
                "primitives": runs[0][2],
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
