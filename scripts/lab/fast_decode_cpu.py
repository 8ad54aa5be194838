"""The decode fast path on the CPU: one decode forward of the `workbench bench` model (llama-155m,
float32) on a batch cache of 128 tokens per row, without a mask (``fast_decode`` default) and with
mlx-lm's mask, alternating over 12 rounds of 3 steps; prints the median step of each at B = 1 and 32.
The engine-level before / after is ``scripts/lab/decode_ratios.py`` (noisier: it runs whole engines).

Usage: ``python scripts/lab/fast_decode_cpu.py``
"""

import time

from workbench.bench.model import make_model
from workbench.bench.run import FULL_CONFIG as cfg
from workbench.engine.levers import fastpath

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache

model = make_model(cfg.shape)
mx.eval(model.parameters())
for B in (1, 32):
    caches = [BatchKVCache([0] * B) for _ in model.layers]
    mx.eval(model(mx.zeros((B, 128), dtype=mx.uint32), cache=caches))
    res = {True: [], False: []}
    for r in range(12):
        for fast in (True, False) if r % 2 == 0 else (False, True):
            paths = fastpath.FastDecode(fast, False)
            t = time.perf_counter()
            for _ in range(3):
                with fastpath.decode_fast_path(model, caches, [caches[0]._idx] * B, paths):
                    out = model(mx.zeros((B, 1), dtype=mx.uint32), cache=caches)
                mx.eval(out)
                for c in caches:
                    c._idx -= 1
                    c.offset = c.offset - 1
            res[fast].append((time.perf_counter() - t) / 3)
    print(
        B,
        "no mask",
        round(1e3 * np.median(res[True]), 2),
        "mask",
        round(1e3 * np.median(res[False]), 2),
        "ms",
    )
