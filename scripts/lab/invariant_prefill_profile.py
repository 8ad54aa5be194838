"""Where the batch-invariant mode's prefill time goes (issue 39, prefill on CUDA): in one
process, the default path, the mode (its prompts' attention in shared calls,
``invariant_prefill_attention``) projecting only the real rows (``invariant_prefill.REAL_ROWS_ONLY``
with the device: the CPU's default) and with the padding rows projected too (without it: the
GPU's default since its run, ``docs/batch-invariance.md``), and the mode with every prompt
attending alone (the eighteenth session's path), alternating, each the prefill
of the same P prompts (submit to every row's first token, as ``workbench invariance --cost``
times it). Per engine: the wall time, the model forwards' graph building (Python until the
forward returns, nothing evaluated), the time in the prefill's phases, the fused-attention
calls, the graph nodes evaluated (one more run, untimed) and whether the device check held.
JSON lines.

    python scripts/lab/invariant_prefill_profile.py --device gpu --prompts 16 --rounds 4
"""

import argparse
import collections
import statistics
import time
from types import SimpleNamespace

import workbench  # noqa: F401
from workbench.bench import invariance_cost as ic
from workbench.bench.files import print_json_line
from workbench.bench.gpu import LLAMA_1B
from workbench.bench.model import ModelShape, make_model
from workbench.bench.step_nodes import counted_evals
from workbench.engine.levers import invariant_prefill
from workbench.engine.levers import invariant_prefill_attention as pa
from workbench.engine.levers.invariant_prefill import BatchedReplayPrefillGroup
from workbench.engine.prefill import PrefillGroup
from workbench.runtime.device import backend

import mlx.core as mx


def _timed_method(owner, name, into):
    """Wrap ``owner.name`` so its wall seconds add up in ``into["Owner.name"]`` (nested calls of
    the same method counted once)."""
    real, label, depth = getattr(owner, name), f"{owner.__name__}.{name}", [0]

    def timed(self, *a, **k):
        depth[0] += 1
        t0 = time.perf_counter()
        try:
            return real(self, *a, **k)
        finally:
            depth[0] -= 1
            if not depth[0]:
                into[label] = into.get(label, 0.0) + time.perf_counter() - t0

    setattr(owner, name, timed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    ap.add_argument("--prompts", type=int, nargs="+", default=[16])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument(
        "--shape", choices=["1b", "small"], default="1b", help="small: a 2-layer llama, a smoke run"
    )
    args = ap.parse_args()
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    shape = LLAMA_1B if args.shape == "1b" else ModelShape.from_proportions("llama-2-layers", 512, 2, 8, 512)
    model, tok = make_model(shape, dtype=mx.bfloat16), SimpleNamespace(eos_token_ids=[])
    build, calls, real_call, real_sdpa = (
        [0.0],
        [0],
        type(model).__call__,
        mx.fast.scaled_dot_product_attention,
    )

    def timed_call(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return real_call(self, *a, **k)
        finally:
            build[0] += time.perf_counter() - t0

    def counted(*a, **k):
        calls[0] += 1
        return real_sdpa(*a, **k)

    type(model).__call__ = timed_call
    phases: dict[str, float] = {}
    for owner, name in (
        (BatchedReplayPrefillGroup, "_run_chunks"),
        (PrefillGroup, "_finish"),
        (PrefillGroup, "run_chunk"),
    ):
        _timed_method(owner, name, phases)
    mx.fast.scaled_dot_product_attention = counted
    backends, device = pa.BACKENDS, "cpu" if args.device == "cpu" else backend()
    # engine -> (the shared attention's backends, the backends projecting only real rows)
    engines = {
        "default": (backends, invariant_prefill.REAL_ROWS_ONLY),
        "shared, real rows only": (backends, invariant_prefill.REAL_ROWS_ONLY | {device}),
        "shared, padding projected": (backends, invariant_prefill.REAL_ROWS_ONLY - {device}),
        "alone": ((), invariant_prefill.REAL_ROWS_ONLY),
    }
    for P in args.prompts:
        prompts = ic.prompts_of(shape.vocab_size, P, 160, 512, seed=5)
        runs = {name: [] for name in engines}
        for r in range(args.rounds + 1):  # the first round warms up, not kept
            names = list(runs) if r % 2 == 0 else list(reversed(runs))
            for name in names:
                pa.BACKENDS, invariant_prefill.REAL_ROWS_ONLY = engines[name]
                sched = ic._scheduler(model, tok, P, name != "default")
                mx.synchronize()
                build[0], calls[0] = 0.0, 0
                phases.clear()
                t0 = time.perf_counter()
                ic._prefilled(sched, prompts, 2)
                wall = time.perf_counter() - t0
                if r:
                    runs[name].append((wall, build[0], calls[0], dict(phases)))
        nodes = {}
        for name in engines:  # one more run each, its evaluated graphs' nodes counted (not timed)
            pa.BACKENDS, invariant_prefill.REAL_ROWS_ONLY = engines[name]
            sched = ic._scheduler(model, tok, P, name != "default")
            with counted_evals(collections.Counter()) as counts:
                ic._prefilled(sched, prompts, 2)
            nodes[name] = counts
        base = statistics.median(w for w, *_ in runs["default"])
        for name, rows in runs.items():
            wall = statistics.median(w for w, *_ in rows)
            keys = sorted({k for *_, p in rows for k in p})
            print_json_line(
                {
                    "device": args.device,
                    "mlx": mx.__version__,
                    "prompts": P,
                    "engine": name,
                    "wall_ms": round(wall * 1e3, 2),
                    "vs_default": round(wall / base, 3),
                    "forward_build_ms": round(statistics.median(r[1] for r in rows) * 1e3, 2),
                    "phase_ms": {
                        k: round(statistics.median(r[3].get(k, 0.0) for r in rows) * 1e3, 2) for k in keys
                    },
                    "attention_calls": rows[-1][2],
                    "graph_nodes": sum(nodes[name].values()),
                    "top_nodes": dict(nodes[name].most_common(8)),
                    "check": {str(k): v for k, v in pa._HOLDS.items()},
                }
            )


if __name__ == "__main__":
    main()
