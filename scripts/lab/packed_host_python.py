"""The packed and padded layouts' host Python per full-batch decode step, on two source trees
alternating (issue 40: on CUDA the decode step is host-bound, and the packed step's Python was
1.15-1.20x the padded step's; ``docs/packed.md``, eighteenth session).

Each measurement runs in a fresh process whose ``PYTHONPATH`` is one tree (``--trees
NAME=PATH ...``; e.g. ``before=/tmp/pkhbase`` made by ``git archive 7a28f4f workbench | tar -x
-C /tmp/pkhbase``, ``after=.``): at ``B`` rows, per layout (``padded`` and ``packed``, their order
swapped every round), ``--runs`` runs of :func:`~workbench.bench.host_time.step_anatomy` on
``step_nodes``' 16-layer tiny llama (:data:`~workbench.bench.step_nodes.TINY_16`, the GPU
benchmark's quick prompts, ``--tokens`` new tokens a row) with the GPU benchmark's engine
settings (:func:`~workbench.bench.gpu_packed.engine_makers`), on the ``cuda`` path (the graph and
Python CUDA gets, built here by :func:`~workbench.bench.step_nodes.cuda_like`: the packed layout
takes its paged-kernel path) or the ``cpu`` path; the lowest run's median
``python_cpu_ms`` (main-thread CPU time outside MLX's evaluation calls: the engine's
bookkeeping and the graph's building) and ``python_ms`` (the same on the wall clock). The trees
alternate, each first in turn, ``--rounds`` times; printed per tree, path and ``B``: the median
over the rounds of each layout's ms and of packed / padded, and ``uptime``'s load before and after.

Usage: ``python scripts/lab/packed_host_python.py --trees before=/tmp/pkhbase after=.
[--batch 1 8 32 128] [--paths cuda cpu] [--rounds 3] [--runs 2] [--tokens 24]``
(``--worker``: one process's measurement, JSON on stdout; what the driver runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

LAYOUTS = ("padded", "packed")


def worker(a: argparse.Namespace) -> None:
    """Measure every ``--batch`` on ``--paths`` with the ``workbench`` on ``PYTHONPATH``."""
    from workbench.bench.gpu_packed import PACKED, PADDED, engine_makers
    from workbench.bench.host_time import step_anatomy
    from workbench.bench.model import make_model
    from workbench.bench.step_nodes import STEP_CONFIG, cuda_like, step_arrivals
    from workbench.runtime.loading import load

    model, tokenizer = make_model(STEP_CONFIG.shape), load()[1]
    makers = engine_makers(model, tokenizer, STEP_CONFIG)
    names = {"padded": PADDED, "packed": PACKED}
    out = []
    for path in a.paths:
        for B in a.batch:
            order = LAYOUTS if a.first == "padded" else LAYOUTS[::-1]
            got = {}
            with cuda_like() if path == "cuda" else contextlib.nullcontext():
                for layout in order:
                    runs = []
                    for _ in range(a.runs):
                        engine = makers[names[layout]](B)
                        runs.append(step_anatomy(engine, step_arrivals(tokenizer, B, a.tokens)))
                        engine.close()
                    got[layout] = {k: min(r[k] for r in runs) for k in ("python_ms", "python_cpu_ms")}
            out.append({"path": path, "B": B, **got})
    print(json.dumps(out))


def uptime() -> str:
    """``uptime``'s load averages (the machine's cores are shared)."""
    return (
        subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("load average: ")[-1]
    )


def driver(a: argparse.Namespace) -> None:
    """Alternate the trees' worker processes ``--rounds`` times and print the medians."""
    trees = dict(t.split("=", 1) for t in a.trees)
    got: dict = {}
    loads = [uptime()]
    for r in range(a.rounds):
        names = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for name in names:
            env = dict(os.environ, PYTHONPATH=str(Path(trees[name]).resolve()))
            cmd = [sys.executable, __file__, "--worker", "--first", LAYOUTS[r % 2], "--runs", str(a.runs)]
            cmd += ["--tokens", str(a.tokens), "--batch", *map(str, a.batch), "--paths", *a.paths]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            for row in json.loads(done.stdout.strip().splitlines()[-1]):
                got.setdefault((name, row["path"], row["B"]), []).append(row)
        loads.append(uptime())
        print(f"round {r + 1}/{a.rounds} done; load {loads[-1]}", flush=True)
    print(f"load averages (1, 5, 15 min) before and after each round: {' | '.join(loads)}")
    for (name, path, B), rows in sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        med = {
            (layout, k): statistics.median(r[layout][k] for r in rows)
            for layout in LAYOUTS
            for k in ("python_ms", "python_cpu_ms")
        }
        ratio = statistics.median(r["packed"]["python_cpu_ms"] / r["padded"]["python_cpu_ms"] for r in rows)
        print(
            f"{name:<7} {path:<4} B={B:<4} python CPU ms packed {med['packed', 'python_cpu_ms']:6.2f} "
            f"padded {med['padded', 'python_cpu_ms']:6.2f} (packed / padded {ratio:.2f}x); wall "
            f"{med['packed', 'python_ms']:6.2f} / {med['padded', 'python_ms']:6.2f} ms; {len(rows)} rounds",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="+", default=["this=."], help="NAME=PATH of each tree (on PYTHONPATH)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--paths", nargs="+", default=["cuda", "cpu"], choices=("cuda", "cpu"))
    ap.add_argument("--rounds", type=int, default=3, help="worker processes per tree (default 3)")
    ap.add_argument("--runs", type=int, default=2, help="runs per layout and B in a worker (the lowest kept)")
    ap.add_argument("--tokens", type=int, default=24, help="new tokens a row in a run (default 24)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--first", default="padded", choices=LAYOUTS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    worker(a) if a.worker else driver(a)


if __name__ == "__main__":
    main()
