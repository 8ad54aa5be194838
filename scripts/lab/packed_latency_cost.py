"""The latency goals' scenarios on the cost clock: TTFT and ITL p95 of the packed layout (hybrid,
token budget 512, and paced at 2x), the padded layout and mlx-lm's BatchGenerator against
mlx-lm's as shipped (``_vs_mlx_lm``) and at the workbench's capacity (``_vs_mlx_lm_equal``: at
most 8 requests in flight, ``workbench.bench.packed.MLX_LM_EQUAL``), every forward charged by
the bundled tiny-llama cost model (deterministic: the schedules compared at the same cost of
each forward, without the engines' own Python).

Usage: ``python scripts/lab/packed_latency_cost.py [scenario ...]`` (default ``staggered loaded
azure``; ``workbench.bench.packed``'s arrivals, the staggered and loaded intervals 8 and 3 x the
cost model's decode step of 8 rows at a context of 100). Prints one table per scenario.

``--prefill-from-empty``: does nothing now (kept so the commands in docs/benchmarks.md still
run). It charged every ``[B, L > 1]`` forward as a prefill into an empty cache, a workaround for
``CostedModel`` pricing a forward's keys by the tokens ever fed into that cache object (mlx-lm's
prompt batch keeps its cache objects across prompts: up to 12k keys charged on the Azure window).
``CostedModel`` now prices each forward by the keys its cache holds (``held_keys``), which is
each prompt chunk's true start without the flag (docs/packed.md, "The cost clock's correction").
"""

import argparse

from workbench.bench.packed import MLX_LM_EQUAL, azure_arrivals, latency
from workbench.bench.packed_cost import COST_MODEL, cost_factories, run_on_cost_clock
from workbench.bench.scenarios import staggered_arrivals
from workbench.runtime.loading import load
from workbench.sim.costmodel import CostModel

import pandas as pd

pd.set_option("display.width", 200)
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("scenario", nargs="*", help="staggered, loaded or azure (default: all three)")
parser.add_argument(
    "--prefill-from-empty",
    action="store_true",
    help="does nothing (the cost clock charges what each cache holds)",
)
args = parser.parse_args()
scenarios = args.scenario or ["staggered", "loaded", "azure"]
if set(scenarios) - {"staggered", "loaded", "azure"}:
    parser.error(f"scenarios are staggered, loaded and azure, got {scenarios}")
if args.prefill_from_empty:
    print(
        "--prefill-from-empty does nothing now: each forward is charged by the keys its cache holds",
        flush=True,
    )
model, tok = load("tiny-llama")
cost = CostModel.load(COST_MODEL)
fac = cost_factories(model, tok, cost, budgets=(512,), paced_steps=(2.0,))
step_s = cost.decode_s(8, 100)
for scenario in scenarios:
    every = 8 if scenario == "staggered" else 3
    arrivals = azure_arrivals(tok) if scenario == "azure" else staggered_arrivals(tok, 16, every * step_s)
    s, _ = latency(fac, arrivals, 1, scenario, lambda line: None, warm_up=False, run=run_on_cost_clock)
    for reference, suffix in (("mlx-lm", "_vs_mlx_lm"), (MLX_LM_EQUAL, "_vs_mlx_lm_equal")):
        ref = s.set_index("engine").loc[reference]
        s["ttft_p95" + suffix] = s.ttft_p95_s / ref.ttft_p95_s
        s["itl_p95" + suffix] = s.itl_p95_s / ref.itl_p95_s
    cols = [
        "engine",
        "ttft_p95_s",
        "itl_p95_s",
        "ttft_p95_vs_mlx_lm_equal",
        "itl_p95_vs_mlx_lm_equal",
        "ttft_p95_vs_mlx_lm",
        "itl_p95_vs_mlx_lm",
        "peak_rows",
        "throughput_tok_per_s",
    ]
    print(f"## {scenario}\n{s[cols].round(4).to_string(index=False)}\n", flush=True)
