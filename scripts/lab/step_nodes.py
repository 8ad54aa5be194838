"""Graph nodes and host Python of one full-batch decode step, per layout and B (issue 40: on an
H100 the packed step is host-bound at every B, so what it costs is its nodes and its Python).

On ``TINY_16`` (:mod:`workbench.bench.step_nodes`: the 1B-shaped llama's 16 layers and 8 KV
heads of dim 64 at a quarter of its width, float32, random weights) with the GPU benchmark's
quick prompts (16-64 tokens), per ``B``:

- ``nodes``: the primitives of one full-batch decode iteration's graph (every ``mx.async_eval``
  / ``mx.eval`` argument's unevaluated graph, :func:`~workbench.bench.step_nodes.step_nodes`),
  total and the most frequent kinds;
- ``python_ms`` / ``python_cpu_ms``: the iteration's wall / main-thread CPU time outside MLX's
  evaluation calls (:func:`~workbench.bench.host_time.step_anatomy`: building the graph and the
  engine's bookkeeping), ``launch_ms`` the wall time inside ``mx.async_eval``: each run's median
  over its full-batch iterations (``--tokens`` new tokens a row), the lowest of ``--rounds`` runs
  (the machine's cores are shared: the lowest is the least disturbed).

Layouts: ``padded``, ``packed`` and ``mlx-lm`` (``BatchGenerator``), each on two paths:
``cpu`` (what runs here: MLX's fast ops as their CPU fallback graphs, the packed layout's
decode-rows path, the padded layout's masked attention) and ``cuda`` (the graph CUDA gets,
built here by :func:`~workbench.bench.step_nodes.cuda_like`: each fused kernel one node, the
device answering ``"cuda"`` so both layouts take their CUDA kernels; its Python is the CUDA
path's, less MLX's kernel calls). Prints one line per layout, path and B, then the packed /
padded ratios per path.

Usage: ``python scripts/lab/step_nodes.py [--batch 1 8 32 128] [--rounds 3] [--tokens 24]
[--layouts ...] [--paths cpu cuda] [--out FILE]`` (JSON lines to ``FILE`` as well).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workbench.bench.gpu_packed import MLX_LM, PACKED, PADDED, engine_makers  # noqa: E402
from workbench.bench.host_time import step_anatomy  # noqa: E402
from workbench.bench.model import make_model  # noqa: E402
from workbench.bench.step_nodes import STEP_CONFIG, cuda_like, step_arrivals, step_nodes  # noqa: E402
from workbench.runtime.loading import load  # noqa: E402

PATHS = ("cpu", "cuda")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--rounds", type=int, default=3, help="timed runs per layout and B (default 3)")
    ap.add_argument("--tokens", type=int, default=24, help="new tokens a row in a timed run (default 24)")
    ap.add_argument("--layouts", nargs="+", default=[PADDED, PACKED, MLX_LM])
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--out", type=Path, help="also write the rows as JSON lines here")
    a = ap.parse_args()
    model, tokenizer = make_model(STEP_CONFIG.shape), load()[1]
    makers = engine_makers(model, tokenizer, STEP_CONFIG)
    rows = []
    for B in a.batch:
        got = {}
        for path in a.paths:
            for name in a.layouts:
                got[path, name] = row = measure(makers[name], tokenizer, B, path, a.rounds, a.tokens)
                row.update(layout=name)
                rows.append(row)
                print(
                    f"B={B:<4} {path:<4} {name:<7} nodes {row['nodes']:>5}  python {row['python_ms']:6.2f} ms "
                    f"(CPU {row['python_cpu_ms']:6.2f})  launch {row['launch_ms']:5.2f} ms  top {row['top']}",
                    flush=True,
                )
            if (path, PACKED) in got and (path, PADDED) in got:
                p, q = got[path, PACKED], got[path, PADDED]
                print(
                    f"B={B:<4} {path:<4} packed / padded: nodes {p['nodes']} / {q['nodes']} = "
                    f"{p['nodes'] / q['nodes']:.3f}x, python CPU {p['python_cpu_ms'] / q['python_cpu_ms']:.2f}x",
                    flush=True,
                )
    if a.out:
        a.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


def measure(make, tokenizer, B: int, path: str, rounds: int, tokens: int) -> dict:
    """One layout's nodes (one run) and host times (the lowest of ``rounds`` runs' medians)
    at ``B`` rows on ``path``."""
    with cuda_like() if path == "cuda" else contextlib.nullcontext():
        engine = make(B)
        nodes = step_nodes(engine, step_arrivals(tokenizer, B, 8))
        engine.close()
        timed = []
        for _ in range(rounds):
            engine = make(B)
            timed.append(step_anatomy(engine, step_arrivals(tokenizer, B, tokens)))
            engine.close()
    return {
        "B": B,
        "path": path,
        "nodes": sum(nodes.values()),
        "top": dict(nodes.most_common(8)),
        **{k: round(min(t[k] for t in timed), 3) for k in ("python_ms", "python_cpu_ms", "launch_ms")},
    }


if __name__ == "__main__":
    main()
