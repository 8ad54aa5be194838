"""The batch-invariant mode on a quantized model (issue 39's "on the real chat model at 4 bits
too"): where its quantized projections' kernels switch with the row count, and the mode's
step with its row blocks for quantized weights as they are against a candidate range, beside
the default path, in ONE process, alternating (``docs/batch-invariance.md``, "Cost").

1. **Sweep**: every distinct quantized projection the mode runs (fused groups included, and
   the tied read-out) at ``M = 1 .. --rows`` with the neighbour and position checks
   (:func:`workbench.engine.levers.invariant_blocks.sweep`): the switches and the runs of one
   kernel group. One JSON line each.
2. **Blocks**: ``current`` is the mode as it is (``invariant.ROW_BLOCKS`` for this backend's
   quantized weights); ``candidate`` calibrates with ``RowBlocks(--lo, 256)`` first (cut by
   :func:`~workbench.engine.levers.invariant.clean_range` where a kernel switches inside).
   One JSON line: each engine's blocks per quantized signature.
3. **Steps**: per B, the default path, ``current`` and ``candidate`` hold the same B prompts of
   64-68 tokens, then ``--pairs`` rounds of one step each, the order rotated every round
   (:func:`workbench.bench.invariance_cost.rotated_steps`): the median ms and the median of the
   per-round ratios to the default step.
4. **Proof**: per ``--check-batches`` B, each row of a batched run (all at once, greedy and
   seeded rows) in the ``candidate`` blocks against its run alone in them (tokens and
   log-probs, ``==``).

    python scripts/lab/quantized_blocks_ab.py --model <smollm2-135m folder> --device gpu --lo 6
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import workbench as wb
from workbench.bench.files import print_json_line
from workbench.bench.invariance_cost import _prefilled, _scheduler, prompts_of, rotated_steps
from workbench.engine.levers import invariant, invariant_fuse
from workbench.engine.levers.invariant import RowBlocks, signature
from workbench.engine.levers.invariant_blocks import sweep
from workbench.runtime.device import backend
from workbench.runtime.loading import load

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from invariant_fuse_ab import mixed_requests  # noqa: E402  (the sibling lab script's requests)

QUANTIZED = (nn.QuantizedLinear, nn.QuantizedEmbedding)
CHUNK = 64


def quantized_projections(model):
    """``signature -> module`` of each distinct quantized projection the mode runs: the model's
    and, where this backend fuses, its fused groups' (fusing the model once, as the mode does)."""
    groups = invariant_fuse.fuse(model) if backend() in invariant_fuse.FUSE_BACKENDS else []
    out = {}
    for m in [m for _, m in model.named_modules()] + [g.module for g in groups]:
        if isinstance(m, QUANTIZED) and "weight" in m:
            out.setdefault(signature(m), m)
    return out


def sweeps(model, rows):
    for sig, m in quantized_projections(model).items():
        f, K = invariant._plain_call(m), invariant._in_features(m)
        r = sweep(f, K, m["scales"].dtype, rows=tuple(range(1, rows + 1)), neighbours=True)
        yield {
            "what": "sweep",
            "signature": str(sig),
            "switches": r.switches(),
            "runs": r.runs()[:10],
            "leaks": [M for M, x in zip(r.rows, r.leak) if x],
            "moved": [M for M, x in zip(r.rows, r.moved) if x],
            "max_diff": max(r.max_diff),
        }


_LAST = [object()]  # the blocks the calibration memo holds now


def mode_scheduler(model, tok, B, blocks, **kw):
    """A batch-invariant scheduler calibrated with ``blocks`` first for quantized weights
    (``None``: the mode's own choice); the calibration memo is cleared where the last scheduler
    was calibrated with other blocks (so a run of schedulers in one choice calibrates once)."""
    key = (backend(), "quantized")
    saved = invariant.ROW_BLOCKS[key]
    if _LAST[0] != blocks:
        invariant._CALIBRATED.clear()
        _LAST[0] = blocks
    if blocks is not None:
        invariant.ROW_BLOCKS[key] = blocks
    try:
        return wb.Scheduler(model, tok, max_batch=B, batch_invariant=True, **kw)
    finally:
        invariant.ROW_BLOCKS[key] = saved


def quantized_blocks(sched):
    return {
        str(sig): (b.min_rows, b.max_rows) if b else None
        for sig, b in sched.batch_invariant.blocks.items()
        if sig[0] in ("QuantizedLinear", "QuantizedEmbedding")
    }


def steps(model, tok, B, pairs, candidate):
    scheds = {
        "default": _scheduler(model, tok, B, False),
        "current": mode_scheduler(model, tok, B, None, prefill_step_size=2048),
        "candidate": mode_scheduler(model, tok, B, candidate, prefill_step_size=2048),
    }
    for s in scheds.values():
        _prefilled(s, prompts_of(model.args.vocab_size, B, 64, 68), 3 * pairs + 10)
    ms, _ = rotated_steps(scheds, pairs)
    out = {"what": "steps", "B": B}
    for name, times in ms.items():
        out[f"{name}_ms"] = round(statistics.median(times), 3)
        if name != "default":
            out[f"{name}_ratio"] = round(statistics.median(a / b for a, b in zip(times, ms["default"])), 3)
    if B == 1:
        out["blocks"] = {n: quantized_blocks(s) for n, s in scheds.items() if n != "default"}
    return out


def proof(model, tok, B, max_tokens, candidate):
    reqs = mixed_requests(model.args.vocab_size, B, max_tokens)
    t0 = time.perf_counter()
    solo = []
    for r in reqs:  # each alone in the candidate's blocks
        s = mode_scheduler(model, tok, 1, candidate, prefill_step_size=CHUNK)
        u = s.submit(r)
        s.run()
        solo.append((s.tokens(u), s.logprobs(u)))
    sched = mode_scheduler(model, tok, B, candidate, prefill_step_size=CHUNK)
    uids = [sched.submit(r) for r in reqs]
    sched.run()
    got = [(sched.tokens(u), sched.logprobs(u)) for u in uids]
    return {
        "what": "proof: rows bit-equal alone, candidate blocks, all at once",
        "B": B,
        "equal": sum(g == s for g, s in zip(got, solo)),
        "tokens_equal": sum(g[0] == s[0] for g, s in zip(got, solo)),
        "rows": B,
        "seconds": round(time.perf_counter() - t0, 1),
        "first_difference": next((i for i, (g, s) in enumerate(zip(got, solo)) if g != s), None),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a quantized mlx-lm model (path or name)")
    ap.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    ap.add_argument("--rows", type=int, default=300, help="sweep M = 1 .. rows")
    ap.add_argument("--lo", type=int, default=6, help="the candidate's RowBlocks(lo, 256)")
    ap.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 8, 32, 128])
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--check-batches", type=int, nargs="*", default=[32])
    ap.add_argument("--check-tokens", type=int, default=12)
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)
    model, tok = load(a.model, dequantize=False)
    candidate = RowBlocks(a.lo, 256)
    head = {"model": str(a.model), "device": str(mx.default_device()), "mlx": mx.__version__}
    print_json_line({**head, "what": "setup", "candidate": [a.lo, 256]}, a.out)
    if not a.skip_sweep:
        for line in sweeps(model, a.rows):
            print_json_line({**head, **line}, a.out)
    for B in a.batch_sizes:
        print_json_line({**head, **steps(model, tok, B, a.pairs, candidate)}, a.out)
    for B in a.check_batches:
        print_json_line({**head, **proof(model, tok, B, a.check_tokens, candidate)}, a.out)


if __name__ == "__main__":
    main()
