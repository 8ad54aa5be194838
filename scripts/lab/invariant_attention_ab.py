"""The batch-invariant mode's CPU attention, before (strided reductions) and after (fixed key
blocks through the BLAS), against the default path, in ONE process, alternating (issue 39;
``docs/batch-invariance.md``, "Cost").

Per B: three schedulers hold the same B prompts of 64-68 tokens (the bench's llama-155m in
float32 unless ``--shape quick``): the default path, the mode with
``strided_row_attention`` (main before this change) and the mode with
``key_block_attention``; then ``--pairs`` rounds of one step each, the order rotated every
round, each ended by ``mx.synchronize()``. Prints the median ms per step, the median of
the per-round ratios to the default step and the ratio of process CPU seconds over the
rounds; then the attention alone at B rows over ``--keys`` keys (default 90; llama-155m's
heads: 16 query heads, 4 KV heads, head dim 64) per layer, the three side by side; then llama-155m's KV projection
at B rows padded to 4 (the mode), in blocks of 1-3 rows and plain. ``--out FILE`` appends JSON lines.

    python scripts/lab/invariant_attention_ab.py --batch-sizes 1 8 32 --pairs 24
"""

import argparse
import json
import os
import statistics
import time
from types import SimpleNamespace

import workbench  # noqa: F401  (loads the optimized BLAS before mlx)
from workbench.bench import model as bench_model
from workbench.bench.invariance_cost import _prefilled, _scheduler, prompts_of, rotated_steps, summary
from workbench.engine.levers import invariant
from workbench.engine.levers.invariant_keyblocks import key_block_attention

import mlx.core as mx

NEW = invariant.row_attention


def old(queries, keys, values, starts, scale, longest=None):
    """Main's attention before this change (the argument it lacks is ignored)."""
    return invariant.strided_row_attention(queries, keys, values, starts, scale)


def steps(model, tok, B, pairs):
    scheds = {
        "default": _scheduler(model, tok, B, False),
        "strided": _scheduler(model, tok, B, True),
        "key_blocks": _scheduler(model, tok, B, True),
    }
    use = {"default": NEW, "strided": old, "key_blocks": NEW}
    prompts = prompts_of(model.args.vocab_size, B, 64, 68)
    for name, sched in scheds.items():
        invariant.row_attention = use[name]
        _prefilled(sched, prompts, pairs + 3)
    ms, cpu = rotated_steps(scheds, pairs, before=lambda name: setattr(invariant, "row_attention", use[name]))
    invariant.row_attention = NEW
    return {"B": B, "pairs": pairs, "load": os.getloadavg()[0], **summary(ms, cpu)}


def attention_alone(B, reps=30, H=16, Hkv=4, D=64, S=90):
    k0, k1, k2 = mx.random.split(mx.random.key(0), 3)
    q = mx.random.normal((B, H, 1, D), key=k0)
    k, v = mx.random.normal((B, Hkv, S, D), key=k1), mx.random.normal((B, Hkv, S, D), key=k2)
    pads = [(7 * b) % max(S // 18, 1) for b in range(B)]  # up to 5 columns at 90 keys, 16 at 300
    starts = mx.array(pads, dtype=mx.int32)
    mask = (mx.arange(S)[None, :] >= starts[:, None])[:, None, None, :]
    longest = S - min(pads)
    mx.eval(q, k, v, starts, mask)
    fs = {
        "fused (default path)": lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask),
        "strided": lambda: invariant.strided_row_attention(q, k, v, starts, 0.125),
        "key_blocks": lambda: key_block_attention(q, k, v, starts, 0.125, longest),
    }
    ts = timed(fs, reps)
    return {"B": B, "S": S, "attention_ms": {n: round(statistics.median(t), 3) for n, t in ts.items()}}


def timed(fs, reps):
    """Milliseconds per call of each function in ``fs``, ``reps`` rounds, interleaved."""
    ts = {name: [] for name in fs}
    for _ in range(reps):
        for name, f in fs.items():
            t0 = time.perf_counter()
            mx.eval(f())
            ts[name].append((time.perf_counter() - t0) * 1e3)
    return ts


def kv_projection_alone(B, reps=100, N=256, K=1024):
    """llama-155m's KV projection (256x1024, OpenBLAS switches kernels at 4 rows) at B rows:
    as the mode runs it (rows padded to 4), in blocks of 1-3 rows, and plain (the default)."""
    from workbench.engine.levers.invariant import RowBlocks, blocked

    w, x = mx.random.normal((N, K), key=mx.random.key(1)), mx.random.normal((B, K), key=mx.random.key(2))
    mx.eval(w, x)
    fs = {
        "padded to 4 (the mode)": lambda: blocked(lambda r: r @ w.T, x, RowBlocks(4, 32)),
        "blocks of 1-3": lambda: blocked(lambda r: r @ w.T, x, RowBlocks(1, 3)),
        "plain (default path)": lambda: x @ w.T,
    }
    ts = timed(fs, reps)
    return {"B": B, "kv_projection_ms": {n: round(statistics.median(t), 4) for n, t in ts.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--pairs", type=int, default=24)
    ap.add_argument("--shape", choices=["full", "quick"], default="full")
    ap.add_argument("--keys", type=int, nargs="+", default=[90], help="keys of the attention alone")
    ap.add_argument("--attention-only", action="store_true", help="only the attention alone")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shape = {"full": bench_model.FULL, "quick": bench_model.QUICK}[args.shape]
    model, tok = bench_model.make_model(shape, dtype=mx.float32), SimpleNamespace(eos_token_ids=[])
    lines = []
    for B in [] if args.attention_only else args.batch_sizes:
        lines.append(steps(model, tok, B, args.pairs))
        print(json.dumps(lines[-1]), flush=True)
    for S in args.keys:
        for B in args.batch_sizes:
            lines.append(attention_alone(B, S=S))
            print(json.dumps(lines[-1]), flush=True)
    for B in args.batch_sizes:
        lines.append(kv_projection_alone(B))
        print(json.dumps(lines[-1]), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps({"shape": shape.name, **line}) + "\n" for line in lines)


if __name__ == "__main__":
    main()
