"""Decode-only ratios (workbench / mlx-lm) at B = 1, 8, 32 with the full bench's model and sizes:
the decode section of `workbench bench` alone, for a quick re-measure on a quiet machine.

Usage: ``python scripts/lab/decode_ratios.py [pairs]`` (default 4 alternating pairs per batch size).
Also runs the workbench with ``fast_decode=False`` (mlx-lm's forward as it is) in the same
alternation: the before / after of the decode fast paths (``workbench/engine/levers/fastpath.py``;
the bench's equal-length prompts leave no row padded, so every step runs without a mask).
"""

import os
import sys

import workbench as wb
from workbench.bench.model import make_model
from workbench.bench.run import FULL_CONFIG as cfg
from workbench.bench.scenarios import (
    FAST_OFF,
    MLX_LM,
    WORKBENCH,
    decode_runs,
    engine_factories,
    equal_prompts,
)

model = make_model(cfg.shape)
_, tok = wb.load()
pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
for B in cfg.decode.batch_sizes:
    runs = decode_runs(
        engine_factories(model, tok, B, cfg.prefill_step_size, (WORKBENCH, FAST_OFF, MLX_LM)),
        equal_prompts(tok, B, cfg.decode.prompt_tokens),
        cfg.decode.max_tokens,
        pairs,
        lambda s: None,
    )
    r = runs.pivot_table(index="pair", columns="engine", values="tok_per_s")
    ratio, off = r[WORKBENCH] / r[MLX_LM], r[FAST_OFF] / r[MLX_LM]
    print(
        f"B={B}: workbench / mlx-lm median {ratio.median():.3f} (spread {ratio.min():.3f}..{ratio.max():.3f}); "
        f"fast decode off / mlx-lm {off.median():.3f} ({off.min():.3f}..{off.max():.3f}), "
        f"load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
