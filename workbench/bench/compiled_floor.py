"""The floor of a decode step on this MLX (issue 40's GPU goals: the packed step at B = 128
<= 4 ms, host time <= 1 ms a step, B = 1 >= 40% of the weight-read bound): the whole one-token
step of an mlx-lm llama under ``mx.compile``, every shape fixed, no Python per layer, run
pipelined as the engines run theirs. No engine written over MLX's Python API (which offers no
captured CUDA graph) launches a step for less; where a goal is below this floor, it is out of
reach of any engine's code on this MLX. ``scripts/lab/compiled_step_floor.py`` runs it beside
mlx-lm's model; ``workbench bench --device gpu --packed`` measures it per B in its run.

Knows: mlx-lm's llama layers (``self_attn`` with ``q_proj`` / ``k_proj`` / ``v_proj`` /
``o_proj`` / ``rope``, ``mlp`` with ``gate_proj`` / ``up_proj`` / ``down_proj``, the norms, a
tied or untied read-out), ``mx.compile``, ``mx.async_eval``. Must not know: the engines.

Axis letters: ``B`` rows, ``S_max`` the fixed buffer's positions, ``D`` hidden size.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn


def compiled_step(model: Any, S_max: int, logits: bool = False) -> Callable[..., tuple[mx.array, list, list]]:
    """``(tokens [B] uint32, pos [1] int32, keys, values) -> (next tokens [B], keys, values)``
    for ``model`` (an mlx-lm llama), ``keys`` / ``values`` lists of per-layer
    ``[B, n_kv_heads, S_max, head_dim]`` buffers, under ``mx.compile``: each layer writes its
    keys and values at column ``pos`` (``mx.slice_update``) and attends **all** ``S_max``
    columns with no mask (MLX's fused one-query attention, the kernel an engine's decode step
    gets; a mask sends CUDA to the masked fallback, GPU-bound at B = 128); greedy tokens out
    (``logits=True``: the ``[B, vocab]`` logits instead). The callers keep ``S_max = pos + 1``,
    so every column is one the step attends. Mirrors one decode step of mlx-lm's
    ``BatchGenerator`` (no left padding: every row at the same position).

    Raises:
        AttributeError: ``model`` is not llama-shaped (a layer without those projections)."""
    inner, args = model.model, model.args
    H, Hkv, hd = args.num_attention_heads, args.num_key_value_heads, args.head_dim

    def step(tokens: mx.array, pos: mx.array, keys: list, values: list) -> tuple[mx.array, list, list]:
        B = tokens.shape[0]
        h = inner.embed_tokens(tokens)  # [B, D]
        offset = mx.broadcast_to(
            pos, (B,)
        )  # [B]: CUDA's RoPE reads an array offset per row (a [1] one: row 0 only)
        new_k, new_v = [], []
        for layer, K, V in zip(inner.layers, keys, values):
            a, m = layer.self_attn, layer.mlp
            x = layer.input_layernorm(h)
            q = a.rope(a.q_proj(x).reshape(B, H, 1, hd), offset=offset)
            k = a.rope(a.k_proj(x).reshape(B, Hkv, 1, hd), offset=offset)
            v = a.v_proj(x).reshape(B, Hkv, 1, hd)
            K = mx.slice_update(K, k, pos, axes=(2,))
            V = mx.slice_update(V, v, pos, axes=(2,))
            o = mx.fast.scaled_dot_product_attention(q, K, V, scale=a.scale)
            h = h + a.o_proj(o.reshape(B, H * hd))
            x = layer.post_attention_layernorm(h)
            h = h + m.down_proj(nn.silu(m.gate_proj(x)) * m.up_proj(x))
            new_k.append(K)
            new_v.append(V)
        normed = inner.norm(h)
        out = inner.embed_tokens.as_linear(normed) if args.tie_word_embeddings else model.lm_head(normed)
        return (out if logits else mx.argmax(out, axis=-1).astype(mx.uint32)), new_k, new_v

    return mx.compile(step)


def pipelined(launch: Callable[[mx.array], mx.array], B: int, steps: int, warm: int) -> tuple[float, float]:
    """Run ``warm + steps`` pipelined steps (launch step ``t + 1``, then read step ``t``'s
    tokens with ``tolist``, as the engines do) of ``launch`` (``tokens [B] -> next tokens``).
    Returns the medians over the last ``steps`` of the step's wall time and of the time inside
    ``mx.async_eval`` (MLX's launch), in seconds. Mirrors the pipelining of mlx-lm's
    ``BatchGenerator._next`` (the next step launched before the current tokens are read).
    Raises what ``launch`` raises."""
    times, launches = [], []
    nxt = launch(mx.zeros((B,), dtype=mx.uint32))
    mx.async_eval(nxt)
    for _ in range(warm + steps):
        start = time.perf_counter()
        cur, nxt = nxt, launch(nxt)
        launched = time.perf_counter()
        mx.async_eval(nxt)
        launches.append(time.perf_counter() - launched)
        cur.tolist()
        times.append(time.perf_counter() - start)
    return statistics.median(times[warm:]), statistics.median(launches[warm:])


def step_floor(model: Any, B: int, context: int, steps: int = 40, warm: int = 5) -> dict[str, float]:
    """The compiled step's cost at ``B`` rows over ``context`` cached positions plus the new
    one (random keys and values in the model's dtype; a fixed seed): ``floor_step_ms`` (the
    median pipelined step) and ``floor_launch_ms`` (the time inside ``mx.async_eval``: MLX's
    dispatch of the compiled graph, the host's floor), in milliseconds. Every step writes
    column ``context`` of ``[B, n_kv_heads, context + 1, head_dim]`` buffers and attends all
    of them: the same work each step, that of a decode step at ``context + 1`` keys (a position
    that moved would need a mask or a growing buffer, and a mask is CUDA's slow path).

    Raises:
        ValueError: ``B``, ``context`` or ``steps`` below 1, or ``warm`` below 0.

    No mlx-lm counterpart: mlx-lm runs its model uncompiled (:func:`agrees_with_mlx_lm` checks
    the two compute the same step)."""
    if B < 1 or context < 1 or steps < 1 or warm < 0:
        raise ValueError(
            f"step_floor needs B, context, steps >= 1 and warm >= 0, got {B}, {context}, {steps}, {warm}"
        )
    args, dtype = model.args, model.model.embed_tokens.weight.dtype
    shape = (B, args.num_key_value_heads, context + 1, args.head_dim)
    keys = mx.random.split(mx.random.key(B), 2 * len(model.layers))
    buffers = [mx.random.normal(shape, key=k).astype(dtype) for k in keys]
    state = {"k": buffers[0::2], "v": buffers[1::2]}
    mx.eval(state["k"], state["v"])
    step, pos = compiled_step(model, context + 1), mx.array([context], dtype=mx.int32)

    def launch(tokens: mx.array) -> mx.array:
        nxt, state["k"], state["v"] = step(tokens, pos, state["k"], state["v"])
        return nxt

    step_s, launch_s = pipelined(launch, B, steps, warm)
    return {"floor_step_ms": 1e3 * step_s, "floor_launch_ms": 1e3 * launch_s}


# How far the compiled step's logits may stray from mlx-lm's, as a share of the largest logit:
# float32 computes the same sums (1e-4 leaves the order of summation); a half dtype rounds each
# op's output, and ``mx.compile`` fuses elementwise ops (rounding once where the plain forward
# rounds each), so bf16 / fp16 get the half dtypes' few significant bits (2e-2).
AGREEMENT_TOLERANCE = {"float32": 1e-4, "half": 2e-2}


def agrees_with_mlx_lm(model: Any, B: int = 4, context: int = 20) -> bool:
    """One step of :func:`compiled_step` and of mlx-lm's model over the same keys and values:
    True when their logits ``[B, vocab]`` agree within :data:`AGREEMENT_TOLERANCE` of the
    largest logit for the model's dtype (the floor is of the same computation; greedy tokens of
    random bf16 weights flip on near-ties, so tokens alone cannot say). The tokens ``[B]``, the
    keys and values ``[B, n_kv_heads, context, head_dim]`` random in the model's dtype. Mirrors
    mlx-lm's model called over ``BatchKVCache`` s as ``BatchGenerator`` calls it. Raises what
    the model's forward raises."""
    from mlx_lm.models.cache import BatchKVCache

    args, dtype = model.args, model.model.embed_tokens.weight.dtype
    shape = (B, args.num_key_value_heads, context, args.head_dim)
    column = mx.zeros((B, args.num_key_value_heads, 1, args.head_dim), dtype=dtype)  # the step writes it
    caches, keys, values = [], [], []
    for i in range(len(model.layers)):
        k = mx.random.normal(shape, key=mx.random.key(2 * i)).astype(dtype)
        v = mx.random.normal(shape, key=mx.random.key(2 * i + 1)).astype(dtype)
        c = BatchKVCache([0] * B)
        c.update_and_fetch(k, v)
        caches.append(c)
        keys.append(mx.concatenate([k, column], axis=2))
        values.append(mx.concatenate([v, column], axis=2))
    tokens = mx.arange(1, B + 1).astype(mx.uint32)
    plain = model(tokens.reshape(-1, 1), cache=caches)[:, -1, :].astype(mx.float32)
    step = compiled_step(model, context + 1, logits=True)
    got = step(tokens, mx.array([context], dtype=mx.int32), keys, values)[0].astype(mx.float32)
    tol = AGREEMENT_TOLERANCE["float32" if dtype == mx.float32 else "half"]
    return bool(mx.max(mx.abs(plain - got)) <= tol * mx.max(mx.abs(plain)))
