"""The float32 noise between a row's forward in its batch and alone, per bundled model: the
measurement behind ``workbench.verify.layers.DEFAULT_RTOL`` (docs/divergence.md).

For each model, four requests (prompts of 6, 2, 13 and 9 tokens: left padding 7, 11, 0, 4)
decode together; at each of the first ``steps`` decode steps every row's forward is re-run
batched and alone (``wb.verify.localize``) and the largest relative |Δ| of any layer's output
or KV cache is kept (``LayerDivergence.relative_delta``).

Usage: ``python scripts/lab/layer_noise.py [steps]`` (default 6). ``WORKBENCH_BLAS=off`` gives the
test suite's numerics (MLX's own CPU matmuls); unset, an optimized BLAS is used if present. On
an NVIDIA GPU ``MLX_ENABLE_TF32=1`` runs float32 matmuls at TF32 (``docs/gpu.md``); the
outputs of both settings on an H200 are in ``docs/benchmarks/layer_noise_h200_tf32_*.txt``.
"""

import contextlib
import os
import sys

import workbench as wb
from workbench.runtime import blas, device, precision
from workbench.verify import faults
from workbench.verify.layers import DEFAULT_RTOL, localize, ranges
from workbench.workloads.workload import prompt_maker

import mlx.core as mx

MODELS = ("tiny-code", "tiny-llama", "tiny-gemma3", "tiny-qwen3", "tiny-mamba2", "tiny-qwen3-next")
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
print(f"device: {device.backend()}; {precision.describe()}")
print(
    f"BLAS: {blas.STATUS.library or 'MLX built-in'} (WORKBENCH_BLAS={os.environ.get('WORKBENCH_BLAS', 'unset')})"
)
worst_all = 0.0
for name in MODELS:
    model, tokenizer = wb.load(name)
    prompt = prompt_maker(tokenizer)
    sched = wb.Scheduler(model, tokenizer, max_batch=4)
    for n, start in ((6, 0), (2, 40), (13, 80), (9, 200)):
        sched.submit(wb.Request(prompt=prompt(n, start), max_tokens=steps + 2))
    sched.admit()
    worst, n_forwards, n_alarms = 0.0, 0, 0
    for _ in range(steps):
        for uid in [u for u in sched.snapshot().uids]:
            report = localize(sched, int(uid))
            worst, n_forwards, n_alarms = (
                max(worst, report.relative_delta),
                n_forwards + 1,
                n_alarms + (not report.ok),
            )
        sched.step()
    worst_all = max(worst_all, worst)
    print(
        f"{name:16s} {n_forwards:3d} row forwards, largest relative |d| {worst:.1e}, "
        f"over rtol {DEFAULT_RTOL:.0e}: {n_alarms}"
    )
print(
    f"all models: largest relative |d| {worst_all:.1e}; "
    f"DEFAULT_RTOL {DEFAULT_RTOL:.0e} is {DEFAULT_RTOL / worst_all:.0f}x above it"
)

# The planted faults on the bundled model, two steps in, every row: how far over tolerance.
model, tokenizer = wb.load()
prompt = prompt_maker(tokenizer)
sched = wb.Scheduler(model, tokenizer, max_batch=4)
for n, start in ((6, 0), (2, 40), (13, 80), (9, 200)):
    sched.submit(wb.Request(prompt=prompt(n, start), max_tokens=8))
sched.admit(), sched.step(), sched.step()
half, _ = wb.load()
half.set_dtype(mx.bfloat16)
sched16 = wb.Scheduler(half, tokenizer, max_batch=4)
for n, start in ((6, 0), (2, 40), (13, 80), (9, 200)):
    sched16.submit(wb.Request(prompt=prompt(n, start), max_tokens=8))
sched16.admit(), sched16.step(), sched16.step()
print("\ntiny-code, step 2, every row: fault -> first layer, positions, max|d| / tolerance there")
cases = {
    "noisy_row(layer 3, row 2, 1%)": (sched, lambda: faults.noisy_row(model, 3, 2), {}),
    "no_padding_mask": (sched, lambda: faults.no_padding_mask(model), {}),
    "rope_counts_padding": (sched, lambda: faults.rope_counts_padding(model), {}),
    "bf16 batch vs float32 alone": (sched16, contextlib.nullcontext, {"reference_model": model}),
}
for name, (s, fault, kwargs) in cases.items():
    with fault():
        reports = [localize(s, uid, **kwargs) for uid in range(4)]
    cells = []
    for r in reports:
        if r.ok:
            cells.append(f"uid {r.uid} (pad {r.left_padding}): ok")
            continue
        t = r.table.iloc[r.first_layer]
        ratio = max(t["max_abs_delta"] / t["tolerance"], t["kv_max_abs_delta"] / t["kv_tolerance"])
        cells.append(
            f"uid {r.uid} (pad {r.left_padding}): layer {r.first_layer} @ {ranges(r.positions)}, {ratio:.0f}x"
        )
    print(f"{name:30s} " + "; ".join(cells))
