"""The batch-invariant mode's host work per decode step before and after its cut (issue 39,
the GPU's step is host-bound: docs/gpu.md), against the default path, in ONE process,
alternating (``docs/batch-invariance.md``, "Cost").

Three schedulers hold the same B prompts of 64-68 tokens:

- ``default``: the default path;
- ``before``: the mode as main had it at ebb841a: a lone row padded for each projection with a
  zeros array made anew, every layer's attention making its own ``[B]`` starts array, and on
  CUDA the CPU's weight-size rule (a float weight up to 4 MiB, the 1B shape's ``k_proj`` /
  ``v_proj``, in one-row products);
- ``after``: the mode now: one pad per input shared by the projections that read it (q / k /
  v, gate / up), the zero rows a kept constant, one starts array per forward, and on CUDA
  ``k_proj`` / ``v_proj`` in the swept range blocks.

Then ``--pairs`` rounds of one step each, the order rotated every round
(:func:`workbench.bench.invariance_cost.rotated_steps`). Per B it prints (JSON) the median ms
per step, the median of the per-round ratios to the default step and their quartiles, the
nodes of one step's graph per engine (``mx.export_to_dot``), and one step per engine split by
:func:`workbench.bench.host_time.timed_mlx_calls` (``launch``: inside ``mx.async_eval``,
``wait``: inside ``mx.eval``, ``python``: the rest), median over ``--pairs`` extra steps.

    python scripts/lab/invariant_host_ab.py --device gpu --shape 1b --dtype bfloat16 --batch-sizes 1 8 32 128
    python scripts/lab/invariant_host_ab.py --shape quick --batch-sizes 1 8 --pairs 6   # a CPU check
"""

import argparse
import collections
import os
import re
import statistics
import tempfile
import time
from dataclasses import replace
from types import SimpleNamespace

import workbench  # noqa: F401  (loads the optimized BLAS before mlx)
from workbench.bench import model as bench_model
from workbench.bench.files import print_json_line
from workbench.bench.host_time import timed_mlx_calls
from workbench.bench.invariance_cost import _prefilled, _scheduler, prompts_of, rotated_steps, summary
from workbench.engine.levers import invariant, invariant_attention

import mlx.core as mx

AFTER = {"blocked": invariant.blocked, "starts_array": invariant_attention.starts_array}


def blocked_before(f, x, blocks, rows_apart=None, pad=None):
    """:func:`invariant.blocked` as main had it: every call through the plan, a short call
    padded with zeros made anew (``pad`` ignored)."""
    if blocks is None:
        return f(x)
    lead, K = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, K)
    M = rows.shape[0]
    if blocks == invariant.ONE_ROW and rows_apart is not None and M > 1:
        y = rows_apart(rows)
        return y.reshape(*lead, y.shape[-1])
    parts = []
    for start, kept, call in blocks.plan(M):
        block = rows[start : start + kept]
        if call > kept:
            block = mx.concatenate([block, mx.zeros((call - kept, K), dtype=block.dtype)])
        parts.append(f(block)[:kept])
    y = parts[0] if len(parts) == 1 else mx.concatenate(parts)
    return y.reshape(*lead, y.shape[-1])


BEFORE = {"blocked": blocked_before, "starts_array": lambda starts: mx.array(starts, dtype=mx.int32)}


def use(code):
    invariant.blocked = code["blocked"]
    invariant_attention.starts_array = code["starts_array"]


def mode(model, tok, B, before):
    """An invariant scheduler calibrated afresh with main's weight-size rule (``before``:
    also on CUDA) or this change's (the CPU only)."""
    invariant._CALIBRATED.clear()
    invariant._SWEPT.clear()
    invariant.ROWS_APART_BACKENDS = ("cpu", "cuda") if before else ("cpu",)
    try:
        return _scheduler(model, tok, B, True)
    finally:
        invariant.ROWS_APART_BACKENDS = ("cpu",)
        invariant._CALIBRATED.clear()
        invariant._SWEPT.clear()


