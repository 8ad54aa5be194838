"""What top-k log-probs cost per decode step (``Request(top_logprobs=k)``, issue 29: goal
<= 5% of a step at k = 5).

Usage: ``python scripts/lab/top_logprobs_cost.py [--model NAME] [--rows B] [--k K] [--steps N] [--rounds R]``
(defaults: smollm2-135m, B = 8, k = 5, N = 24 decode steps, R = 4 rounds). Two readings,
each printed as one JSON line:

- ``op``: the top-k of a ``[B, V]`` log-prob array alone (``workbench.engine.top_logprobs
  .top_arrays`` evaluated, median of 50) against the median decode step of the run without
  top-k: the cost the engine adds, free of the step's noise;
- ``end_to_end``: the same B requests run with and without ``top_logprobs=k``, rounds
  alternating (off, on, on, off, ...); the median decode step ``step_s`` of each (from the
  engine's own events, ``workbench.observe.metrics.step_metrics``), and their ratio.
Both runs' tokens are compared (top-k changes no token).
"""

import argparse
import json
import statistics
import time

import workbench as wb
from workbench.engine.top_logprobs import arrays_of, top_arrays
from workbench.observe.metrics import step_metrics
from workbench.workloads.workload import prompt_of_length

import mlx.core as mx

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--model", default="smollm2-135m", help="a bundled model folder or a fetched model name")
parser.add_argument("--rows", type=int, default=8, help="rows B (default 8)")
parser.add_argument("--k", type=int, default=5, help="top_logprobs k (default 5)")
parser.add_argument("--steps", type=int, default=24, help="decode steps per run (default 24)")
parser.add_argument("--rounds", type=int, default=4, help="alternating rounds (default 4)")
args = parser.parse_args()

model, tokenizer = wb.load(args.model)


def run(k: int) -> tuple[float, list]:
    """Median decode step (s) of B rows with ``top_logprobs=k``, and their tokens."""
    sched = wb.Scheduler(model, tokenizer, max_batch=args.rows)
    uids = [
        sched.submit(
            wb.Request(
                prompt=prompt_of_length(tokenizer, 16, 40 * i),
                max_tokens=args.steps,
                stop_ids=[],
                top_logprobs=k,
            )
        )
        for i in range(args.rows)
    ]
    sched.run()
    steps = step_metrics(sched.report().events)
    steps = steps[steps.batch_size == args.rows].step_s.iloc[2:]  # after the join and warm-up steps
    return float(steps.median()), [sched.tokens(u) for u in uids]


run(0), run(args.k)  # warm-up
off, on, same = [], [], True
for r in range(args.rounds):
    for k in (0, args.k) if r % 2 == 0 else (args.k, 0):
        step_s, tokens = run(k)
        (on if k else off).append(step_s)
        same = same and (tokens == run.__dict__.setdefault("tokens", tokens))
V = int(getattr(model.args, "vocab_size", 0)) or len(tokenizer.get_vocab())
logprobs = mx.random.normal((args.rows, V)) - 10.0
mx.eval(logprobs)
op = []
for _ in range(50):
    start = time.perf_counter()
    mx.eval(arrays_of(top_arrays(logprobs, [args.k] * args.rows)))
    op.append(time.perf_counter() - start)
step_off = statistics.median(off)
common = dict(model=args.model, rows=args.rows, k=args.k, vocab=V, steps=args.steps, rounds=args.rounds)
print(
    json.dumps(
        dict(
            common,
            reading="op",
            op_ms=statistics.median(op) * 1e3,
            step_ms=step_off * 1e3,
            fraction_of_step=statistics.median(op) / step_off,
        )
    )
)
print(
    json.dumps(
        dict(
            common,
            reading="end_to_end",
            step_ms_off=step_off * 1e3,
            step_ms_on=statistics.median(on) * 1e3,
            ratio_on_off=statistics.median(on) / step_off,
            tokens_equal=same,
        )
    )
)
