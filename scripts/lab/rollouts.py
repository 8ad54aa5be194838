"""K rollouts of one prompt (issue 29: K = 8 samples of a ~300-token prompt, goal >= 3x
faster with ``submit_n`` than as 8 separate requests on this CPU).

Usage: ``python scripts/lab/rollouts.py [--model NAME] [--k K] [--prompt-tokens P] [--max-tokens M] [--rounds R]``
(defaults: smollm2-135m, K = 8, P = 300, M = 16, R = 2). Three ways of drawing the same K
samples (sample ``i`` seeded ``seed + i``, temperature 0.8), rounds alternating the order:

- ``submit_n``: ``sched.submit_n(request, K)`` on ``Scheduler(max_batch=K)``: one prefill;
- ``separate``: K ``sched.submit(...)`` of the same prompt on the same scheduler: batched,
  each prompt prefilled (what a client without ``n`` sends);
- ``sequential``: each request alone on ``Scheduler(max_batch=1)``, one after the other
  (mlx-lm's ``generate`` in a loop).

Each run's time is the engine's own span (first ``submit`` to last ``token`` event) and its
prefill tokens are counted from its ``prefill`` events; every way's tokens must be equal
(printed). One JSON line per way: median seconds, prefill tokens, speed-up of ``submit_n``.
"""

import argparse
import json
import statistics

import workbench as wb
from workbench.observe.metrics import span_s
from workbench.workloads.workload import prompt_of_length

OPTIONS = {  # flag: (type, default, help)
    "--model": (str, "smollm2-135m", "a bundled model folder or a fetched model name"),
    "--k": (int, 8, "samples K (default 8)"),
    "--prompt-tokens": (int, 300, "prompt tokens P (default 300)"),
    "--max-tokens": (int, 16, "tokens per sample M (default 16)"),
    "--rounds": (int, 2, "alternating rounds (default 2)"),
}
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
for flag, (kind, default, text) in OPTIONS.items():
    parser.add_argument(flag, type=kind, default=default, help=text)
args = parser.parse_args()

model, tokenizer = wb.load(args.model)
request = wb.Request(
    prompt=prompt_of_length(tokenizer, args.prompt_tokens, 0),
    max_tokens=args.max_tokens,
    temperature=0.8,
    seed=1000,
    stop_ids=[],
)


def seeded(i: int) -> wb.Request:
    return wb.Request(**{**vars(request), "seed": request.seed + i})


def measured(scheds: list, uids: list) -> tuple[float, int, list]:
    """(seconds of the engines' spans, prefill tokens, tokens per sample) of finished runs."""
    events = [s.report().events for s in scheds]
    prefill = sum(int(ev[ev.kind == "prefill"].n_tokens.sum()) for ev in events)
    tokens = [s.tokens(u) for s, u in uids]
    return sum(span_s(ev) for ev in events), prefill, tokens


def submit_n() -> tuple:
    sched = wb.Scheduler(model, tokenizer, max_batch=args.k)
    uids = sched.submit_n(request, args.k)
    sched.run()
    return measured([sched], [(sched, u) for u in uids])


def separate() -> tuple:
    sched = wb.Scheduler(model, tokenizer, max_batch=args.k)
    uids = [sched.submit(seeded(i)) for i in range(args.k)]
    sched.run()
    return measured([sched], [(sched, u) for u in uids])


def sequential() -> tuple:
    scheds, uids = [], []
    for i in range(args.k):
        sched = wb.Scheduler(model, tokenizer, max_batch=1)
        uids.append((sched, sched.submit(seeded(i))))
        sched.run()
        scheds.append(sched)
    return measured(scheds, uids)


WAYS = {"submit_n": submit_n, "separate": separate, "sequential": sequential}
submit_n()  # warm-up
times = {name: [] for name in WAYS}
facts = {}
for r in range(args.rounds):
    for name in list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]:
        seconds, prefill, tokens = WAYS[name]()
        times[name].append(seconds)
        facts[name] = (prefill, tokens)
equal = len({json.dumps(tokens) for _, tokens in facts.values()}) == 1
base = statistics.median(times["submit_n"])
for name in WAYS:
    t = statistics.median(times[name])
    print(
        json.dumps(
            dict(
                model=args.model,
                k=args.k,
                prompt_tokens=args.prompt_tokens,
                max_tokens=args.max_tokens,
                rounds=args.rounds,
                way=name,
                seconds=t,
                prefill_tokens=facts[name][0],
                speedup_of_submit_n=t / base,
                tokens_equal_across_ways=equal,
            )
        )
    )
