"""The packed layout's batch-invariant decode step with its keys gathered head-major (the
twenty-second session's fix: ``invariant_packed._head_major``) against the transposed view it
replaced (``pool[slots].transpose(0, 2, 1, 3)``, whose log-probs moved under OpenBLAS), beside the
default packed path, in ONE process, rotated (``invariance_cost.rotated_steps``; its ``before``
hook swaps the gather). B rows of 64-68 prompt tokens, so every token has more than one key
block. One JSON line per B: median ms and the median per-round ratio to the default path.

    python scripts/lab/packed_invariant_gather_ab.py [MODEL] [PAIRS]
"""

import json
import statistics
import sys

import workbench as wb
from workbench.bench.invariance_cost import _prefilled, prompts_of, rotated_steps
from workbench.engine.levers import invariant_packed as ip

new = ip._head_major


def old(pool, slots):
    return pool[slots].transpose(0, 2, 1, 3)


model, tok = wb.load(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama")
pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 16
for B in (1, 8, 32):
    prompts = prompts_of(model.args.vocab_size, B, 64, 68)
    scheds = {}
    for name in ("default", "head-major", "transposed"):
        ip._head_major = old if name == "transposed" else new
        s = wb.Scheduler(
            model,
            tok,
            max_batch=B,
            layout="packed",
            batch_invariant=name != "default",
            prefill_step_size=2048,
        )
        _prefilled(s, prompts, 3 * pairs + 10)
        scheds[name] = s

    def before(name):
        ip._head_major = old if name == "transposed" else new

    ms, _ = rotated_steps(scheds, pairs, before)
    out = {"B": B}
    for n, t in ms.items():
        out[n + "_ms"] = round(statistics.median(t), 3)
        if n != "default":
            out[n + "_ratio"] = round(statistics.median(a / b for a, b in zip(t, ms["default"])), 3)
    print(json.dumps(out), flush=True)
