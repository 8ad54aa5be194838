"""Can a projection whose kernel switches above ``clean`` rows run ``B > clean`` rows in one
batched call with the bits it has at ``M = 2`` (issue 39, B = 128 on CUDA)? The 1B-shaped
llama's ``down_proj`` (``[M, 8192] @ W.T``, ``W`` ``[2048, 8192]``, bf16) keeps a row's bits
from ``M = 2`` to 72 on an H100 and the batch-invariant mode runs 128 rows as two calls and a
concatenate. Here the rows are zero-padded to ``nb * block`` and run as one ``[nb, block, K]``
matmul (``plain``: a contiguous reshape, which MLX may fold into one ``[nb * block, K]`` call;
``gapped``: a ``[nb, block + 1, K]`` buffer read as ``[:, :block]``, so the batch stride is
not ``block * K`` and the batch stays a batch). Per variant and ``M``: whether a probe row's
bits equal its bits at ``M = 2`` (among other neighbours too, and at another place); then the
launch (the wall time inside ``mx.async_eval``) and step time of 16 such projections at
``M = 128``: two calls + concatenate (the mode today), each variant, and one plain call (the
default path). JSON lines.

    python scripts/lab/gpu_batched_blocks.py --device gpu
"""

import argparse
import json
import statistics
import time

import workbench  # noqa: F401

import mlx.core as mx


def plain_blocks(x, w, block):
    M, K = x.shape
    nb = -(-M // block)
    xp = mx.concatenate([x, mx.zeros((nb * block - M, K), x.dtype)]) if nb * block > M else x
    return (xp.reshape(nb, block, K) @ w.T).reshape(nb * block, -1)[:M]


def gapped_blocks(x, w, block):
    M, K = x.shape
    nb = -(-M // block)
    xp = mx.concatenate([x, mx.zeros((nb * block - M, K), x.dtype)]).reshape(nb, block, K)
    buf = mx.concatenate([xp, mx.zeros((nb, 1, K), x.dtype)], axis=1)
    return (buf[:, :block] @ w.T).reshape(nb * block, -1)[:M]


def two_calls(x, w, clean):
    return mx.concatenate([x[i : i + clean] @ w.T for i in range(0, x.shape[0], clean)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--clean", type=int, default=72)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    gpu = args.device == "gpu"
    # (N, K, block): the 1B shape's down_proj (clean to 72 rows) and its 2048-wide projections
    # (clean to 300 rows: the mode's blocks of 256), as in prefill's [rows, K] calls
    shapes = [(2048, 8192, args.block), (2048, 2048, 256), (8192, 2048, 256)] if gpu else [(256, 1024, 64)]
    for N, K, block in shapes:
        w = mx.random.normal((N, K), key=mx.random.key(1)).astype(mx.bfloat16)
        pool = mx.random.normal((2 * 1400, K), key=mx.random.key(2)).astype(mx.bfloat16)
        probe = mx.random.normal((1, K), key=mx.random.key(3)).astype(mx.bfloat16)
        mx.eval(w, pool, probe)
        ref = (mx.concatenate([probe, pool[:1]]) @ w.T)[0]
        variants = {
            "plain": lambda x, w=w, block=block: plain_blocks(x, w, block),
            "gapped": lambda x, w=w, block=block: gapped_blocks(x, w, block),
            "one_call": lambda x, w=w: x @ w.T,
        }
        rows = (2, 8, 64, block, block + 1, 80, 96, 128, 144, 200, 256, 300, 513, 1218, 1400)
        for name, f in variants.items():
            bad = []
            for M in rows:
                for p, others in (
                    ((3 * M) // 4, pool[:M]),
                    ((3 * M) // 4, pool[1400 : 1400 + M]),
                    (0, pool[:M]),
                ):
                    x = mx.concatenate([others[:p], probe, others[p : M - 1]])
                    if not mx.array_equal(f(x)[p], ref).item():
                        bad.append((M, p))
            line = {"variant": name, "N": N, "K": K, "block": block, "rows_unlike_M2": bad}
            print(json.dumps(line), flush=True)
    N, K = shapes[0][:2]
    pool = mx.random.normal((128, K), key=mx.random.key(2)).astype(mx.bfloat16)
    ws = [mx.random.normal((N, K), key=mx.random.key(10 + i)).astype(mx.bfloat16) for i in range(16)]
    x = pool
    mx.eval(ws, x)
    chains = {
        "two_calls_concat": lambda v, w_: two_calls(v, w_, args.clean),
        "plain": lambda v, w_: plain_blocks(v, w_, args.block),
        "gapped": lambda v, w_: gapped_blocks(v, w_, args.block),
        "one_call_default": lambda v, w_: v @ w_.T,
    }
    for name, f in chains.items():
        launch, total = [], []
        for _ in range(args.steps + 3):
            t0 = time.perf_counter()
            outs = [f(x, w_) for w_ in ws]
            t1 = time.perf_counter()
            mx.async_eval(outs)
            t2 = time.perf_counter()
            mx.eval(outs)
            launch.append(t2 - t1)
            total.append(time.perf_counter() - t0)
        line = {"chain": name, "M": 128, "projections": 16}
        line |= {"launch_ms": round(1e3 * statistics.median(launch[3:]), 3)}
        line |= {"step_ms": round(1e3 * statistics.median(total[3:]), 3)}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
