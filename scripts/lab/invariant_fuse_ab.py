"""The batch-invariant mode with its sibling projections fused (q / k / v and gate / up as one
matmul each: ``levers/invariant_fuse.py``) against the mode unfused and the default path, in
ONE process, alternating (issue 39: on CUDA the step is host-bound and each projection's
``M >= 2`` launch costs the host about 13 us more than the default path's ``M = 1`` kernel;
``docs/batch-invariance.md``, "Cost").

Three schedulers hold the same B prompts of 64-68 tokens: ``default`` (the default path),
``unfused`` (the mode, each projection its own matmul) and ``fused`` (the mode with
``invariant_fuse.FUSE_BACKENDS`` holding this backend, so on the CPU too). Then ``--pairs``
rounds of one step each, the order rotated every round
(:func:`workbench.bench.invariance_cost.rotated_steps`). Per B one JSON line: the median ms
per step, the median of the per-round ratios to the default step and their quartiles
(``unfused_ratio``, ``fused_ratio``), ``fused_vs_unfused`` (the median per-round ratio), the
projection calls of one step per engine of the mode (``invariant.blocked`` calls), the nodes
of one step's graph and its host split (as ``invariant_host_ab.py``). First one line on the
fusion itself: the groups, the active memory before and after it (the members' weights are
rebound to rows of the fused arrays) and whether the default path's logits kept their bits
(``default_bits_kept``, one row and several). Last, per ``--check-batches`` B, one line: each
row of a batched run in the fused mode (all at once, ``max_batch`` = B) against its run alone
(tokens and log-probs, ``==``).

    python scripts/lab/invariant_fuse_ab.py --device gpu --shape 1b --dtype bfloat16 --batch-sizes 1 8 32 128 --pairs 12
    python scripts/lab/invariant_fuse_ab.py --device cpu --shape tiny --batch-sizes 1 8 --pairs 4 --check-batches 8 24
"""

import argparse
import contextlib
import gc
import statistics
import sys
import time
from pathlib import Path

import workbench as wb
from workbench.bench.files import print_json_line
from workbench.bench.invariance_cost import _prefilled, _scheduler, prompts_of
from workbench.engine.levers import invariant, invariant_fuse
from workbench.runtime.device import backend
from workbench.verify import invariance

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from invariant_host_ab import alternated, host_split, nodes, parsed_model  # noqa: E402  (the sibling lab script's measures)

CHUNK = 64


@contextlib.contextmanager
def fusion(on):
    """Within the block a new mode scheduler fuses its sibling projections (``on``) or not."""
    saved = invariant_fuse.FUSE_BACKENDS
    invariant_fuse.FUSE_BACKENDS = (backend(),) if on else ()
    try:
        yield
    finally:
        invariant_fuse.FUSE_BACKENDS = saved


def fused_scheduler(model, tok, B, **kw):
    with fusion(True):
        return wb.Scheduler(model, tok, max_batch=B, batch_invariant=True, **kw)


def fuse_once(model):
    """Fuse the model's groups, measuring the active memory around it and the default path's
    logits before and after (one row ``[1, 1]`` and several ``[4, 9]``)."""
    inputs = [mx.array([[5]]), mx.array([[(3 * b + 7 * j) % 97 + 1 for j in range(9)] for b in range(4)])]
    before = [model(x) for x in inputs]
    mx.eval(before)
    gc.collect()
    held = mx.get_active_memory()
    with fusion(True):
        groups = invariant_fuse.fuse(model)
    gc.collect()
    fused_bytes = mx.get_active_memory()  # before the logits below
    after = [model(x) for x in inputs]
    mx.eval(after)
    return {
        "groups": len(groups),
        "members": sorted({"/".join(n for n in names) for _, names in invariant_fuse.sibling_groups(model)}),
        "fused_weight_mib": round(sum(g.module["weight"].nbytes for g in groups) / 2**20, 1),
        "active_mib_before": round(held / 2**20, 1),
        "active_mib_after": round(fused_bytes / 2**20, 1),
        "default_bits_kept": [mx.array_equal(a, b).item() for a, b in zip(before, after)],
    }


