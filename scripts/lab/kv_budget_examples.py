"""Issue 14's KV-budget examples, re-measured: for each, the per-request sum the old
admission compared with the budget, and what the engine holds now under budgets of that sum
and of a few rows as mlx-lm allocates them (the peak of ``Snapshot.held_bytes`` over a run:
batch + prefilling group + prompt cache, the arrays' nbytes).

Usage: ``python scripts/lab/kv_budget_examples.py`` (CPU, about a minute).
"""

from __future__ import annotations

import workbench as wb
from workbench.engine.kv.ledger import alone_bytes
from workbench.engine.kv.profile import kv_profile, projected_bytes
from workbench.runtime.loading import DATA_DIR
from workbench.workloads.workload import prompt_of_length

EXAMPLES = {  # name: (model folder, [(prompt tokens, max_tokens)], scheduler options)
    "4 x 20-token rows, max_tokens=8": ("tiny-llama", [(20, 8)] * 4, dict(max_batch=4)),
    "1,000-token row beside 7 x 3-token rows": ("tiny-llama", [(1000, 8)] + [(3, 8)] * 7, dict(max_batch=8)),
    "tiny-gemma3, 6 mixed rows": (
        "tiny-gemma3",
        [(20, 8), (40, 6), (9, 12), (60, 3), (15, 8), (33, 5)],
        dict(max_batch=4, prefill_step_size=16),
    ),
    "prompt cache beside the batch": (
        "tiny-llama",
        [(40, 6), (30, 6), (35, 6), (25, 6), (40, 6), (38, 6)],
        dict(max_batch=3, prompt_cache=16),
    ),
}


def run(model, tok, specs, budget, options):
    """Peak held bytes and rows at once over a run to idle, or the refusal."""
    sched = wb.Scheduler(model, tok, kv_budget_bytes=budget, history_size=100_000, **options)
    try:
        for i, (n, m) in enumerate(specs):
            sched.submit(wb.Request(prompt=prompt_of_length(tok, n, 37 * i), max_tokens=m, stop_ids=[]))
    except ValueError as exc:
        return f"refused at submit: {str(exc).split(' (prompt')[0].replace('request ', '')}"
    sched.run()
    hist = list(sched.history)
    peak = max(s.held_bytes for s in hist)
    rows = max(s.batch_size for s in hist)
    return f"peak held {peak:,} = {peak / budget:.2f} x budget, up to {rows} rows at once, all done: {sched.idle}"


def main() -> None:
    for name, (folder, specs, options) in EXAMPLES.items():
        model, tok = wb.load(DATA_DIR / "models" / folder)
        per_request = sum(projected_bytes(kv_profile(model), n + m) for n, m in specs)
        exact = "prompt_cache" not in options
        one = max(
            alone_bytes(model, n, m, options.get("prefill_step_size", 2048), exact_chunks=exact)
            for n, m in specs
        )
        print(f"{name} ({folder}): per-request sum {per_request:,} bytes; the largest row alone {one:,}")
        for label, budget in (("per-request sum", per_request), ("2 rows", 2 * one), ("3 rows", 3 * one)):
            print(f"  budget {budget:>11,} ({label}): {run(model, tok, specs, budget, options)}")


if __name__ == "__main__":
    main()
