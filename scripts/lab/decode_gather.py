"""How the packed decode-only CPU forward could read each row's keys, timed in one process
against mlx-lm's own batched forward over ``BatchKVCache`` (the padded layout's forward).

Usage: ``python scripts/lab/decode_gather.py [--rows 1 8 32] [--length 40] [--blocks 15]``
(tiny-llama, the bundled random-weight model ``scripts/lab/packed_speed.py --model tiny-llama``
runs). ``R`` rows of ``--length - 1`` held tokens each decode one token (pages of 16); the same
forward is repeated (it writes the same slots), each variant ``--reps`` times a block, the
variants alternating block by block. Prints per ``R`` each variant's median time per forward
(evaluated with the pools' writes), the median of its per-block ratios to ``vectors``, on the
wall clock and on the process CPU time, whether its logits equal ``vectors``' bit for bit, and
the load average. Then per ``R`` the host side, each right after an evaluated forward (the
state a step's Python meets): the median time to build the forward's graph (no evaluation),
packed and padded, and of it the packed index arrays (``decode_index`` and their four
``mx.array`` copies), over ``--blocks * --reps`` forwards.

``--head-major L ...``: then the attention alone (tiny-llama's heads, random keys, pages of 16
handed out shuffled) at each ``L``, ``R`` rows: the engine's gather of vectors from a pool
``[N, n_kv_heads, head_dim]`` against whole pages gathered from a head-major pool
``[n_kv_heads, N, head_dim]`` (viewed ``[R, n_kv_heads, L, head_dim]`` with rows of
``head_dim`` contiguous: MLX's CPU matmul takes it without a copy and with the transpose flag
the gathered keys get), median µs beyond an evaluation's own and bit-equality.

Variants of :meth:`DecodeRowsLayer.attend <workbench.engine.packed.decode_rows.DecodeRowsLayer.attend>`:

- ``vectors``: the engine's (one gather of ``head_dim`` vectors at ``[R, n_kv_heads, L]`` rows
  of the flat pool, row-contiguous);
- ``pages``: whole pages, ``pool.reshape(pages, page_size * n_kv_heads * head_dim)[page grid]``,
  then a view ``[R, n_kv_heads, L, head_dim]`` (strided: MLX's CPU matmul copies the keys' view
  and calls the BLAS without its transpose flag);
- ``pages, copied``: the same made contiguous (``mx.contiguous``) before the attention;
- ``no gather``: the attention over fixed, already evaluated arrays of the gathered shape (the
  floor a gather-free read could reach; its logits differ);
- ``padded``: mlx-lm's ``[R, 1]`` forward over ``BatchKVCache`` s holding the same rows.
"""

import argparse
import os
import time

from workbench.engine.packed import decode_rows
from workbench.engine.packed.attention import Pools, packed_forward
from workbench.engine.packed.pages import PageTable
from workbench.observe.packed import Chunk
from workbench.runtime.loading import load

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--rows", type=int, nargs="*", default=[1, 8, 32])
parser.add_argument("--length", type=int, default=40, help="positions each row attends to")
parser.add_argument("--blocks", type=int, default=15)
parser.add_argument("--reps", type=int, default=30)
parser.add_argument("--head-major", type=int, nargs="*", default=[], metavar="L")
args = parser.parse_args()

P = 16
model, _ = load("tiny-llama")
VECTORS = decode_rows.DecodeRowsLayer.attend
FIXED: dict = {}


