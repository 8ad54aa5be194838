"""Packed against padded tokens on one device, by dtype: where greedy rows part, how far in,
and the two layouts' log-prob gap at the first differing token (rounding shows as a near-tie
there; a wrong token would not). Usage: ``python scripts/lab/packed_vs_padded_tokens.py
[--shape quick|1b] [--rows 8] [--tokens 32]``; JSON lines, one per dtype."""

from __future__ import annotations

import argparse
import json

import workbench  # noqa: F401  first: sets MLX_ENABLE_TF32=0 unless the caller set it
from workbench.bench.gpu import GPU_QUICK_CONFIG, LLAMA_1B, prompt_lengths
from workbench.bench.gpu_packed import PACKED_SETTINGS
from workbench.bench.model import QUICK, make_model
from workbench.engine.scheduler import Scheduler
from workbench.runtime.loading import load
from workbench.workloads.workload import prompt_of_length

import mlx.core as mx


def rows(model, tokenizer, prompts, tokens: int, **kw) -> list[tuple[list[int], list[float]]]:
    s = Scheduler(model, tokenizer, max_batch=len(prompts), **kw)
    uids = [s.submit({"prompt": list(p), "max_tokens": tokens}) for p in prompts]
    s.run()
    return [(s.tokens(u), [float(x) for x in s.logprobs(u)]) for u in uids]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=("quick", "1b"), default="quick")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    a = p.parse_args()
    _, tokenizer = load()
    prompts = [
        prompt_of_length(tokenizer, n, start=97 * b)
        for b, n in enumerate(prompt_lengths(GPU_QUICK_CONFIG, a.rows))
    ]
    for dtype in ("float32", "bfloat16"):
        model = make_model(QUICK if a.shape == "quick" else LLAMA_1B, dtype=getattr(mx, dtype))
        pad = rows(model, tokenizer, prompts, a.tokens)
        pk = rows(model, tokenizer, prompts, a.tokens, **PACKED_SETTINGS)
        parted = []
        for i, ((t0, l0), (t1, l1)) in enumerate(zip(pad, pk)):
            j = next((k for k, (x, y) in enumerate(zip(t0, t1)) if x != y), None)
            if j is not None:
                parted.append({"row": i, "at": j, "padded_lp": l0[j], "packed_lp": l1[j]})
        same_prefix = [
            max((k for k in range(len(t0)) if t0[: k + 1] == t1[: k + 1]), default=-1) + 1
            for (t0, _), (t1, _) in zip(pad, pk)
        ]
        lp_gap = max(
            abs(x - y) for (t0, l0), (t1, l1), n in zip(pad, pk, same_prefix) for x, y in zip(l0[:n], l1[:n])
        )
        print(
            json.dumps(
                {
                    "dtype": dtype,
                    "device": str(mx.default_device()),
                    "rows": a.rows,
                    "equal_rows": a.rows - len(parted),
                    "parted": parted,
                    "max_logprob_gap_on_equal_prefix": lp_gap,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
