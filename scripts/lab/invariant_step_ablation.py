"""Where the batch-invariant mode's decode step cost goes on a model (issue 39; ``docs/batch-
invariance.md``, "The real chat model on the CPU, and a row block's call cost").

``--part steps``: per B, four schedulers hold the same B prompts of 64-68 tokens: the default
path, the mode, the mode with its projections' row blocks swapped for plain calls, and the mode
with its per-row attention swapped for the model's own batched attention (the last two are for
timing only: not invariant); then ``--pairs`` rounds of one step each, the order rotated every
round (:func:`workbench.bench.invariance_cost.rotated_steps`). Prints each engine's median ms and
the median of its per-round ratios to the default step.

``--part attention``: one decode query per row over B rows of ``--heads`` / ``--kv-heads`` heads
of 64 (left padding of 0-9 columns), 30 layers chained in one graph: MLX's fused attention with a
mask (the default path), the mode's key blocks
(:func:`workbench.engine.levers.invariant_keyblocks.key_block_attention`) and MLX's attention
called once per row on the row's own keys (whose rows equal their runs alone: checked, printed).
Milliseconds per 30 layers, the lower of two medians of 30 evaluations.

    python scripts/lab/invariant_step_ablation.py --model smollm2-135m --part steps
    python scripts/lab/invariant_step_ablation.py --part attention --heads 9 --kv-heads 3
"""

import argparse
import statistics
import sys
from pathlib import Path

import workbench  # noqa: F401  (loads the optimized BLAS before mlx)
from workbench.bench.invariance_cost import _prefilled, _scheduler, prompts_of, rotated_steps
from workbench.engine.levers import invariant
from workbench.engine.levers.invariant_keyblocks import key_block_attention
from workbench.runtime.loading import load

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from invariant_call_cost import median_ms  # noqa: E402  (the sibling lab script's timer)

REAL = {"blocked": invariant.blocked, "per_row": invariant._per_row}


def plain_blocked(f, x, blocks, *args, **kwargs):
    return f(x)


def batched_attention(held):
    def sdpa(original, queries, keys, values, cache, scale, mask, sinks=None):
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask)

    return sdpa


VARIANTS = {
    "mode": (REAL["blocked"], REAL["per_row"]),
    "mode, plain projections": (plain_blocked, REAL["per_row"]),
    "mode, batched attention": (REAL["blocked"], batched_attention),
}


def use(name):
    invariant.blocked, invariant._per_row = VARIANTS.get(name, (REAL["blocked"], REAL["per_row"]))


def steps(model_name, batch_sizes, pairs):
    model, tok = load(model_name)
    for B in batch_sizes:
        scheds = {"default": _scheduler(model, tok, B, False)}
        scheds.update({n: _scheduler(model, tok, B, True) for n in VARIANTS})
        prompts = prompts_of(model.args.vocab_size, B, 64, 68)
        for name, s in scheds.items():
            use(name)
            _prefilled(s, prompts, 3 * pairs + 10)
        ms, _ = rotated_steps(scheds, pairs, before=use)
        use("default")
        base = ms["default"]
        cells = [
            f"{n}: {statistics.median(v):.1f} ms {statistics.median(a / b for a, b in zip(v, base)):.3f}x"
            for n, v in ms.items()
        ]
        print(f"B={B}: " + "; ".join(cells), flush=True)


def per_row(q, k, v, starts, scale):
    outs = [
        mx.fast.scaled_dot_product_attention(
            q[b : b + 1], k[b : b + 1, :, s:], v[b : b + 1, :, s:], scale=scale
        )
        for b, s in enumerate(starts)
    ]
    return outs[0] if len(outs) == 1 else mx.concatenate(outs)


def chained(fn, q, ks, vs, *args):
    out = q
    for k, v in zip(ks, vs):
        out = fn(out, k, v, *args) + q
    return out


def lowest_median_ms(fn, n=30):
    """The lower of two medians of ``n`` evaluations of ``fn`` (ms)."""
    return min(median_ms(fn, n) for _ in range(2))


def one_shape(B, S, heads, kv_heads, layers, D=64):
    """The three attentions' ms per ``layers`` chained layers at one ``(B, S)``, and whether
    the one-call-per-row rows equal their runs alone."""
    q = mx.random.normal((B, heads, 1, D))
    ks = [mx.random.normal((B, kv_heads, S, D)) for _ in range(layers)]
    vs = [mx.random.normal((B, kv_heads, S, D)) for _ in range(layers)]
    starts = [min(S - 1, (b % 4) * 3) for b in range(B)] if B > 1 else [0]
    first = mx.array(starts, dtype=mx.int32)
    mask = (mx.arange(S)[None, :] >= first[:, None])[:, None, None, :] if B > 1 else None
    mx.eval(q, ks, vs, first)

    def fused(q, k, v):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)

    got = {
        "fused (default)": lowest_median_ms(lambda: chained(fused, q, ks, vs)),
        "key blocks (the mode)": lowest_median_ms(
            lambda: chained(key_block_attention, q, ks, vs, first, 0.125, S - min(starts))
        ),
        "one call per row": lowest_median_ms(lambda: chained(per_row, q, ks, vs, starts, 0.125)),
    }
    out = per_row(q, ks[0], vs[0], starts, 0.125)
    k0, v0 = ks[0], vs[0]
    same = all(
        mx.array_equal(
            out[b], per_row(q[b : b + 1], k0[b : b + 1, :, s:], v0[b : b + 1, :, s:], [0], 0.125)[0]
        ).item()
        for b, s in enumerate(starts)
    )
    return got, same


def attention(heads, kv_heads, layers=30):
    for B, S in [(1, 70), (8, 75), (32, 80), (8, 300), (32, 500)]:
        got, same = one_shape(B, S, heads, kv_heads, layers)
        cells = ", ".join(f"{k} {v:.2f}" for k, v in got.items())
        print(f"B={B} S={S}: {cells} ms per {layers} layers; one call per row == alone: {same}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("steps", "attention"), default="steps")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    a = ap.parse_args()
    if a.part == "steps":
        steps(a.model, a.batch_sizes, a.pairs)
    else:
        attention(a.heads, a.kv_heads)


if __name__ == "__main__":
    main()