def nodes(sched):
    """Primitives in the largest graph one decode step of ``sched`` evaluates."""
    biggest: list = [collections.Counter()]
    real = {"async_eval": mx.async_eval, "eval": mx.eval}

    def spy(name):
        def call(*arrays):
            if arrays:
                with tempfile.NamedTemporaryFile(suffix=".dot") as f:
                    mx.export_to_dot(f.name, *arrays)
                    seen = collections.Counter(re.findall(r'label ="([^"]+)"', open(f.name).read()))
                if sum(seen.values()) > sum(biggest[0].values()):
                    biggest[0] = seen
            return real[name](*arrays)

        return call

    mx.async_eval, mx.eval = spy("async_eval"), spy("eval")
    try:
        sched.step()
        mx.synchronize()
    finally:
        mx.async_eval, mx.eval = real["async_eval"], real["eval"]
    return sum(biggest[0].values()), dict(biggest[0].most_common(12))


def host_split(sched, steps):
    rows = []
    for _ in range(steps):
        totals = collections.defaultdict(float)
        t0 = time.perf_counter()
        with timed_mlx_calls(totals):
            sched.step()
            mx.synchronize()
        total = time.perf_counter() - t0
        rows.append((total, totals["launch"], totals["wait"]))
    med = lambda i: round(1e3 * statistics.median(r[i] for r in rows), 3)  # noqa: E731
    return {
        "step_ms": med(0),
        "launch_ms": med(1),
        "wait_ms": med(2),
        "python_ms": round(1e3 * statistics.median(r[0] - r[1] - r[2] for r in rows), 3),
    }


def run(model, tok, B, pairs):
    scheds = {
        "default": _scheduler(model, tok, B, False),
        "before": mode(model, tok, B, True),
        "after": mode(model, tok, B, False),
    }
    for name, sched in scheds.items():
        use(BEFORE if name == "before" else AFTER)
        _prefilled(sched, prompts_of(model.args.vocab_size, B, 64, 68), 3 * pairs + 8)
    ms, out = alternated(scheds, B, pairs, before=lambda name: use(BEFORE if name == "before" else AFTER))
    vs = [a / b for a, b in zip(ms["after"], ms["before"])]
    out["after_vs_before"] = round(statistics.median(vs), 3)
    for name, sched in scheds.items():
        use(BEFORE if name == "before" else AFTER)
        out[f"{name}_nodes"], out[f"{name}_top"] = nodes(sched)
        out[f"{name}_host"] = host_split(sched, pairs)
    use(AFTER)
    out["kv_blocks"] = {
        name: sorted({str(b) for s, b in scheds[name].batch_invariant.blocks.items()})
        for name in ("before", "after")
    }
    return out


def alternated(scheds, B, pairs, before=None):
    """``rotated_steps(scheds, pairs, before)``: the per-engine ms and the line's numbers
    (``B``, ``pairs``, the 1-minute load before and after, :func:`summary`)."""
    load0 = os.getloadavg()[0]
    ms, cpu = rotated_steps(scheds, pairs, before=before)
    load = [round(load0, 2), round(os.getloadavg()[0], 2)]
    return ms, {"B": B, "pairs": pairs, "load": load, **summary(ms, cpu)}


def parsed_model(ap, shapes=("full", "quick", "1b"), default="quick"):
    """``ap`` with the A/B scripts' arguments (``--batch-sizes --pairs --shape --dtype
    --device --out``) parsed; returns ``(args, shape, model, tok)``: a random-weight llama of
    the shape on the device (``quick`` or ``tiny``: llama-tiny; ``1b``: untied read-out)."""
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--shape", choices=list(shapes), default=default)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    from workbench.bench.gpu import LLAMA_1B

    shape = {
        "full": bench_model.FULL,
        "quick": bench_model.QUICK,
        "tiny": bench_model.QUICK,
        "1b": replace(LLAMA_1B, tie_word_embeddings=False),
    }[args.shape]
    model = bench_model.make_model(shape, dtype=getattr(mx, args.dtype))
    return args, shape, model, SimpleNamespace(eos_token_ids=[])


def main():
    args, shape, model, tok = parsed_model(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    for B in args.batch_sizes:
        line = {
            "shape": shape.name,
            "dtype": args.dtype,
            "device": args.device,
            **run(model, tok, B, args.pairs),
        }
        print_json_line(line, args.out)


if __name__ == "__main__":
    main()
