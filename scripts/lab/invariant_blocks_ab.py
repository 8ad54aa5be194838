"""The batch-invariant mode's CPU row blocks chosen without (main at 0a9d8d2) and with the
weight's size (a weight that stays in cache runs a lone row unpadded), against the default
path, in ONE process, alternating (issue 39; ``docs/batch-invariance.md``, "Cost").

Per B: three schedulers hold the same B prompts of 64-68 tokens (the bench's llama-155m in
float32 unless ``--shape quick``): the default path, the mode with the blocks that
``block_from`` chooses without the weight's size (on llama-155m: its KV projections,
256x1024, in one call of up to 32 rows padded to 4) and the mode with this change's blocks
(blocks of 1-3 rows, unpadded); then ``--pairs`` rounds of one step each, the order rotated
every round (:func:`workbench.bench.invariance_cost.rotated_steps`). Prints the median ms per
step, the median of the per-round ratios to the default step, their quartiles, the ratio of
process CPU seconds, the median ratio of this change's step to main's in the same round, and
the 1-minute load. ``--out FILE`` appends JSON lines.

    python scripts/lab/invariant_blocks_ab.py --batch-sizes 1 8 32 --pairs 36
"""

import argparse
import os
import statistics
from types import SimpleNamespace

import workbench  # noqa: F401  (loads the optimized BLAS before mlx)
from workbench.bench import model as bench_model
from workbench.bench.files import print_json_line
from workbench.bench.invariance_cost import _prefilled, _scheduler, prompts_of, rotated_steps, summary
from workbench.engine.levers import invariant, invariant_blocks

import mlx.core as mx

BY_SIZE = invariant_blocks.block_from


def _mode(model, tok, B, by_size):
    """An invariant scheduler whose CPU row blocks are chosen with (this change) or without
    (main) the weight's size, calibrated afresh."""
    invariant._CALIBRATED.clear()
    invariant._SWEPT.clear()
    invariant_blocks.block_from = BY_SIZE if by_size else (lambda result, weight_bytes=None: BY_SIZE(result))
    try:
        return _scheduler(model, tok, B, True)
    finally:
        invariant_blocks.block_from = BY_SIZE
        invariant._CALIBRATED.clear()
        invariant._SWEPT.clear()


def kv_blocks(sched):
    """The mode's row blocks of llama-155m's KV projection (256x1024), as text."""
    inv = sched.batch_invariant
    return {str(s[1]): str(b) for s, b in inv.blocks.items() if s[1] == (256, 1024)}


def steps(model, tok, B, pairs):
    scheds = {
        "default": _scheduler(model, tok, B, False),
        "main": _mode(model, tok, B, by_size=False),
        "by_size": _mode(model, tok, B, by_size=True),
    }
    for sched in scheds.values():
        _prefilled(sched, prompts_of(model.args.vocab_size, B, 64, 68), pairs + 3)
    load0 = os.getloadavg()[0]
    ms, cpu = rotated_steps(scheds, pairs)
    out = {
        "B": B,
        "pairs": pairs,
        "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
        **summary(ms, cpu),
    }
    out.update({f"{name}_kv_blocks": kv_blocks(scheds[name]) for name in ("main", "by_size")})
    vs = [a / b for a, b in zip(ms["by_size"], ms["main"])]  # this change against main, round by round
    out["by_size_vs_main"] = round(statistics.median(vs), 3)
    out["by_size_vs_main_quartiles"] = [round(q, 3) for q in statistics.quantiles(vs, n=4)]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--pairs", type=int, default=36)
    ap.add_argument("--shape", choices=["full", "quick"], default="full")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shape = {"full": bench_model.FULL, "quick": bench_model.QUICK}[args.shape]
    model, tok = bench_model.make_model(shape, dtype=mx.float32), SimpleNamespace(eos_token_ids=[])
    for B in args.batch_sizes:
        line = {"shape": shape.name, **steps(model, tok, B, args.pairs)}
        print_json_line(line, args.out)


if __name__ == "__main__":
    main()
