"""How the packed decode-only CPU forward could read each row's keys, timed in one process
against mlx-lm's own batched forward over ``BatchKVCache`` (the padded layout's forward).

Usage: ``python scripts/lab/decode_gather.py [--rows 1 8 32] [--length 40] [--blocks 15]``
(tiny-llama, the bundled random-weight model ``scripts/lab/packed_speed.py --model tiny-llama``
runs). ``R`` rows of ``--length - 1`` held tokens each decode one token (pages of 16); the same
forward is repeated (it writes the same slots), each variant ``--reps`` times a block, the
variants alternating block by block. Prints per ``R`` each variant's median time per forward
(evaluated with the pools' writes), the median of its per-block ratios to ``vectors``, on the
wall clock and on the process CPU time, whether its logits equal ``vectors``' bit for bit, and
the load average.

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
    return lambda: [
        packed_forward(model, pools, table, chunks, ids, decode_kernel=False),
        *pools.keys,
        *pools.values,
    ]


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
decode_rows.DecodeRowsLayer.attend = VECTORS
