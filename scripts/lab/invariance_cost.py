"""What the batch-invariant mode costs: decode step and prefill time of
``Scheduler(batch_invariant=True)`` against the default path and mlx-lm's
``BatchGenerator``, in one run, alternating engines round by round; and whether the rows
are bit-equal to their runs alone.

    python scripts/lab/invariance_cost.py                      # the bench's CPU shape (llama-155m, float32)
    python scripts/lab/invariance_cost.py --model tiny-code --batch-sizes 1 8 32
    python scripts/lab/invariance_cost.py --device gpu --dtype bfloat16 --shape 1b --batch-sizes 1 8 32 128

``workbench invariance --cost`` times the mode against the default path alone, in alternating
step pairs and with issue 39's prefill (``workbench/bench/invariance_cost.py``).

Prints one line per (B, engine) with ms per decode step (median of rounds), the
invariant / default and default / mlx-lm ratios, and writes JSON lines to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=None, help="model name or path (default: the bench's random llama shape)"
    )
    ap.add_argument(
        "--shape", default="full", choices=["quick", "full", "1b"], help="bench shape when no --model"
    )
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights dtype")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32], help="rows B")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="prompt length (tokens)")
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"], help="MLX device")
    ap.add_argument("--out", default="workbench-out/invariance_cost.jsonl", help="JSON lines file")
    args = ap.parse_args()

    import workbench as wb
    from workbench.bench import model as bench_model
    from workbench.bench.engines import MlxLmEngine

    import mlx.core as mx

    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    dtype = getattr(mx, args.dtype)
    if args.model:
        model, tok = wb.load(args.model)
    else:
        shapes = {"quick": bench_model.QUICK, "full": bench_model.FULL}
        if args.shape == "1b":
            from dataclasses import replace

            from workbench.bench.gpu import LLAMA_1B

            shapes["1b"] = replace(LLAMA_1B, tie_word_embeddings=False)  # as measured: its own LM head
        model = bench_model.make_model(shapes[args.shape], dtype=dtype)
        tok = SimpleNamespace(eos_token_ids=[])  # random weights, no vocabulary: nothing stops a row
    if args.dtype != "float32":
        model.set_dtype(dtype)
    vocab = model.args.vocab_size if hasattr(model, "args") else 4096
    prompts = [
        [(7 * b + 13 * i) % (vocab - 1) + 1 for i in range(args.prompt_tokens + b % 5)]
        for b in range(max(args.batch_sizes))
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    for B in args.batch_sizes:
        for _ in range(args.rounds):
            for name, kw in (("default", {}), ("invariant", {"batch_invariant": True}), ("mlx-lm", None)):
                ms, prefill_s, toks = _run(model, tok, prompts[:B], args.steps, kw, MlxLmEngine)
                results.setdefault((B, name), []).append((ms, prefill_s, toks))
        _report(B, results, out)


def _run(model, tok, prompts, steps, kw, MlxLmEngine):
    import workbench as wb

    B = len(prompts)
    if kw is None:
        eng = MlxLmEngine(model, max_batch=B, prefill_step_size=2048)

        def prefill():
            for p in prompts:
                eng.submit(p, steps + 2)
            while len(eng.events) < 2 * B:  # prefill until every row has its first token
                eng.iterate()

        ms, prefill_s = _timed(prefill, eng.iterate, steps)
        eng.close()
        return ms, prefill_s, None
    sched = wb.Scheduler(model, tok, max_batch=B, prefill_step_size=2048, **kw)
    uids = [sched.submit(wb.Request(prompt=p, max_tokens=steps + 2, stop_ids=[])) for p in prompts]

    def prefill():
        while sched.queue or sched.state.prefilling is not None:
            sched.admit()
        sched.step()

    ms, prefill_s = _timed(prefill, sched.step, steps)
    return ms, prefill_s, [sched.logprobs(u) for u in uids]


def _timed(prefill, step, steps):
    """``(ms per step, prefill seconds)``: ``prefill()`` timed, then ``steps`` calls of
    ``step()``, each span ended by ``mx.synchronize()``."""
    import mlx.core as mx

    t0 = time.perf_counter()
    prefill()
    mx.synchronize()
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    mx.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3, prefill_s


def _report(B, results, out):
    med = {
        name: statistics.median(x[0] for x in results[(B, name)])
        for name in ("default", "invariant", "mlx-lm")
    }
    pre = {
        name: statistics.median(x[1] for x in results[(B, name)])
        for name in ("default", "invariant", "mlx-lm")
    }
    line = {
        "B": B,
        "step_ms": med,
        "prefill_s": pre,
        "invariant_over_default_step": med["invariant"] / med["default"],
        "invariant_over_default_prefill": pre["invariant"] / pre["default"],
        "mlx_lm_over_default_step": med["mlx-lm"] / med["default"],
        "step_ratios_per_round": [
            i[0] / d[0] for i, d in zip(results[(B, "invariant")], results[(B, "default")])
        ],
    }
    print(
        f"B = {B:3d}: step ms default {med['default']:.2f}, invariant {med['invariant']:.2f}, mlx-lm "
        f"{med['mlx-lm']:.2f}; invariant/default step {line['invariant_over_default_step']:.2f}x "
        f"(rounds {', '.join(f'{x:.2f}' for x in line['step_ratios_per_round'])}), prefill "
        f"{line['invariant_over_default_prefill']:.2f}x",
        flush=True,
    )
    with out.open("a") as f:
        f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