def projection_calls(sched):
    """:func:`invariant.blocked` calls in one decode step of ``sched``."""
    calls = []
    real = invariant.blocked
    invariant.blocked = lambda f, x, *a: calls.append(x.shape) or real(f, x, *a)
    try:
        sched.step()
        mx.synchronize()
    finally:
        invariant.blocked = real
    return len(calls)


def run(model, tok, B, pairs):
    with fusion(False):
        scheds = {
            "default": _scheduler(model, tok, B, False),
            "unfused": _scheduler(model, tok, B, True),
        }
    scheds["fused"] = fused_scheduler(model, tok, B, prefill_step_size=2048)
    for sched in scheds.values():
        _prefilled(sched, prompts_of(model.args.vocab_size, B, 64, 68), 3 * pairs + 10)
    ms, out = alternated(scheds, B, pairs)
    out["fused_vs_unfused"] = round(statistics.median(a / b for a, b in zip(ms["fused"], ms["unfused"])), 3)
    for name in ("unfused", "fused"):
        out[f"{name}_projections"] = projection_calls(scheds[name])
    for name, sched in scheds.items():
        out[f"{name}_nodes"], out[f"{name}_top"] = nodes(sched)
        out[f"{name}_host"] = host_split(sched, pairs)
    return out


def mixed_requests(vocab, count, max_tokens):
    """``count`` requests of 1-150 prompt tokens (ids below ``vocab``), every fifth seeded at
    temperature 0.8, the others greedy; no stop ids."""
    return [
        wb.Request(
            prompt=[(11 * i + 7 * j) % (vocab - 1) + 1 for j in range(1 + (37 * i) % 150)],
            max_tokens=max_tokens,
            stop_ids=[],
            **({"temperature": 0.8, "seed": 5 + i} if i % 5 == 4 else {}),
        )
        for i in range(count)
    ]


def rows_check(model, tok, batches, max_tokens):
    """Per B in ``batches``: rows of a fused batched run bit-equal to their runs alone (none
    for ``--check-batches`` given no B)."""
    if not batches:
        return
    reqs = mixed_requests(model.args.vocab_size, max(batches), max_tokens)
    t0 = time.perf_counter()
    with fusion(True):
        solo = [invariance.alone(model, tok, r, CHUNK) for r in reqs]
    alone_s = time.perf_counter() - t0
    for B in batches:
        sched = fused_scheduler(model, tok, B, prefill_step_size=CHUNK)
        uids = [sched.submit(r) for r in reqs[:B]]
        sched.run()
        got = [(sched.tokens(u), sched.logprobs(u)) for u in uids]
        yield {
            "check": "rows bit-equal alone, fused, all at once",
            "B": B,
            "max_tokens": max_tokens,
            "fused_members": len(sched.batch_invariant.fused),
            "equal": sum(g == s for g, s in zip(got, solo[:B])),
            "tokens_equal": sum(g[0] == s[0] for g, s in zip(got, solo[:B])),
            "rows": B,
            "alone_s": round(alone_s, 1),
        }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check-batches", type=int, nargs="*", default=[8, 96])
    ap.add_argument("--check-tokens", type=int, default=8)
    args, shape, model, tok = parsed_model(ap, shapes=("tiny", "full", "1b"), default="tiny")
    head = {"shape": shape.name, "dtype": args.dtype, "device": args.device, "mlx": mx.__version__}
    print_json_line({**head, "fusion": fuse_once(model)}, args.out)
    for B in args.batch_sizes:
        print_json_line({**head, **run(model, tok, B, args.pairs)}, args.out)
    for line in rows_check(model, tok, args.check_batches, args.check_tokens):
        print_json_line({**head, **line}, args.out)


if __name__ == "__main__":
    main()
