"""What structured output costs per decode step: the grammar mask of one row, and a step
with ``k`` constrained rows of ``B``.

    python -m workbench.bench.constrained                        # the real model, smollm2-135m
    python -m workbench.bench.constrained --model data/models/tiny-code --steps 16

Knows: the engine's public API (``Scheduler``, ``Request(json_schema= / regex= / choices=)``),
the row grammar (:class:`workbench.engine.levers.constrained.RowGrammar`, whose
``allowed`` it times while a run steps). Must not know: the engine's other internals.

- :func:`mask_cost`: per constraint kind, the time of one row's mask for one step (bring the
  matcher to the row's tokens, llguidance's bitmask, unpacked, applied to ``[1, V]`` logits and
  evaluated), replayed over a real constrained output of the model, in microseconds.
- :func:`step_cost`: ``B`` rows decoding, ``k`` of them under a grammar that cannot complete
  within the run (``GRAMMAR``), the rest free; for each ``k`` the median decode step (ms) and,
  within the same steps, the time the ``k`` masks took (``RowGrammar.allowed``: matcher update,
  bitmask, unpacking), so their share of the step is read from one run whatever the machine's
  load. Rounds alternate over the ``k`` values; every row runs all ``steps`` tokens (checked).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from ..engine.levers.constrained import RowGrammar, constraint_of, row_grammar
from ..engine.request import Request
from ..engine.scheduler import Scheduler

# A grammar no row completes within a run: 300 to 400 characters of lowercase letters and spaces.
GRAMMAR = dict(regex="[a-z ]{300,400}")
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
KINDS = {
    "json_schema": dict(json_schema=SCHEMA),
    "regex": dict(regex=r"[a-z]+( [a-z]+){2,5}\."),
    "choices": dict(choices=["positive", "negative", "neutral"]),
    "long regex": GRAMMAR,
}


def mask_cost(model: Any, tokenizer: Any, prompt: Sequence[int], max_tokens: int = 32) -> list[dict]:
    """Per constraint kind of :data:`KINDS`: generate its output alone (greedy), then time
    its row's mask at every step of that output, replayed on a fresh grammar (so each call
    advances the matcher by one token, as in decoding). Returns one dict per kind:
    ``kind``, ``steps``, ``mask_us_median``, ``mask_us_p95`` (microseconds per row per step)."""
    sched = Scheduler(model, tokenizer, max_batch=1, history_size=0)
    V = sched.vocab_size
    out = []
    for kind, fields in KINDS.items():
        request = Request(prompt=list(prompt), max_tokens=max_tokens, **fields)
        uid = sched.submit(request)
        sched.run()
        tokens = sched.tokens(uid)
        grammar = row_grammar(constraint_of(request, tokenizer, V), tokenizer, V, len(prompt))
        logits = mx.zeros((1, V), dtype=mx.float32)
        times = []
        for t in range(len(tokens)):
            context = mx.array(list(prompt) + tokens[:t], dtype=mx.uint32)
            t0 = time.perf_counter()
            mx.eval(grammar(context, logits))
            times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        out.append(
            dict(
                kind=kind,
                steps=len(times),
                mask_us_median=statistics.median(times),
                mask_us_p95=times[min(len(times) - 1, int(0.95 * len(times)))],
            )
        )
    return out


@contextlib.contextmanager
def timed_masks(spent: list[float]):
    """While the body runs, every ``RowGrammar.allowed`` call adds its seconds to ``spent[0]``."""
    real = RowGrammar.allowed

    def allowed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    RowGrammar.allowed = allowed
    try:
        yield
    finally:
        RowGrammar.allowed = real


def _step_ms(
    model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], k: int, steps: int
) -> tuple[float, float]:
    """``(median ms of a decode step, median ms of the masks within it)`` of one run:
    ``len(prompts)`` rows, the first ``k`` under :data:`GRAMMAR`, ``steps`` tokens each (no
    stop ids). Raises: RuntimeError when a row did not run every step (its grammar
    completed, or it failed)."""
    sched = Scheduler(model, tokenizer, max_batch=len(prompts), history_size=0)
    uids = [
        sched.submit(Request(prompt=list(p), max_tokens=steps, stop_ids=[], **(GRAMMAR if i < k else {})))
        for i, p in enumerate(prompts)
    ]
    while sched.state.queue or sched.state.prefilling is not None:
        sched.admit()
    times, masks = [], []
    for _ in range(steps):
        spent = [0.0]
        with timed_masks(spent):
            t0 = time.perf_counter()
            sched.step()
            times.append(time.perf_counter() - t0)
        masks.append(spent[0])
    sched.run()
    short = [u for u in uids if len(sched.tokens(u)) != steps]
    if short:
        raise RuntimeError(
            f"rows {short} did not run {steps} steps: {[sched.finish_reason(u) for u in short]}"
        )
    return statistics.median(times[1:]) * 1e3, statistics.median(
        masks[1:]
    ) * 1e3  # step 1 reads the join's tokens


def step_cost(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    ks: Sequence[int],
    steps: int = 16,
    rounds: int = 3,
) -> list[dict]:
    """The median decode step with ``k`` constrained rows of ``B = len(prompts)``, for each
    ``k`` in ``ks``, after one warm-up run, ``rounds`` alternating rounds (``ks`` forwards,
    then backwards). Returns one dict per ``k``: ``B``, ``k``, ``step_ms`` and ``mask_ms``
    (medians over rounds), ``mask_share`` (``mask_ms / step_ms``), ``vs_free`` (``step_ms``
    over the ``k = 0`` step, when ``0`` is in ``ks``)."""
    per_k: dict[int, list[tuple[float, float]]] = {k: [] for k in ks}
    _step_ms(model, tokenizer, prompts, max(ks), steps)  # warm-up (first-call costs), not counted
    for r in range(rounds):
        for k in ks if r % 2 == 0 else list(reversed(ks)):
            per_k[k].append(_step_ms(model, tokenizer, prompts, k, steps))
    step = {k: statistics.median(s for s, _ in v) for k, v in per_k.items()}
    mask = {k: statistics.median(m for _, m in v) for k, v in per_k.items()}
    return [
        dict(
            B=len(prompts),
            k=k,
            step_ms=step[k],
            mask_ms=mask[k],
            mask_share=mask[k] / step[k],
            vs_free=step[k] / step[0] if 0 in step else None,
        )
        for k in per_k
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (see the module docstring); prints one JSON line per result."""
    import workbench as wb

    from ..workloads.workload import prompt_of_length

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="model name or path")
    ap.add_argument("--batch", type=int, default=8, help="rows B of the step runs")
    ap.add_argument(
        "--ks", type=int, nargs="+", default=None, help="constrained rows k (default 0, 1, B/2, B)"
    )
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed per run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    args = ap.parse_args(argv)
    model, tok = wb.load(args.model)
    prompts = [prompt_of_length(tok, 16, 40 * i) for i in range(args.batch)]
    for row in mask_cost(model, tok, prompts[0]):
        print(json.dumps(dict(model=args.model, vocab=model.args.vocab_size, **row)))
    ks = args.ks or sorted({0, 1, args.batch // 2, args.batch})
    for row in step_cost(model, tok, prompts, ks, args.steps, args.rounds):
        print(json.dumps(dict(model=args.model, **row)))


if __name__ == "__main__":
    main()
