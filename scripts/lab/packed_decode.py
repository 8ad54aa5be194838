"""Decode tok/s at fixed B of the packed layout against the padded one (issue 27's goal: >= 0.97x)
and both against mlx-lm's BatchGenerator: the decode section of ``workbench bench --packed``
alone, with more alternating pairs, printing every pair's ratio and the load.

Usage: ``python scripts/lab/packed_decode.py [pairs] [B ...]`` (default 5 pairs at B = 8). The
bench's model (tiny-llama), ``max_batch`` 8, chunks / token budget of 512, pages of 16, prompts of
16 tokens, 24 new tokens each (``workbench.bench.packed.factories``,
``workbench.bench.scenarios.decode_runs``: a warm-up run of each engine, then alternating pairs).
Also the packed layout with ``pipeline=False`` in the same alternation: the before / after of the
pipelined packed step.
"""

import os
import sys

from workbench.bench.packed import (
    CHUNK_TOKENS,
    MAX_BATCH,
    PACKED,
    PADDED,
    PAGE_TOKENS,
    TrackedWorkbench,
    factories,
)
from workbench.bench.scenarios import MLX_LM, decode_runs, equal_prompts
from workbench.runtime.loading import load

UNPIPELINED = "workbench, packed, pipeline=False"
pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
sizes = [int(a) for a in sys.argv[2:]] or [8]
model, tok = load("tiny-llama")
fac = factories(model, tok, (PADDED, PACKED, MLX_LM))
fac[UNPIPELINED] = lambda: TrackedWorkbench(
    model,
    tok,
    MAX_BATCH,
    CHUNK_TOKENS,
    history_size=64,
    layout="packed",
    page_size=PAGE_TOKENS,
    max_num_batched_tokens=CHUNK_TOKENS,
    pipeline=False,
)
for B in sizes:
    loads = [os.getloadavg()[0]]
    runs = decode_runs(fac, equal_prompts(tok, B, 16), 24, pairs, lambda s: None)
    loads.append(os.getloadavg()[0])
    r = runs.pivot_table(index="pair", columns="engine", values="tok_per_s")
    for pair, row in r.iterrows():
        print(
            f"B={B} pair {pair}: packed / padded {row[PACKED] / row[PADDED]:.3f}, unpipelined / padded "
            f"{row[UNPIPELINED] / row[PADDED]:.3f}, packed / mlx-lm {row[PACKED] / row[MLX_LM]:.3f}, padded / "
            f"mlx-lm {row[PADDED] / row[MLX_LM]:.3f} (tok/s: padded {row[PADDED]:.1f}, packed {row[PACKED]:.1f}, "
            f"unpipelined {row[UNPIPELINED]:.1f}, mlx-lm {row[MLX_LM]:.1f})"
        )
    ratio, vs_mlx = r[PACKED] / r[PADDED], r[PACKED] / r[MLX_LM]
    same = runs[runs.engine != PADDED].same_tokens.min()
    print(
        f"B={B}: packed / padded median {ratio.median():.3f} (spread {ratio.min():.3f}..{ratio.max():.3f}); "
        f"packed / mlx-lm median {vs_mlx.median():.3f} (spread {vs_mlx.min():.3f}..{vs_mlx.max():.3f}); "
        f"tokens equal the padded layout's in every pair: {bool(same)}; load {min(loads):.2f}-{max(loads):.2f} "
        f"on {os.cpu_count()} cores",
        flush=True,
    )
