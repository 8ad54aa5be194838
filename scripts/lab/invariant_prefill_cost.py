"""The mode's prefill against the default path's (submit to every row's first token), more
rounds than ``workbench invariance --cost`` takes, for groups of 4 and 16 prompts of 160-512
tokens (``invariance_cost.prefill_cost``: the engines alternating, the order swapped every
round). One JSON line per group size: medians, the quartiles of the per-round ratios, the
CPU-time ratio, the load. To compare two trees, run it from each in turn, alternating:

    cd TREE && PYTHONPATH=$PWD python scripts/lab/invariant_prefill_cost.py --tag TREE --rounds 10

Raw lines of 2026-12-07: ``docs/benchmarks/invariance/cpu_batched_prefill.jsonl``.
"""

import argparse
import json
import os
import time

import workbench as wb
from workbench.bench.invariance_cost import prefill_cost, prompts_of
from workbench.runtime.blas import STATUS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="", help="a name for this tree in the lines")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--prompts", type=int, nargs="+", default=[4, 16])
    args = ap.parse_args()
    model, tok = wb.load()
    for count in args.prompts:
        c = prefill_cost(model, tok, prompts_of(model.args.vocab_size, count, 160, 512, seed=5), args.rounds)
        ratios = sorted(c.rounds)
        q1, q3 = (ratios[int(f * (len(ratios) - 1))] for f in (0.25, 0.75))
        line = {
            "tree": args.tag,
            "prompts": count,
            "default_s": round(c.default_s, 4),
            "invariant_s": round(c.invariant_s, 4),
            "ratio": round(c.ratio, 3),
            "q1": round(q1, 3),
            "q3": round(q3, 3),
            "cpu_ratio": round(c.cpu_ratio, 3),
            "load": round(os.getloadavg()[0], 1),
            "blas": str(STATUS.library),
            "utc": time.strftime("%H:%M:%S", time.gmtime()),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