def _pages_view(self, pool: mx.array) -> mx.array:
    N, H, D = pool.shape
    R, _, L = self.flat.shape
    grid = self.flat[:, 0, ::P] // (H * P)  # each row's page ids (slot * H // (H * P))
    W = grid.shape[1]
    return pool.reshape(N // P, P * H * D)[grid].reshape(R, W * P, H, D)[:, :L].transpose(0, 2, 1, 3)


def pages(self, queries, scale):
    k, v = (_pages_view(self, p[self.layer]) for p in (self.pools.keys, self.pools.values))
    return mx.fast.scaled_dot_product_attention(queries, k, v, scale=scale, mask=self.mask)


def pages_copied(self, queries, scale):
    k, v = (mx.contiguous(_pages_view(self, p[self.layer])) for p in (self.pools.keys, self.pools.values))
    return mx.fast.scaled_dot_product_attention(queries, k, v, scale=scale, mask=self.mask)


def no_gather(self, queries, scale):
    R, _, L = self.flat.shape
    key = (R, L, self.layer)
    if key not in FIXED:
        FIXED[key] = mx.random.normal((R, self.flat.shape[1], L, queries.shape[-1]))
        mx.eval(FIXED[key])
    return mx.fast.scaled_dot_product_attention(queries, FIXED[key], FIXED[key], scale=scale, mask=self.mask)


VARIANTS = {"vectors": VECTORS, "pages": pages, "pages, copied": pages_copied, "no gather": no_gather}


def packed_case(R: int):
    table, pools = PageTable(P), Pools(len(model.model.layers))
    held = args.length - 1
    for u in range(R):
        table.reserve(u, held)
    prefill = [Chunk(u, 0, held, "prefill") for u in range(R)]
    tokens = np.random.default_rng(0).integers(1, model.args.vocab_size, held * R).tolist()
    mx.eval(packed_forward(model, pools, table, prefill, tokens), pools.keys, pools.values)
    for u in range(R):
        table.reserve(u, held + 1)
    chunks = [Chunk(u, held, 1, "decode") for u in range(R)]
    ids = mx.array([5] * R, dtype=mx.uint32)

    def forward():
        return [
            packed_forward(model, pools, table, chunks, ids, decode_kernel=False),
            *pools.keys,
            *pools.values,
        ]

    forward.table, forward.chunks = table, chunks
    return forward


def padded_case(R: int):
    caches = [BatchKVCache([0] * R) for _ in model.model.layers]
    held = args.length - 1
    prompt = mx.array(np.random.default_rng(0).integers(1, model.args.vocab_size, (R, held)))
    mx.eval(model(prompt, cache=caches))
    offset, ids = caches[0].offset, mx.array([[5]] * R, dtype=mx.uint32)

    def forward():
        for c in caches:
            c.offset, c._idx = offset, held  # the same step again
        return [model(ids, cache=caches)[:, -1], *(c.keys for c in caches), *(c.values for c in caches)]

    return forward


def host_us(R: int, packed, padded) -> str:
    """Median µs, each right after an evaluated forward: the packed graph's build, its index
    arrays alone, the padded graph's build."""
    decode_rows.DecodeRowsLayer.attend = VECTORS
    table, chunks = packed.table, packed.chunks
    heads = model.model.layers[0].self_attn.n_kv_heads
    got = {"packed build": [], "packed index arrays": [], "padded build": []}
    for _ in range(args.blocks * args.reps):
        for name, run in (
            ("packed build", packed),
            ("packed index arrays", lambda: _index_arrays(table, chunks, heads)),
            ("padded build", padded),
        ):
            mx.eval(packed() if name != "padded build" else padded())
            start = time.perf_counter()
            run()
            got[name].append(time.perf_counter() - start)
    return ", ".join(f"{k} {1e6 * np.median(v):.0f} us" for k, v in got.items())


def _index_arrays(table, chunks, heads):
    ix = decode_rows.decode_index(table, chunks, heads=heads)
    return [mx.array(a) for a in (ix.write, ix.positions, ix.flat, ix.mask) if a is not None]


def timed(name: str, forward) -> np.ndarray:
    decode_rows.DecodeRowsLayer.attend = VARIANTS.get(name, VECTORS)
    mx.eval(forward())
    start = np.array([time.perf_counter(), time.process_time()])
    for _ in range(args.reps):
        mx.eval(forward())
    return (np.array([time.perf_counter(), time.process_time()]) - start) / args.reps


names = [*VARIANTS, "padded"]
for R in args.rows:
    loads = [os.getloadavg()[0]]
    cases, logits = {}, {}
    for name in names:
        cases[name] = padded_case(R) if name == "padded" else packed_case(R)
        decode_rows.DecodeRowsLayer.attend = VARIANTS.get(name, VECTORS)
        logits[name] = np.array(cases[name]()[0])
    got = {name: [] for name in names}
    for b in range(args.blocks):
        for name in names if b % 2 == 0 else names[::-1]:
            got[name].append(timed(name, cases[name]))
    loads.append(os.getloadavg()[0])
    base = np.array(got["vectors"])
    for name in names:
        t = np.array(got[name])
        r = t / base
        same = "n/a" if name == "padded" else np.array_equal(logits[name], logits["vectors"])
        print(
            f"R={R} L={args.length} {name}: {1e3 * np.median(t[:, 0]):.3f} ms, / vectors wall "
            f"{np.median(r[:, 0]):.3f} CPU {np.median(r[:, 1]):.3f}; bit-equal {same}; "
            f"load {min(loads):.2f}-{max(loads):.2f}",
            flush=True,
        )
    print(
        f"R={R} L={args.length} host, after an evaluated forward: {host_us(R, cases['vectors'], cases['padded'])}"
    )
decode_rows.DecodeRowsLayer.attend = VECTORS


def head_major(R: int, L: int) -> str:
    """The attention alone at ``L``: vectors from ``[N, H, D]`` against pages from ``[H, N, D]``."""
    a = model.model.layers[0].self_attn
    H, D, W = a.n_kv_heads, model.args.head_dim, -(-L // P)
    pages, rng = R * W + 3, np.random.default_rng(0)
    N = pages * P
    kp, vp = (mx.array(rng.standard_normal((N, H, D)).astype(np.float32)) for _ in range(2))
    kh, vh = (mx.contiguous(p.transpose(1, 0, 2)) for p in (kp, vp))  # [H, N, D]
    grid_np = rng.permutation(pages)[: R * W].reshape(R, W).astype(np.int32)
    slots = (grid_np[:, :, None] * P + np.arange(P)).reshape(R, W * P)[:, :L]
    grid, flat = mx.array(grid_np), mx.array((slots[:, None, :] * H + np.arange(H)[:, None]).astype(np.int32))
    q = mx.array(rng.standard_normal((R, a.n_heads, 1, D)).astype(np.float32))
    mx.eval(kp, vp, kh, vh, grid, flat, q)

    def vectors():
        k, v = (p.reshape(N * H, D)[flat] for p in (kp, vp))
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=a.scale)

    def pages_of_heads():
        k, v = (
            p.reshape(H, pages, P * D)[:, grid].reshape(H, R, W * P, D)[:, :, :L].transpose(1, 0, 2, 3)
            for p in (kh, vh)
        )
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=a.scale)

    def us(f) -> float:
        mx.eval(f())
        best = []
        for _ in range(args.blocks):
            start = time.perf_counter()
            for _ in range(args.reps):
                mx.eval(f())
            best.append((time.perf_counter() - start) / args.reps)
        return 1e6 * float(np.median(best))

    base = us(lambda: q + 1)
    same = mx.array_equal(vectors(), pages_of_heads()).item()
    return (
        f"vectors {us(vectors) - base:.0f} us, head-major pages {us(pages_of_heads) - base:.0f} us "
        f"(beyond an evaluation's {base:.0f} us); bit-equal {same}"
    )


for L in args.head_major:
    for R in args.rows:
        print(f"attention alone R={R} L={L}: {head_major(R, L)}; load {os.getloadavg()[0]:.2f}", flush=True)
