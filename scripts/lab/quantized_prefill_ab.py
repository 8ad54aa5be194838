"""The batch-invariant mode's prefill on a quantized model (issue 39, "prefill <= 1.25x ... on the
real chat model at 4 bits too"): the prefill's row blocks for quantized weights as they are
against a wider first choice, beside the default path, in ONE process, alternating.

Off the CPU a prefill's ``B' x C`` rows run in the device's prefill blocks
(``invariant_prefill.PREFILL_ROW_BLOCKS``, else the decode step's ``invariant.ROW_BLOCKS``),
cut by ``clean_range`` where a kernel switches inside, then fixed calls of
``PREFILL_FIXED_ROWS`` rows where the cut range is short. For 4-bit weights on CUDA the first
choice is the decode step's ``RowBlocks(8, 256)``: 16 prompts of 160-486 tokens (about 5,100
rows) are then about 10 calls per projection of 512 rows where the default path makes one.

1. **Blocks**: per variant (``current``; ``hi<N>``: ``RowBlocks(8, N)`` first for this
   backend's quantized weights, one variant per ``--hi`` value), the prefill blocks each
   quantized projection got and its first prefill's seconds (the blocks' calibration,
   ``clean_range``'s sweep, included).
2. **Prefill**: per round the default path and every variant each prefill the same
   ``--prompts`` prompts (submit to every row's first token, as ``workbench invariance --cost``
   times it; the order reversed every round; round 0 warms up and is not kept): medians and the
   median of the per-round ratios to the default path.
3. **Proof**: in every variant, each prompt run alone against all of them at once (``--check-tokens``
   tokens, greedy; tokens and log-probs, ``==``).

    python scripts/lab/quantized_prefill_ab.py --model <smollm2-135m folder> --device gpu --hi 256 8192
"""

import argparse
import statistics
import time

import workbench as wb
from workbench.bench.files import print_json_line
from workbench.bench.invariance_cost import _prefilled, _scheduler, prompts_of
from workbench.engine.levers import invariant_prefill
from workbench.engine.levers.invariant import RowBlocks
from workbench.runtime.device import backend
from workbench.runtime.loading import load

import mlx.core as mx


class Variant:
    """One choice of the prefill's first row blocks for quantized weights, with its own memo of
    the blocks found (``invariant_prefill._PREFILL_BLOCKS`` swapped in while it runs)."""

    def __init__(self, blocks):
        self.blocks, self.memo = blocks, {}

    def __enter__(self):
        key = (backend(), "quantized")
        self.saved = (dict(invariant_prefill._PREFILL_BLOCKS), invariant_prefill.PREFILL_ROW_BLOCKS.get(key))
        invariant_prefill._PREFILL_BLOCKS.clear()
        invariant_prefill._PREFILL_BLOCKS.update(self.memo)
        if self.blocks is not None:
            invariant_prefill.PREFILL_ROW_BLOCKS[key] = self.blocks
        return self

    def __exit__(self, *exc):
        key = (backend(), "quantized")
        self.memo = dict(invariant_prefill._PREFILL_BLOCKS)
        invariant_prefill._PREFILL_BLOCKS.clear()
        invariant_prefill._PREFILL_BLOCKS.update(self.saved[0])
        if self.saved[1] is None:
            invariant_prefill.PREFILL_ROW_BLOCKS.pop(key, None)
        else:
            invariant_prefill.PREFILL_ROW_BLOCKS[key] = self.saved[1]


def prefill_once(model, tok, prompts, invariant):
    sched = _scheduler(model, tok, len(prompts), invariant)
    mx.synchronize()
    t0 = time.perf_counter()
    _prefilled(sched, prompts, 2)
    return time.perf_counter() - t0


def proof(model, tok, prompts, max_tokens):
    reqs = [wb.Request(prompt=list(p), max_tokens=max_tokens, stop_ids=[]) for p in prompts]
    solo = []
    for r in reqs:
        s = _scheduler(model, tok, 1, True)
        u = s.submit(r)
        s.run()
        solo.append((s.tokens(u), s.logprobs(u)))
    sched = _scheduler(model, tok, len(reqs), True)
    uids = [sched.submit(r) for r in reqs]
    sched.run()
    got = [(sched.tokens(u), sched.logprobs(u)) for u in uids]
    return {
        "equal": sum(g == s for g, s in zip(got, solo)),
        "tokens_equal": sum(g[0] == s[0] for g, s in zip(got, solo)),
        "rows": len(reqs),
        "first_difference": next((i for i, (g, s) in enumerate(zip(got, solo)) if g != s), None),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a quantized mlx-lm model (path or name)")
    ap.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    ap.add_argument("--hi", type=int, nargs="+", default=[2048], help="one variant of RowBlocks(8, hi) each")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--check-tokens", type=int, default=6)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)
    model, tok = load(a.model, dequantize=False)
    prompts = prompts_of(model.args.vocab_size, a.prompts, 160, 512, seed=5)
    variants = {"current": Variant(None), **{f"hi{h}": Variant(RowBlocks(8, h)) for h in a.hi}}
    head = {
        "model": str(a.model),
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "prompts": a.prompts,
    }
    times: dict[str, list[float]] = {"default": [], **{name: [] for name in variants}}
    first: dict[str, float] = {}  # round 0: each variant's first prefill, its blocks' calibration included
    for r in range(a.rounds + 1):
        names = list(times) if r % 2 == 0 else list(reversed(times))
        for name in names:
            if name == "default":
                s = prefill_once(model, tok, prompts, False)
            else:
                with variants[name]:
                    s = prefill_once(model, tok, prompts, True)
            if r:
                times[name].append(s)
            else:
                first[name] = round(s, 2)
        if r == 0:
            for name, v in variants.items():
                blocks = {str(k[1]): (b.min_rows, b.max_rows) if b else None for k, b in v.memo.items()}
                print_json_line(
                    {
                        **head,
                        "what": "blocks",
                        "variant": name,
                        "first_prefill_s": first[name],
                        "blocks": blocks,
                    },
                    a.out,
                )
    line = {**head, "what": "prefill", "rounds": a.rounds}
    for name, ts in times.items():
        line[f"{name}_s"] = round(statistics.median(ts), 4)
        if name != "default":
            ratios = sorted(x / d for x, d in zip(ts, times["default"]))
            line[f"{name}_ratio"] = round(statistics.median(ratios), 3)
            line[f"{name}_ratios"] = [round(x, 2) for x in ratios]
    print_json_line(line, a.out)
    for name, v in variants.items():
        with v:
            t0 = time.perf_counter()
            p = proof(model, tok, prompts, a.check_tokens)
        print_json_line(
            {
                **head,
                "what": f"proof: {name}'s blocks, rows bit-equal alone",
                **p,
                "seconds": round(time.perf_counter() - t0, 1),
            },
            a.out,
        )


if __name__ == "__main__":
    main()
