"""The batch-invariant mode's graph building per decode step (the host's Python before
``mx.async_eval``: on CUDA the step is host-bound) against the default path's, on the CPU with
CUDA's Python path stood in (``docs/batch-invariance.md``, "Cost", the eighteenth session).

Stood in, for timing only (the outputs are meaningless): ``backend()`` answers ``"cuda"``, so
the mode takes its CUDA branches (the padded-rows attention, fusion on, no one-row products)
and the default path its CUDA fast path; the padded-rows kernel is replaced by a zeros array
of its output's shape (the CPU cannot run it); every projection runs CUDA bf16's
``RowBlocks(2, 256)``. The model: a random llama of 16 layers (hidden 512, 8 heads of 64, 4096
tokens), float32. Three schedulers (``default``, the mode ``unfused`` and ``fused``) hold the
same B prompts of 64-68 tokens; then ``--steps`` rounds of one step each, in turn, each ended
by ``mx.synchronize()``; per engine the model call's wall time (graph building, no evaluation)
is kept, and per B one JSON line gives its first quartile and median in ms.

Run it once per code version, alternating, the older one from a ``git archive`` on
``PYTHONPATH``::

    PYTHONPATH=/tmp/base python scripts/lab/invariant_build_ab.py --batch-sizes 1 8 32 128
    PYTHONPATH=$PWD python scripts/lab/invariant_build_ab.py --batch-sizes 1 8 32 128
"""

import argparse
import os
import statistics
import sys
import time
from types import SimpleNamespace

import workbench
from workbench.bench import model as bench_model
from workbench.bench.files import print_json_line
from workbench.bench.invariance_cost import _prefilled, prompts_of
from workbench.engine.levers import invariant, invariant_fuse, padded_attention
from workbench.runtime import device

import mlx.core as mx

SHAPE = bench_model.ModelShape.from_proportions("llama-16-layers", 512, 16, 8, 4096)


def zeros_kernel(inputs, template, grid, threadgroup, output_shapes, output_dtypes):
    """The padded-rows kernel's stand-in: its output's shape, zeros."""
    return [mx.zeros(output_shapes[0], dtype=output_dtypes[0])]


def stand_in_cuda():
    """``backend()`` -> ``"cuda"`` wherever it was imported; the kernel and blocks stood in."""
    cuda = lambda: "cuda"  # noqa: E731
    for mod in list(sys.modules.values()):
        if (
            getattr(mod, "__name__", "").startswith("workbench")
            and getattr(mod, "backend", None) is device.backend
        ):
            mod.backend = cuda
    device.backend = cuda
    padded_attention._kernel = lambda: zeros_kernel
    invariant._first_agreeing = lambda module, first: invariant.RowBlocks(2, 256)


def schedulers(model, B):
    tok = SimpleNamespace(eos_token_ids=[])
    out = {}
    for name, on, fuse in (("default", False, ()), ("unfused", True, ()), ("fused", True, ("cuda",))):
        invariant_fuse.FUSE_BACKENDS = fuse
        out[name] = workbench.Scheduler(model, tok, max_batch=B, prefill_step_size=2048, batch_invariant=on)
    return out


def run(model, B, steps):
    scheds = schedulers(model, B)
    for sched in scheds.values():
        _prefilled(sched, prompts_of(SHAPE.vocab_size, B, 64, 68), steps + 20)
    call, now, times = type(model).__call__, [None], {name: [] for name in scheds}

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = call(self, *args, **kwargs)
        times[now[0]].append(time.perf_counter() - t0)
        return out

    type(model).__call__ = timed
    try:
        load0 = os.getloadavg()[0]
        for i in range(steps * len(scheds)):
            now[0] = list(scheds)[i % len(scheds)]
            scheds[now[0]].step()
            mx.synchronize()
    finally:
        type(model).__call__ = call
    line = {"B": B, "steps": steps, "load": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    for name, ts in times.items():
        line[f"{name}_build_ms"] = round(1e3 * statistics.quantiles(ts[5:], n=4)[0], 3)
        line[f"{name}_build_ms_median"] = round(1e3 * statistics.median(ts[5:]), 3)
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    stand_in_cuda()
    model = bench_model.make_model(SHAPE)
    for B in args.batch_sizes:
        line = {"workbench": os.path.dirname(workbench.__file__), **run(model, B, args.steps)}
        print_json_line(line, args.out)


if __name__ == "__main__":
    main()
