"""Where a decode step's time goes, on the device MLX runs on (issue 15: B = 128 runs at ~10x
its memory bound in both engines). For a random llama of the GPU benchmark's shape, at each
batch size, over left-padded rows prefilled to a context of about ``--context`` tokens:

- ``build_ms``: Python time to build one decode forward's graph (mlx-lm's model and
  ``BatchKVCache``), no evaluation;
- ``sync_ms``: build + ``mx.eval`` of that step, one at a time;
- ``pipelined_ms``: mlx-lm's loop (build step n+1 while step n runs, ``mx.async_eval``);
- ``nomask_ms``: the same loop with ``make_mask`` returning ``None`` (timing only: padded
  rows then attend their padding);
- ``attn_mask_ms`` / ``attn_nomask_ms``: the layers' attention alone (``mx.fast.
  scaled_dot_product_attention`` x layers in one eval) with and without the padding mask;
- ``static_ms``: the whole step under ``mx.compile`` over fixed-size KV buffers, written at
  a write index passed as an array (``mx.slice_update``), the padding mask computed from
  arrays: one compiled graph per buffer size, no Python per layer. ``static_equal``: its
  greedy tokens equal mlx-lm's path over the same steps.

Usage: ``python scripts/lab/gpu_step_profile.py [--quick] [--batch 1 8 32 128] [--out FILE]``
(prints one JSON line per batch size; ``--quick`` uses the tiny shape, for a CPU check).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workbench.bench.gpu import LLAMA_1B  # noqa: E402
from workbench.bench.model import QUICK, make_model  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import BatchKVCache  # noqa: E402


def prefilled(model, B: int, context: int, seed: int = 0):
    """``B`` left-padded rows (padding 0..context/2) prefilled to ``context`` columns."""
    pads = [0] if B == 1 else [(37 * i) % (context // 2) for i in range(B)]
    caches = [BatchKVCache(pads) for _ in model.layers]
    mx.random.seed(seed)
    toks = mx.random.randint(0, model.args.vocab_size, (B, context))
    for s in range(0, context, 512):
        logits = model(toks[:, s : s + 512], cache=caches)
        mx.eval(logits, [c.state[:2] for c in caches])
    return caches, mx.argmax(logits[:, -1:], axis=-1)


def timed_sync(model, caches, y, n):
    build, total = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        logits = model(y, cache=caches)
        y = mx.argmax(logits[:, -1:], axis=-1)
        t1 = time.perf_counter()
        mx.eval(y, [c.state[:2] for c in caches])
        t2 = time.perf_counter()
        build.append(t1 - t0)
        total.append(t2 - t1 + (t1 - t0))
    return statistics.median(build) * 1e3, statistics.median(total) * 1e3, y


def timed_pipelined(model, caches, y, n):
    """mlx-lm's generate loop: the graph of step n+1 is built while step n runs."""

    def step(y):
        logits = model(y, cache=caches)
        return mx.argmax(logits[:, -1:], axis=-1)

    nxt = step(y)
    mx.async_eval(nxt)
    tokens = []
    t0 = time.perf_counter()
    for _ in range(n):
        cur = nxt
        nxt = step(cur)
        mx.async_eval(nxt)
        tokens.append(cur.tolist())
    mx.eval(nxt)
    return (time.perf_counter() - t0) / n * 1e3, nxt, tokens


class StaticCache:
    """A fixed-size KV buffer ``[B, n_kv_heads, S, head_dim]`` written at ``idx`` (an array),
    with the left-padding mask computed from arrays: compilable."""

    def __init__(self, keys, values, idx, left_padding):
        self.keys, self.values, self.idx, self.left_padding = keys, values, idx, left_padding

    @property
    def offset(self):
        return self.idx - self.left_padding  # [B] positions of the token being written

    def update_and_fetch(self, k, v):
        self.keys = mx.slice_update(self.keys, k, self.idx, axes=(2,))
        self.values = mx.slice_update(self.values, v, self.idx, axes=(2,))
        return self.keys, self.values

    def make_mask(self, N, return_array=False, **kwargs):
        pos = mx.arange(self.keys.shape[2])
        valid = (pos[None] >= self.left_padding[:, None]) & (pos[None] <= self.idx)
        return valid[:, None, None, :]


def static_from(caches, size):
    """Buffers of ``size`` columns holding what mlx-lm's caches hold."""
    kv = []
    for c in caches:
        k, v = c.keys[..., : c._idx, :], c.values[..., : c._idx, :]
        pad = [(0, 0), (0, 0), (0, size - c._idx), (0, 0)]
        kv += [mx.pad(k, pad), mx.pad(v, pad)]
    mx.eval(kv)
    return kv, mx.array([caches[0]._idx]), caches[0].left_padding


