"""Issue 39's proof on any device (CUDA by the GPU script, the CPU in CI through
``tests/engine/test_invariant_blocks.py``): a kernel-threshold sweep and a run-to-run check.

1. **Projections**: every distinct projection of the model swept at ``M = 1 .. --rows`` rows
   (``workbench.engine.levers.invariant_blocks.sweep`` with ``neighbours=True``): the row counts
   where a probe row's bits switch kernel (*joining costs rounding*) apart from a *leak* (its
   bits move with its neighbours' values at one ``M``) or a position-dependent row.
2. **Attention**: one decode query per row over ``L`` keys, ``L`` across 256 (where cuDNN's
   decode attention is reported to round differently), the probe row alone and among ``B``
   rows of other keys: equal bits or not, per ``(B, L)``.
3. **Run to run**: the same inputs twice (a projection at ``M`` up to ``--rows``, a 4-bit
   ``quantized_matmul`` at ``M >= 8`` where a shared-memory race was reported, attention past
   256 keys, and the whole mode end to end by ``workbench.verify.run_to_run.twice``).

    python scripts/lab/invariance_proof.py --device gpu --dtype bfloat16 --shape 1b --rows 300

Prints one line per finding and writes JSON lines to ``--out`` (default stdout only).
"""

from __future__ import annotations

import argparse
import json
import sys

import workbench  # noqa: F401, I001  (before mlx: the project's precision and BLAS settings)
from workbench.bench import model as bench_model
from workbench.bench.gpu import LLAMA_1B
from workbench.engine.levers.invariant import PROJECTIONS, _in_features, _plain_call, signature
from workbench.engine.levers.invariant_blocks import sweep

import mlx.core as mx
import mlx.nn as nn

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def emit(out, record: dict) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")
        out.flush()


def projections(model) -> dict:
    seen = {}
    for name, m in model.named_modules():
        if isinstance(m, PROJECTIONS) and "weight" in m and signature(m) not in seen:
            seen[signature(m)] = (name, m)
    return seen


def attention_sweep(dtype, batch_sizes, lengths, heads=32, kv_heads=8, dim=64) -> list[dict]:
    rows = []
    key = mx.random.key(5)
    k1, k2, k3 = mx.random.split(key, 3)
    top_b, top_l = max(batch_sizes), max(lengths)
    q_all = mx.random.normal((top_b, heads, 1, dim), key=k1).astype(dtype)
    k_all = mx.random.normal((top_b, kv_heads, top_l, dim), key=k2).astype(dtype)
    v_all = mx.random.normal((top_b, kv_heads, top_l, dim), key=k3).astype(dtype)
    scale = dim**-0.5
    for L in lengths:
        q, k, v = q_all[:1], k_all[:1, :, :L], v_all[:1, :, :L]
        alone = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
        again = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
        mx.eval(alone, again)
        same_twice = mx.array_equal(alone, again).item()
        for B in batch_sizes:
            # the probe is row 0 of a batch whose other rows hold other queries and keys
            qb = mx.concatenate([q, q_all[1:B]])
            kb = mx.concatenate([k, k_all[1:B, :, :L]])
            vb = mx.concatenate([v, v_all[1:B, :, :L]])
            out = mx.fast.scaled_dot_product_attention(qb, kb, vb, scale=scale)[:1]
            mx.eval(out)
            diff = mx.abs(out.astype(mx.float32) - alone.astype(mx.float32)).max().item()
            rows.append(
                {
                    "L": L,
                    "B": B,
                    "equal_alone": bool(mx.array_equal(out, alone).item()),
                    "max_diff": diff,
                    "run_to_run_equal": bool(same_twice),
                }
            )
    return rows


def probe_rows(M: int, m, dtype):
    """``[M, in_features]`` random rows for projection ``m``."""
    return mx.random.normal((M, _in_features(m))).astype(dtype)


def run_to_run(f, x, times: int = 10) -> bool:
    first = f(x)
    mx.eval(first)
    for _ in range(times - 1):
        y = f(x)
        mx.eval(y)
        if not mx.array_equal(first, y).item():
            return False
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    p.add_argument("--shape", choices=("quick", "full", "1b"), default="quick")
    p.add_argument("--rows", type=int, default=64, help="projection row counts M = 1 .. rows")
    p.add_argument("--out", default=None)
    p.add_argument("--skip-end-to-end", action="store_true")
    a = p.parse_args(argv)
    mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)
    dtype = DTYPES[a.dtype]
    shape = {"quick": bench_model.QUICK, "full": bench_model.FULL, "1b": LLAMA_1B}[a.shape]
    out = open(a.out, "w") if a.out else None
    emit(
        out,
        {
            "what": "setup",
            "mlx": mx.__version__,
            "device": str(mx.default_device()),
            "dtype": a.dtype,
            "shape": shape.name,
        },
    )
    model = bench_model.make_model(shape, dtype=dtype)
    rows = tuple(range(1, a.rows + 1))
    worst = {"leaks": 0, "moved": 0}
    for sig, (name, m) in projections(model).items():
        r = sweep(_plain_call(m), _in_features(m), dtype, rows=rows, neighbours=True)
        worst["leaks"] += sum(r.leak)
        worst["moved"] += sum(r.moved)
        emit(
            out,
            {
                "what": "projection",
                "name": name,
                "signature": str(sig),
                "switches": r.switches(),
                "leaks": [M for M, x in zip(r.rows, r.leak) if x],
                "moved": [M for M, x in zip(r.rows, r.moved) if x],
                "runs": r.runs()[:8],
                "max_diff": max(r.max_diff),
                "run_to_run_equal": run_to_run(_plain_call(m), probe_rows(min(a.rows, 300), m, dtype)),
            },
        )
    # 4-bit quantized matmul, run to run at M >= 8 (the reported shared-memory race)
    q = nn.QuantizedLinear.from_linear(
        nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False), 64, 4
    )
    for M in (1, 8, 16, 64, 128, 256):
        x = mx.random.normal((M, shape.hidden_size)).astype(dtype)
        emit(
            out, {"what": "quantized_matmul_run_to_run", "M": M, "bits": 4, "equal_10_runs": run_to_run(q, x)}
        )
    att = attention_sweep(dtype, (1, 2, 8, 32, 128), (200, 255, 256, 257, 300, 512, 1024))
    for r in att:
        emit(out, {"what": "attention", **r})
    summary = {
        "what": "summary",
        "projection_leaks": worst["leaks"],
        "projection_moved": worst["moved"],
        "attention_not_equal_alone": [(r["B"], r["L"]) for r in att if not r["equal_alone"]],
        "attention_run_to_run_unequal": sorted({r["L"] for r in att if not r["run_to_run_equal"]}),
    }
    if not a.skip_end_to_end:
        from workbench.engine.request import Request
        from workbench.runtime.loading import load
        from workbench.verify.run_to_run import twice

        emodel, tok = load()
        reqs = [Request(prompt=[11 + 7 * i + j for j in range(20 + 9 * i)], max_tokens=16) for i in range(8)]
        first, second = twice(emodel, tok, reqs, max_batch=8)
        summary["end_to_end_run_to_run_equal"] = first == second
    emit(out, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
