"""Calibrate a cost model on this machine and write it as JSON (diffable).

Usage: ``python scripts/calibrate_cost_model.py [MODEL_PATH] [OUT.json]``
(defaults: the bundled tiny-llama, ``data/costmodels/<model>-<machine>.json``).
Prints the fitted model and its error against the median time of each configuration.
"""

import os
import platform
import sys
from pathlib import Path

import workbench as wb
from workbench.runtime.blas import STATUS as BLAS
from workbench.sim.calibrate import fit_cost_model, measure_costs

model_path = sys.argv[1] if len(sys.argv) > 1 else str(wb.runtime.loading.RANDOM_MODEL)
machine = f"{platform.system().lower()}-{platform.machine()}"
default_out = Path(__file__).resolve().parent.parent / "data" / "costmodels" / f"{Path(model_path).name}-{machine}.json"
out = Path(sys.argv[2]) if len(sys.argv) > 2 else default_out

model, tokenizer = wb.load(model_path)
prefill, decode = measure_costs(model, tokenizer)
blas = Path(BLAS.library).name if BLAS.library else "MLX's own BLAS"
cost = fit_cost_model(prefill, decode, label=f"{Path(model_path).name} on {machine} ({os.cpu_count()} CPUs), {blas}")
print(cost.text())
for name, frame, keys, predict in (
    ("prefill", prefill, ["rows", "tokens", "start_tokens"], lambda r: cost.prefill_s(r.tokens, r.start_tokens, r.rows)),
    ("decode", decode, ["batch_size", "kv_width_tokens"], lambda r: cost.decode_s(r.batch_size, r.kv_width_tokens)),
):
    med = frame.groupby(keys, as_index=False).time_s.median()
    med["predicted_s"] = [predict(r) for r in med.itertuples()]
    err = (med.predicted_s - med.time_s).abs() / med.time_s
    print(f"{name}: {len(med)} configurations, median relative error {err.median():.0%} (vs the median of each)")
out.parent.mkdir(parents=True, exist_ok=True)
cost.save(out)
print(f"wrote {out}")