def timed_static(model, caches, y, n):
    L = len(model.layers)

    def fwd(y, idx, left_padding, *kv):
        sc = [StaticCache(kv[2 * i], kv[2 * i + 1], idx, left_padding) for i in range(L)]
        logits = model(y, cache=sc)
        return (mx.argmax(logits[:, -1:], axis=-1), idx + 1, *[a for c in sc for a in (c.keys, c.values)])

    f = mx.compile(fwd)
    size = ((caches[0]._idx + n + 2 + 255) // 256) * 256
    kv, idx, lp = static_from(caches, size)
    out = f(y, idx, lp, *kv)
    mx.eval(out)  # the compile, untimed
    y, idx, kv = out[0], out[1], list(out[2:])
    tokens = []
    t0 = time.perf_counter()
    for _ in range(n):
        out = f(y, idx, lp, *kv)
        del kv
        mx.async_eval(out)
        tokens.append(y.tolist())
        y, idx, kv = out[0], out[1], list(out[2:])  # noqa: F841 (the next iteration's call reads kv)
        del out
    mx.eval(y)
    return (time.perf_counter() - t0) / n * 1e3, tokens


@contextlib.contextmanager
def padded_kernel(model):
    """Decode attention over padded rows by ``workbench.engine.levers.padded_attention`` (CUDA)."""
    from workbench.engine.levers.padded_attention import padded_decode_attention, supported

    mod = sys.modules[type(model.layers[0].self_attn).__module__]
    original = mod.scaled_dot_product_attention

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        if (
            isinstance(cache, BatchKVCache)
            and mask is not None
            and sinks is None
            and supported(queries, keys)
        ):
            return padded_decode_attention(
                queries, cache.keys, cache.values, cache.left_padding, cache._idx, scale
            )
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    mod.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        mod.scaled_dot_product_attention = original


def timed_attention(caches, n_heads, with_mask, n=20):
    c0 = caches[0]
    B, H, _, D = c0.keys.shape
    q = mx.random.normal((B, n_heads, 1, D)).astype(c0.keys.dtype)
    ks = [c.keys[..., : c._idx, :] for c in caches]
    vs = [c.values[..., : c._idx, :] for c in caches]
    mask = c0.make_mask(1)[..., : c0._idx] if with_mask else None
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        outs = [
            mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask) for k, v in zip(ks, vs)
        ]
        mx.eval(outs)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def profile(model, B, context, n):
    row = {"B": B, "context": context, "device": str(mx.default_device())}
    caches, y = prefilled(model, B, context)
    mx.eval(y)
    row["attn_mask_ms"] = timed_attention(caches, model.args.num_attention_heads, True)
    row["attn_nomask_ms"] = timed_attention(caches, model.args.num_attention_heads, False)
    # the compiled static step first: it starts from the same cache state as the plain loop
    row["static_ms"], static_tokens = timed_static(model, caches, y, n)
    row["pipelined_ms"], _, plain_tokens = timed_pipelined(model, caches, y, n)
    row["static_equal"] = static_tokens == plain_tokens
    if mx.cuda.is_available():
        k_caches, k_y = prefilled(model, B, context)
        with padded_kernel(model):
            row["kernel_ms"], _, kernel_tokens = timed_pipelined(model, k_caches, k_y, n)
        row["kernel_tokens_equal"] = sum(a == b for a, b in zip(kernel_tokens, plain_tokens))
        row["kernel_tokens_of"] = len(plain_tokens)
        del k_caches
    row["build_ms"], row["sync_ms"], y = timed_sync(model, caches, mx.array(plain_tokens[-1]), n)
    original = BatchKVCache.make_mask
    BatchKVCache.make_mask = lambda self, N, **kw: None
    try:
        row["nomask_ms"], _, _ = timed_pipelined(model, caches, y, n)
    finally:
        BatchKVCache.make_mask = original
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the tiny shape, 48 columns, 6 steps: a CPU check")
    ap.add_argument(
        "--batch", type=int, nargs="+", default=[1, 8, 32, 128], help="batch sizes (default 1 8 32 128)"
    )
    ap.add_argument(
        "--context", type=int, default=384, help="columns the rows are prefilled to (default 384)"
    )
    ap.add_argument("--steps", type=int, default=40, help="decode steps timed per variant (default 40)")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON lines to this file")
    a = ap.parse_args()
    shape = QUICK if a.quick else LLAMA_1B
    model = make_model(shape, dtype=mx.bfloat16 if not a.quick else mx.float32)
    emit_jsonl(
        (profile(model, B, a.context if not a.quick else 48, a.steps if not a.quick else 6) for B in a.batch),
        a.out,
    )


def emit_jsonl(rows, out: Path | None) -> None:
    """Print each row (a dict) as a JSON line as it comes; then write them all to ``out``."""
    kept = []
    for row in rows:
        print(json.dumps(row), flush=True)
        kept.append(row)
    if out:
        out.write_text("\n".join(json.dumps(r) for r in kept) + "\n")


if __name__ == "__main__":
    main()
