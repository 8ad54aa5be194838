"""Is issue 27's TTFT goal (packed TTFT p95 <= 0.6 x mlx-lm's) reachable on this machine? The
floors (``workbench.bench.floors``: each prompt length alone in an idle engine, the lowest of
``repeats`` runs; 8 rows decoding together) of the ``workbench bench --packed`` scenarios, for the
packed layout and mlx-lm, against mlx-lm's and the packed layout's TTFT p95 measured in the same run.

Usage: ``python scripts/lab/packed_floors.py [repeats] [scenario ...]`` (default 2 repeats;
scenarios ``staggered``, ``loaded``, ``azure``). The bench's model and sizes
(``workbench.bench.packed``: tiny-llama, ``max_batch`` 8, chunks / token budget 512, pages of 16);
the staggered and loaded arrival intervals are 8 and 3 x the padded layout's decode step at B = 8,
measured first (one pair of ``decode_runs``). Prints per scenario the TTFT floor's p95, each engine's
TTFT p95 (one round after a warm-up run), floor / mlx-lm (the goal is out of reach of any schedule
when that is above 0.6), the ITL floor against each engine's ITL p95, and the load.
"""

import os
import sys

from workbench.bench.floors import measure_floors
from workbench.bench.packed import PACKED, PADDED, _run, azure_arrivals, factories, latency
from workbench.bench.scenarios import MLX_LM, decode_runs, equal_prompts, staggered_arrivals
from workbench.runtime.loading import load

import pandas as pd

repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 2
scenarios = sys.argv[2:] or ["staggered", "loaded", "azure"]
model, tok = load("tiny-llama")
fac = factories(model, tok, (PACKED, MLX_LM))
steps = decode_runs(factories(model, tok, (PADDED,)), equal_prompts(tok, 8, 16), 24, 1, lambda s: None)
step_s = steps.step_s.median()
print(f"padded decode step at B = 8: {step_s * 1e3:.1f} ms (load {os.getloadavg()[0]:.1f})")
for scenario in scenarios:
    loads = [os.getloadavg()[0]]
    arrivals = (
        azure_arrivals(tok)
        if scenario == "azure"
        else staggered_arrivals(tok, 16, (8 if scenario == "staggered" else 3) * step_s)
    )
    floors = measure_floors(
        lambda name, these: _run(fac[name], list(these))[0], list(fac), arrivals, 8, repeats
    )
    summary, _ = latency(fac, arrivals, 1, scenario, lambda s: None)
    loads.append(os.getloadavg()[0])
    p95 = summary.set_index("engine").ttft_p95_s
    itl = summary.set_index("engine").itl_p95_s
    floor = float(pd.Series(floors.ttft_s(arrivals)).quantile(0.95))  # as the engines' p95
    print(
        f"{scenario}: TTFT floor p95 {floor:.3f} s; TTFT p95 mlx-lm {p95[MLX_LM]:.3f} s, packed {p95[PACKED]:.3f} s "
        f"({p95[PACKED] / p95[MLX_LM]:.2f}x); floor / mlx-lm {floor / p95[MLX_LM]:.2f} "
        f"({'out of reach' if floor / p95[MLX_LM] > 0.6 else 'reachable'}: goal <= 0.6); ITL floor "
        f"{floors.itl_s * 1e3:.1f} ms against ITL p95 mlx-lm {itl[MLX_LM] * 1e3:.1f} ms, packed "
        f"{itl[PACKED] * 1e3:.1f} ms; load {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores",
        flush=True,
    )
