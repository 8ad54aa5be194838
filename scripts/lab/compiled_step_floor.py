"""The floor of a decode step's host time on MLX 0.32 (issue 40's GPU goals: host <= 1 ms at
B = 128, B = 128 <= 4 ms, B = 1 >= 40% of the weight-read bound): the whole one-token step of
the 1B-shaped llama under ``mx.compile`` with every shape fixed, against mlx-lm's model
called as the engines call it, on the same caches, pipelined the same way.

The compiled step (:func:`workbench.bench.compiled_floor.compiled_step`) takes the tokens
``[B]``, the write position (an array, so one trace serves every step) and per layer
fixed-size key and value buffers
``[B, n_kv_heads, S_max, head_dim]``; it writes the step's keys and values with
``mx.slice_update`` at the position, attends all ``S_max`` columns with no mask (MLX's
fused one-query attention; here ``S_max`` is the context plus the one column every step
rewrites), and returns the greedy tokens and the new buffers. No Python runs per layer
after the first trace: what is left of the host's time is MLX's own dispatch of the
compiled graph's kernels. So no engine written over MLX 0.32's Python API (which offers no
captured CUDA graph) launches a step for less than this; if it misses a goal, the goal is
out of reach of the engine's code on this MLX.

Per B, alternating ``--rounds`` times: ``plain`` (mlx-lm's model over ``BatchKVCache`` s) and
``compiled``: median ms per pipelined step (launch step t + 1, then read step t), the time
inside ``mx.async_eval`` (launch) and the graph's primitives. JSON lines.

    python scripts/lab/compiled_step_floor.py --device gpu --batch 1 32 128
    python scripts/lab/compiled_step_floor.py --quick            # the CPU, a small shape
"""

import argparse
import json
import statistics
from dataclasses import replace

import workbench  # noqa: F401  (first: TF32 off, the optimized CPU BLAS)
from workbench.bench.compiled_floor import agrees_with_mlx_lm, compiled_step, pipelined
from workbench.bench.gpu import LLAMA_1B
from workbench.bench.model import QUICK, make_model

import mlx.core as mx


def primitives(*outputs) -> int:
    import re
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".dot") as f:
        mx.export_to_dot(f.name, *outputs)
        return len(re.findall(r"label =", open(f.name).read()))


def run_plain(model, B, context, steps, warm):
    from mlx_lm.models.cache import BatchKVCache

    args, dt = model.args, model.model.embed_tokens.weight.dtype
    caches = []
    for _ in model.layers:
        c = BatchKVCache([0] * B)
        shape = (B, args.num_key_value_heads, context, args.head_dim)
        c.update_and_fetch(mx.random.normal(shape).astype(dt), mx.random.normal(shape).astype(dt))
        caches.append(c)
    mx.eval([c.state for c in caches])

    def launch(t):
        return mx.argmax(model(t.reshape(-1, 1), cache=caches)[:, -1, :], axis=-1).astype(mx.uint32)

    return pipelined_counted(launch, B, steps, warm)


def run_compiled(model, B, context, steps, warm):
    """The compiled step as ``step_floor`` runs it: column ``context`` of ``context + 1``-column
    buffers written every step, all columns attended (no mask)."""
    args, dt = model.args, model.model.embed_tokens.weight.dtype
    shape = (B, args.num_key_value_heads, context + 1, args.head_dim)
    state = {
        "k": [mx.random.normal(shape).astype(dt) for _ in model.layers],
        "v": [mx.random.normal(shape).astype(dt) for _ in model.layers],
    }
    mx.eval(state["k"], state["v"])
    step, pos = compiled_step(model, context + 1), mx.array([context], dtype=mx.int32)

    def launch(t):
        nxt, state["k"], state["v"] = step(t, pos, state["k"], state["v"])
        return nxt

    return pipelined_counted(launch, B, steps, warm)


def pipelined_counted(launch, B, steps, warm):
    """:func:`workbench.bench.compiled_floor.pipelined`'s medians and the graph's primitives."""
    count = primitives(launch(mx.zeros((B,), dtype=mx.uint32)))
    return (*pipelined(launch, B, steps, warm), count)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--quick", action="store_true", help="the small CPU shape")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--context", type=int, default=350)
    args = ap.parse_args()
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    shape = QUICK if args.quick else replace(LLAMA_1B, tie_word_embeddings=False)
    model = make_model(shape, dtype=mx.float32 if args.quick else mx.bfloat16)
    print(json.dumps({"compiled_agrees_with_plain": agrees_with_mlx_lm(model)}), flush=True)
    for B in args.batch:
        got = {"plain": [], "compiled": []}
        for r in range(args.rounds):
            for name in ("plain", "compiled") if r % 2 == 0 else ("compiled", "plain"):
                mx.random.seed(B)
                fn = run_plain if name == "plain" else run_compiled
                got[name].append(fn(model, B, args.context, args.steps, 5))
        for name, runs in got.items():
            line = {
                "B": B,
                "engine": name,
                "shape": shape.name,
                "device": args.device,
                "step_ms": round(1e3 * statistics.median(r[0] for r in runs), 3),
                "step_ms_rounds": [round(1e3 * r[0], 3) for r in runs],
                "launch_ms": round(1e3 * statistics.median(r[1] for r in runs), 3),
                "primitives": runs[0][2],
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
