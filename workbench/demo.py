"""The main job, ``workbench demo``: a staggered workload on a model, its metrics, the
solo oracle for every row, and the timeline and event log written to a folder.

Knows: the scheduler's public contract, the oracle, the timeline view. Must not know:
argument parsing (see :mod:`workbench.cli`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from .engine.scheduler import Scheduler
from .runtime import precision
from .runtime.device import device_report
from .runtime.loading import BUNDLED_MODEL, load
from .verify import invariance, oracle
from .views.timeline import render_timeline
from .workloads.workload import demo_workload

TEXT_CHARS = 40


def requests_table(requests: pd.DataFrame) -> str:
    """The per-request table as text: times in milliseconds, completions cut to 40 chars."""
    t = pd.DataFrame(
        {
            "uid": requests.uid,
            "prompt_tok": requests.prompt_tokens,
            "gen_tok": requests.generated_tokens,
            "queue_ms": (requests.queue_s * 1e3).round(1),
            "ttft_ms": (requests.ttft_s * 1e3).round(1),
            "tpot_ms": (requests.tpot_s * 1e3).round(2),
            "finish": requests.finish_reason,
            "completion": [repr(s[:TEXT_CHARS]) for s in requests.text],
        }
    )
    return t.to_string(index=False)


def causes_text(report: oracle.OracleReport) -> str:
    """Rows per cause, e.g. ``12 match, 2 near-tie under reduced precision``."""
    return ", ".join(f"{n} {cause}" for cause, n in report.causes().items())


def run_demo(
    model: str | Path | None = None,
    max_batch: int = 4,
    max_tokens: int | None = None,
    prefill_step_size: int = 2048,
    out_dir: Path = Path("workbench-out"),
    echo: Callable[[str], None] = print,
    dequantize: bool | None = None,
    progress: bool = False,
    batch_invariant: bool = False,
) -> int:
    """Run the demo workload and print its report; returns the exit code.

    Args:
        model: any mlx-lm model path, bundled or fetched name (``"smollm2-135m"``) or
            Hugging Face repo id (default: the bundled one).
        dequantize: load a quantized model's layers as float32
            (:func:`workbench.runtime.loading.load`: ``None``, the default, does so on the
            CPU, where it is faster; ``False`` keeps them quantized).
        progress: a tqdm bar (stderr) over the generated tokens while the workload runs;
            a terminal clears it at the end, elsewhere (a log) its last state stays, ended
            by a newline, so the table does not join the bar's last line.
        batch_invariant: run ``Scheduler(batch_invariant=True)`` and also check every row
            bit for bit against itself alone in the mode
            (:func:`workbench.verify.invariance.bit_check`).
        max_batch: most rows decoding at once.
        max_tokens: cap on every request's ``max_tokens`` (tokens); ``None`` keeps the
            workload's 8..64.
        prefill_step_size: prefill chunk length (tokens).
        out_dir: folder for ``timeline.png``, ``events.csv`` and ``requests.csv``.

    Returns:
        0 when every row matches both oracles (and, ``batch_invariant``, is bit-exact), 1 otherwise.

    Raises:
        OSError: if ``out_dir`` cannot be created (checked before the run).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    model_obj, tokenizer = load(model, dequantize=dequantize) if model else load()
    sched = Scheduler(
        model_obj,
        tokenizer,
        max_batch=max_batch,
        prefill_step_size=prefill_step_size,
        batch_invariant=batch_invariant,
    )
    workload = demo_workload(tokenizer, max_tokens)
    echo(
        f"workbench demo: {len(workload)} requests, max_batch {max_batch}, "
        f"prefill_step_size {prefill_step_size}, model {model or 'bundled ' + BUNDLED_MODEL.name}"
        + (", batch-invariant mode" if batch_invariant else "")
    )
    with tqdm(
        total=sum(r.max_tokens for _, r in workload),
        desc="demo",
        unit="tok",
        disable=not progress,
        leave=not getattr(sys.stderr, "isatty", lambda: False)(),  # a log keeps the bar and its newline
    ) as bar:
        workload = [(step, replace(r, on_token=lambda uid, token: bar.update(1))) for step, r in workload]
        report = sched.run(workload)
    echo(requests_table(report.requests))
    echo(f"summary: {report.summary()}")
    echo(
        f"checking {len(workload)} rows: each alone through mlx-lm, then all through mlx-lm's BatchGenerator ..."
    )
    check = oracle.solo_check(model_obj, sched)
    uids = [r.uid for r in check.rows]
    refs = oracle.batch_reference(
        model_obj,
        [oracle.ref_request(sched.request_of(u)) for u in uids],
        max_batch,
        prefill_step_size,
        sched.config.max_kv_size,
    )
    batch = oracle.compare_traces({u: oracle.scheduler_trace(sched, u) for u in uids}, dict(zip(uids, refs)))
    echo(
        f"oracle: {check.n_match}/{len(check.rows)} rows match solo, "
        f"{batch.n_match}/{len(batch.rows)} match mlx-lm BatchGenerator"
    )
    echo(
        f"  numerics: on {device_report().text()}; {precision.describe()}; measured log-prob noise "
        f"{max(check.noise, batch.noise):.1e} (tolerance {oracle.DEFAULT_ATOL:.0e})"
    )
    if not (check.ok and batch.ok):
        echo(f"  solo: {causes_text(check)}; batch: {causes_text(batch)}")
    for row in check.rows + batch.rows:
        if not row.match or row.tie_accepted:
            echo("  " + row.describe())
    exact = invariance.bit_check(sched) if batch_invariant else None
    if exact is not None:
        echo(exact.text())
    render_timeline(report.events, title="workbench demo").savefig(out_dir / "timeline.png", dpi=110)
    report.events.to_csv(out_dir / "events.csv", index=False)
    report.requests.to_csv(out_dir / "requests.csv", index=False)
    echo(f"wrote {out_dir / 'timeline.png'}, {out_dir / 'events.csv'}, {out_dir / 'requests.csv'}")
    return 0 if check.ok and batch.ok and (exact is None or exact.ok) else 1
