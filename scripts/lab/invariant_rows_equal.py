"""Every row of the batch-invariant mode against its run alone (tokens and log-probs, ``==``)
at ``max_batch`` 1, 8 and 32, all at once and with staggered joins, on the bundled model or
the bench's llama-155m (float32), with this process's BLAS (OpenBLAS unless
``WORKBENCH_BLAS=off``). Prompt lengths spread over 1-150 tokens, so rows' keys cross the
key blocks of the mode's attention at different places (``docs/batch-invariance.md``).

    python scripts/lab/invariant_rows_equal.py [--model bench] [--rows 32] [--max-tokens 12]

On a GPU (issue 39's kernel switch inside a row block: ``invariant.clean_range``), e.g.
``--model 1b --dtype bfloat16 --rows 96 --batches 96 --at-once`` with and without
``--no-clean-range`` (the blocks as before the range check: ``RowBlocks(2, 256)`` kept).
"""

import argparse
import time
from types import SimpleNamespace

import workbench as wb
from workbench.bench import model as bench_model
from workbench.bench.gpu import LLAMA_1B
from workbench.engine.levers import invariant
from workbench.runtime.blas import STATUS
from workbench.verify import invariance

import mlx.core as mx

CHUNK = 64


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["bundled", "bench", "1b"], default="bundled")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32], help="max_batch values")
    ap.add_argument("--at-once", action="store_true", help="only the all-at-once schedule")
    ap.add_argument(
        "--no-clean-range", action="store_true", help="keep range blocks uncut (the old calibration)"
    )
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=12)
    args = ap.parse_args()
    if args.no_clean_range:
        invariant.clean_range = lambda f, K, dtype, blocks: blocks
    if args.model in ("bench", "1b"):
        shape = bench_model.FULL if args.model == "bench" else LLAMA_1B
        model, tok = (
            bench_model.make_model(shape, dtype=getattr(mx, args.dtype)),
            SimpleNamespace(eos_token_ids=[]),
        )
        vocab = shape.vocab_size
    else:
        model, tok = wb.load()
        vocab = model.args.vocab_size
    lengths = [1 + (37 * i) % 150 for i in range(args.rows)]
    reqs = [
        wb.Request(
            prompt=[(11 * i + 7 * j) % (vocab - 1) + 1 for j in range(n)],
            max_tokens=args.max_tokens,
            stop_ids=[],
            **({"temperature": 0.8, "seed": 5 + i} if i % 5 == 4 else {}),
        )
        for i, n in enumerate(lengths)
    ]
    t0 = time.perf_counter()
    solo = [invariance.alone(model, tok, r, CHUNK) for r in reqs]
    print(f"{STATUS.note}\nalone: {len(reqs)} rows in {time.perf_counter() - t0:.0f} s", flush=True)
    schedules = [("at once", [0] * len(reqs)), ("staggered", [i // 3 * 2 for i in range(len(reqs))])]
    for max_batch in args.batches:
        for how, arrivals in schedules[:1] if args.at_once else schedules:
            sched = wb.Scheduler(
                model, tok, max_batch=max_batch, prefill_step_size=CHUNK, batch_invariant=True
            )
            sched.run(arrivals=list(zip(arrivals, reqs)))
            uids = sorted(sched.requests)
            got = [(sched.tokens(u), sched.logprobs(u)) for u in uids]
            equal = sum(g == s for g, s in zip(got, solo))
            tokens = sum(g[0] == s[0] for g, s in zip(got, solo))
            blocks = sorted(
                {f"{b.min_rows}-{b.max_rows}" if b else "plain" for b in invariant._CALIBRATED.values()}
            )
            print(
                f"max_batch={max_batch:2d} {how:9s}: {equal}/{len(reqs)} rows bit-equal alone "
                f"(tokens and log-probs), {tokens}/{len(reqs)} tokens; blocks {blocks}",
                flush=True,
            )


if __name__ == "__main__":
    main()
