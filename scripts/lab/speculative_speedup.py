"""Speculative decoding on the real model: tok/s of SmolLM2-135M without speculation, with
prompt lookup and with a draft model, in the workbench at B = 1 and B = 4 and in mlx-lm
(``generate_step``, ``speculative_generate_step``) at B = 1, for chat and for code that
copies its prompt. The draft model is the target's first ``--draft-layers`` decoder layers
(with its norm and head: layer-skip self-speculation; no smaller model of the same
tokenizer is fetched here).

Usage: ``python scripts/lab/speculative_speedup.py [--tokens 64] [--k 4] [--draft-layers 10]
[--repeats 3]``; prints one line per run and a Markdown table (docs/benchmarks.md,
"Speculative decoding"). Decode tok/s = tokens after each request's first / seconds from
its first token to its last (prefill left out; B = 1 requests one after the other, their
windows summed; B = 4 from the first token of any to the last); the best of ``--repeats``
alternating rounds. ``same`` says whether the run's greedy tokens equal the workbench's
without speculation. Needs ``workbench models fetch smollm2-135m``.
"""

import argparse
import os
import time

import workbench as wb
from workbench.observe.speculation import acceptance

import mlx.core as mx
import pandas as pd
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models.cache import make_prompt_cache

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
parser.add_argument("--k", type=int, default=4, help="num_draft_tokens")
parser.add_argument("--draft-layers", type=int, default=15, help="decoder layers of the draft model")
parser.add_argument("--repeats", type=int, default=3, help="alternating rounds; the best is kept")
args = parser.parse_args()

model, tok = wb.load("smollm2-135m")
draft, _ = wb.load("smollm2-135m")
draft.model.layers = draft.model.layers[: args.draft_layers]

CODE = """def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
"""
WORKLOADS = {
    "chat": [
        "What is the capital of France? Answer in two sentences.",
        "Give me three tips for sleeping better.",
        "Explain what a hash table is to a beginner.",
        "Write a haiku about autumn rain.",
    ],
    "code copy": [
        f"Rewrite this function with type hints, keeping everything else the same:\n```python\n{CODE}```",
        f"Repeat this code exactly, then explain it in one line:\n```python\n{CODE}```",
        f"Add a docstring to this function and return the whole function:\n```python\n{CODE}```",
        f"Rename `values` to `xs` in this code and show the full result:\n```python\n{CODE}```",
    ],
}


def chat_ids(text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)


def workbench_run(prompts, max_batch, speculative):
    sched = wb.Scheduler(model, tok, max_batch=max_batch, speculative=speculative, num_draft_tokens=args.k)
    uids = [sched.submit(wb.Request(prompt=p, max_tokens=args.tokens, stop_ids=[])) for p in prompts]
    sched.run()
    times = [e.time_s for e in sched.events if e.kind == "token"]
    acc = acceptance(sched.events)
    rate = acc.accepted_tokens.sum() / acc.drafted_tokens.sum() if acc.drafted_tokens.sum() else float("nan")
    return (
        [sched.tokens(u) for u in uids],
        max(times) - min(times),
        len(prompts),
        rate,
        acc.tokens_per_forward.mean(),
    )


def mlx_lm_run(prompts, draft_model):
    out, window = [], 0.0
    for p in prompts:
        if draft_model is None:
            steps = generate_step(
                mx.array(p), model, max_tokens=args.tokens, prompt_cache=make_prompt_cache(model)
            )
        else:
            steps = speculative_generate_step(
                mx.array(p), model, draft_model, num_draft_tokens=args.k, max_tokens=args.tokens
            )
        tokens, first = [], None
        for step in steps:
            tokens.append(int(step[0]))
            first = first or time.perf_counter()
        window += time.perf_counter() - first
        out.append(tokens)
    return out, window, len(prompts), float("nan"), float("nan")


RUNS = [
    ("workbench", 1, None),
    ("workbench", 1, "prompt-lookup"),
    ("workbench", 1, "draft"),
    ("mlx-lm", 1, None),
    ("mlx-lm", 1, "draft"),
    ("workbench", 4, None),
    ("workbench", 4, "prompt-lookup"),
    ("workbench", 4, "draft"),
]
rows = []
for workload, texts in WORKLOADS.items():
    prompts = [chat_ids(t) for t in texts]
    best: dict = {}
    for _ in range(args.repeats):
        for engine, B, spec in RUNS:
            spec_arg = draft if spec == "draft" else spec
            if engine == "mlx-lm":  # B = 1: one request after the other
                result = mlx_lm_run(prompts, draft if spec == "draft" else None)
            elif B == 1:
                parts = [workbench_run([p], 1, spec_arg) for p in prompts]
                result = (
                    [t for r in parts for t in r[0]],
                    sum(r[1] for r in parts),
                    len(parts),
                    sum(r[3] for r in parts) / len(parts),
                    sum(r[4] for r in parts) / len(parts),
                )
            else:
                result = workbench_run(prompts, B, spec_arg)
            key = (engine, B, spec)
            if key not in best or result[1] < best[key][1]:
                best[key] = result
    plain = best[("workbench", 1, None)][0]
    for (engine, B, spec), (tokens, window, windows, rate, per_forward) in best.items():
        n = sum(len(t) for t in tokens) - windows  # each window starts at a first token
        rows.append(
            dict(
                workload=workload,
                engine=engine,
                B=B,
                speculation=spec or "none",
                tok_per_s=n / window,
                acceptance=rate,
                tokens_per_forward=per_forward,
                same=tokens == plain,
            )
        )
        print(rows[-1], flush=True)
table = pd.DataFrame(rows)
for workload in WORKLOADS:
    w = table.workload == workload
    for B in (1, 4):
        plain_rows = w & (table.engine == "workbench") & (table.B == B) & (table.speculation == "none")
        base = table[plain_rows].tok_per_s.iloc[0]
        table.loc[w & (table.B == B), "vs_no_speculation"] = table[w & (table.B == B)].tok_per_s / base
    spec_ref = table[w & (table.engine == "mlx-lm") & (table.speculation == "draft")].tok_per_s.iloc[0]
    table.loc[w & (table.B == 1), "vs_mlx_lm_speculative"] = table[w & (table.B == 1)].tok_per_s / spec_ref
print(
    f"load average (1 min) {os.getloadavg()[0]:.2f}; k={args.k}, draft = first {args.draft_layers} of "
    f"{len(model.layers)} layers, {args.tokens} tokens per request"
)
cols = list(table.columns)
print("| " + " | ".join(cols) + " |\n|" + " --- |" * len(cols))
for r in table.itertuples(index=False):
    print("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in r) + " |")
