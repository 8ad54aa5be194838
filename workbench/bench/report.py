"""The benchmark's table, its text form, and the files ``workbench bench`` writes.

Knows: a :class:`~workbench.bench.run.BenchResult`, the goals of issue 6, percentiles
(:mod:`workbench.observe.metrics`), the figures (:mod:`workbench.bench.figures`), the stored
files (:mod:`workbench.bench.files`). Must not know:
engines or MLX; everything here is arithmetic on the measured frames.

The table has one row per entry of :func:`row_ids` and columns ``TABLE_COLUMNS``:
``measured`` is the number the row is about, ``reference`` what it is compared with
(``reference_is`` says what), ``value`` their comparison (``value_is``), ``spread`` the
range of that comparison over repeats (text, empty when there is one measurement),
``goal`` a bound on ``value`` (empty when the row has none), ``met`` ``yes`` / ``no`` /
empty. Ratios of alternating runs are medians of per-pair ratios (each pair ran back to
back).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pandas as pd

from ..observe.metrics import percentiles
from .files import CSV_FILES, read_frame, read_meta
from .pacing import paced_name
from .realmodel import REAL_MODEL
from .run import DEFAULT_TARGET, BenchResult
from .scenarios import MLX_LM, PACED, PREFILL_FIRST, WORKBENCH, WORKBENCH_OFF, head_of_line_numbers
from .session import window_medians

TABLE_COLUMNS = [
    "row",
    "metric",
    "unit",
    "measured",
    "reference",
    "reference_is",
    "value",
    "value_is",
    "spread",
    "goal",
    "met",
]
GOALS = {
    "decode": (">=", 1.10),
    "overhead": ("<=", 1.03),
    "join_slot": ("<=", 1.0),
    "join_extend": ("<=", 1.0),
    "hol_workbench": ("<=", 1.5),
    "session_late": ("<=", 1.10),
    "paced_decode": (">=", 0.97),
    "paced_ttft_p95": ("<=", 0.6),
    "paced_itl_p95": ("<=", 1.0),
}
# Per goal: what it asks (on the row's value), and what a miss means (the text `workbench bench` prints).
GOAL_MEANINGS = {
    "decode": (
        "the workbench decodes at least 10% more tok/s than mlx-lm's BatchGenerator at this batch size",
        "the workbench is not faster than mlx-lm here: its per-step Python (events, snapshots, per-row "
        "bookkeeping) costs more than its pipelining saves; on a loaded machine re-run before concluding",
    ),
    "overhead": (
        "recording (events and a snapshot after every call) slows decoding by at most 3%",
        "instrumentation costs more than 3% of decode time: use history_size=0 for timing runs",
    ),
    "join_slot": (
        "a row joining into a free slot costs at most one decode step",
        "joining stalls the running rows for more than a step each time a request arrives",
    ),
    "join_extend": (
        "a row joining by extend (mlx-lm's BatchKVCache.extend) costs at most one decode step",
        "growing the batch copies more than a step's worth of KV: running rows stall at every join",
    ),
    "hol_workbench": (
        "while a long prompt joins, running rows' largest token gap is at most 1.5 x (one prefill "
        "chunk + one decode step)",
        "chunked prefill does not bound head-of-line blocking: running rows wait longer than a chunk",
    ),
    "session_late": (
        "an engine call late in a long session costs at most 10% more than early on",
        "some per-call cost grows with the session (event log, request map, history)",
    ),
    "paced_decode": (
        "with pacing on, decode throughput stays within 3% of mlx-lm's",
        "the pacer's own work (waiting for the pending step, timing the forwards) costs decode speed",
    ),
    "paced_ttft_p95": (
        "with pacing on, TTFT p95 is at most 0.6 x mlx-lm's on the same arrivals",
        "joiners do not reach their first token much sooner than with mlx-lm: with light load TTFT is "
        "mostly the prompt's own prefill compute, which no schedule shortens",
    ),
    "paced_itl_p95": (
        "with pacing on, ITL p95 is at most mlx-lm's, at the same time as the TTFT goal",
        "running rows wait longer between tokens than with mlx-lm: prefill chunks inflate more gaps "
        "than they shorten",
    ),
}
# Goals set for a GPU: on a CPU they are shown apart, with why this machine does not reach them.
GPU_GOALS = {
    "decode": "its margin comes from overlapping the engine's Python with the device's forward (mx.async_eval); "
    "on a CPU both run on the same cores",
    "paced_ttft_p95": "at staggered arrivals each prompt's own prefill, alone, is above 0.6 x mlx-lm's TTFT p95 "
    "on this CPU (the floors, docs/pacing.md): no schedule reaches it",
}
NOTES_MARKER = (
    "<!-- Everything below this line is hand-written and kept when `workbench bench` rewrites the file. -->"
)


def row_ids(batch_sizes: tuple[int, ...], real_batch_sizes: tuple[int, ...] = ()) -> list[str]:
    """Every row of the table, in order (the smoke test and the notebook check these);
    ``real_batch_sizes``: those of the real model's decode runs (none when it was skipped)."""
    return (
        [f"decode_B{b}" for b in batch_sizes]
        + [f"overhead_B{b}" for b in batch_sizes]
        + [f"paced_decode_B{b}" for b in batch_sizes]
        + [
            "ttft_p50",
            "ttft_p95",
            "itl_p50",
            "itl_p95",
            "paced_ttft_p95",
            "paced_itl_p95",
            "paced_itl_max",
            "paced_ttft_p95_loaded",
            "paced_itl_p95_loaded",
            "join_slot",
            "join_extend",
            "join_extend_fresh",
            "join_remerge",
            "hol_workbench",
            "hol_mlx_lm",
            "hol_prefill_first",
            "checkpoint_take",
            "checkpoint_next_step",
            "checkpoint_held",
            "session_late",
        ]
        + [f"roofline_B{b}" for b in batch_sizes]
        + [f"real_decode_B{b}" for b in real_batch_sizes]
    )


def goal_kind(row: str) -> str | None:
    """The :data:`GOALS` key of ``row`` (the row itself, or its prefix before ``_B<n>`` /
    ``_loaded``), or ``None``."""
    return next((k for k in GOALS if row == k or row.startswith(k + "_B") or row == k + "_loaded"), None)


def gpu_goal(row: str) -> str | None:
    """Why ``row``'s goal is a GPU goal (:data:`GPU_GOALS`: the ``decode_B<n>`` rows and the
    staggered ``paced_ttft_p95``, not its loaded variant), or ``None``."""
    kind = goal_kind(row)
    return GPU_GOALS.get(kind) if kind is not None and (kind != "paced_ttft_p95" or row == kind) else None


def goal_text(row: str) -> str:
    """The goal on ``value`` for ``row`` as text (``">= 1.10"``), or ``""``."""
    kind = goal_kind(row)
    if kind is None:
        return ""
    op, bound = GOALS[kind]
    return f"{op} {bound:.2f}"


def _met(value: float, goal: str) -> str:
    if not goal:
        return ""
    op, bound = goal.split()
    ok = value >= float(bound) if op == ">=" else value <= float(bound)
    return "yes" if ok else "no"


def _pair_ratios(runs: pd.DataFrame, B: int, top: str, bottom: str) -> pd.Series:
    """Per pair, ``top``'s tok/s / ``bottom``'s tok/s at batch size ``B``."""
    r = runs[runs.B == B].pivot_table(index="pair", columns="engine", values="tok_per_s")
    return r[top] / r[bottom]


def _spread(values: pd.Series) -> str:
    return f"{values.min():.3f}..{values.max():.3f}" if len(values) > 1 else ""


def _adder(rows: list[list[Any]]) -> Callable[..., None]:
    """``add(row, metric, unit, measured, reference, reference_is, value, value_is,
    spread="")``: appends one table row to ``rows``, its goal and ``met`` from the row id."""

    def add(
        row: str,
        metric: str,
        unit: str,
        measured: float,
        reference: float,
        reference_is: str,
        value: float,
        value_is: str,
        spread: str = "",
    ) -> None:
        goal = goal_text(row)
        rows.append(
            [
                row,
                metric,
                unit,
                measured,
                reference,
                reference_is,
                value,
                value_is,
                spread,
                goal,
                _met(value, goal),
            ]
        )

    return add


def build_table(result: BenchResult) -> pd.DataFrame:
    """The table of ``result`` (see the module docstring); the real model's rows last
    (:func:`real_table`)."""
    cfg, runs = result.config, result.runs
    rows: list[list[Any]] = []
    add = _adder(rows)

    for pair_rows in (DECODE_ROWS, OVERHEAD_ROWS, PACED_DECODE_ROWS):
        _pair_rows(add, runs, cfg.decode.batch_sizes, pair_rows)
    for name, frame, col in (("ttft", result.requests, "ttft_s"), ("itl", result.gaps, "gap_s")):
        ours = percentiles(frame[frame.engine == WORKBENCH][col])
        theirs = percentiles(frame[frame.engine == MLX_LM][col])
        for q in ("p50", "p95"):
            add(
                f"{name}_{q}",
                f"{name.upper()} {q}, staggered arrivals",
                "s",
                ours[q],
                theirs[q],
                "mlx-lm",
                ours[q] / theirs[q],
                "workbench / mlx-lm (lower is better)",
            )
    _paced_rows(add, result.requests, result.gaps, "", "staggered arrivals", with_max=True)
    _paced_rows(
        add,
        result.loaded_requests,
        result.loaded_gaps,
        "_loaded",
        f"loaded (one arrival every {cfg.latency.loaded_arrival_steps:g} steps)",
    )
    sec = result.join.groupby("method").seconds
    step_s = sec.median()["step"]
    where = f"1 row into B={cfg.join.rows} x {cfg.join.context_tokens} tokens"
    for row, method, how in (
        ("join_slot", "free slot", "into a free slot"),
        ("join_extend", "extend", "by extend"),
        ("join_extend_fresh", "extend, fresh pages", "by extend into fresh pages"),
        ("join_remerge", "re-merge", "by re-merge"),
    ):
        ratios = result.join[result.join.method == method].seconds / step_s
        add(
            row,
            f"join {how}, {where}",
            "s",
            sec.median()[method],
            step_s,
            "one decode step",
            ratios.median(),
            "join / step",
            _spread(ratios),
        )
    ref = head_of_line_numbers(result.hol, WORKBENCH)
    for row, engine in (
        ("hol_workbench", WORKBENCH),
        ("hol_mlx_lm", MLX_LM),
        ("hol_prefill_first", PREFILL_FIRST),
    ):
        n = head_of_line_numbers(result.hol, engine)
        bound = ref["chunk_s"] + n["step_s"]
        add(
            row,
            f"head-of-line, {engine}: {cfg.hol.prompt_tokens}-token join, chunk {cfg.hol.chunk_tokens}",
            "s",
            n["max_gap_s"],
            bound,
            "one chunk + one step",
            n["max_gap_s"] / bound,
            "max gap / (chunk + step)",
        )
    cp = result.checkpoint.set_index("measure").value
    where = f"B={cfg.join.rows} x {cfg.join.context_tokens} tokens"
    add(
        "checkpoint_take",
        f"checkpoint, taking it, {where}",
        "s",
        cp["clone_s"],
        cp["step_s"],
        "one decode step",
        cp["clone_s"] / cp["step_s"],
        "checkpoint / step",
    )
    add(
        "checkpoint_next_step",
        f"checkpoint, the step after it (copies the KV once), {where}",
        "s",
        cp["first_step_after_s"],
        cp["step_s"],
        "one decode step",
        cp["first_step_after_s"] / cp["step_s"],
        "step after / step",
    )
    add(
        "checkpoint_held",
        f"checkpoint, bytes it keeps alive once the batch moved on, {where}",
        "bytes",
        cp["held_bytes"],
        cp["kv_bytes"],
        "the batch's KV bytes",
        cp["held_bytes"] / cp["kv_bytes"],
        "held / KV bytes",
    )
    first, last = window_medians(result.session)
    n = int(result.session.step.max())
    add(
        "session_late",
        f"run(max_steps=1), steps {n - 199:,}-{n:,} against steps 1-200",
        "s",
        last,
        first,
        "steps 1-200",
        last / first,
        "late / early",
    )
    for _, r in result.roofline[result.roofline.case.str.startswith("decode")].iterrows():
        add(
            f"roofline_B{r.B}",
            f"roofline, decode B={r.B}",
            "tok/s",
            r.workbench_tok_per_s,
            r.attainable_tok_per_s,
            "attainable: min(memory, compute bound)",
            r.workbench_tok_per_s / r.attainable_tok_per_s,
            "workbench / attainable",
        )
    table, real = pd.DataFrame(rows, columns=TABLE_COLUMNS), real_table(result.real_runs)
    return pd.concat([table, real], ignore_index=True) if len(real) else table


@dataclass(frozen=True)
class PairRows:
    """One table row per batch size ``B`` (``{row}_B{B}``, metric ``{metric}, B={B}{where}``):
    ``measured``'s median tok/s against ``reference``'s (engine names); value the median of
    per-pair ratios ``measured / reference``, or ``reference / measured`` (a time ratio) when
    ``inverse``; spread their range."""

    row: str
    metric: str
    measured: str
    reference: str
    reference_is: str
    value_is: str
    where: str = ""
    inverse: bool = False


DECODE_ROWS = PairRows(
    "decode", "decode tok/s", WORKBENCH, MLX_LM, "mlx-lm", "median of pairs: workbench / mlx-lm"
)
OVERHEAD_ROWS = PairRows(
    "overhead",
    "instrumentation overhead",
    WORKBENCH,
    WORKBENCH_OFF,
    "workbench, history_size=0",
    "median of pairs: time instrumented / time off",
    inverse=True,
)
PACED_DECODE_ROWS = PairRows(
    "paced_decode", "decode tok/s", PACED, MLX_LM, "mlx-lm", "median of pairs: paced / mlx-lm", ", pacing on"
)


def _pair_rows(
    add: Callable[..., None], runs: pd.DataFrame, batch_sizes: Sequence[int], rows: PairRows
) -> None:
    """Add ``rows``' table rows (:class:`PairRows`) for ``batch_sizes`` from ``runs`` (tok/s per run)."""
    med = runs.groupby(["engine", "B"]).tok_per_s.median()
    for B in batch_sizes:
        top, bottom = (rows.reference, rows.measured) if rows.inverse else (rows.measured, rows.reference)
        r = _pair_ratios(runs, B, top, bottom)
        add(
            f"{rows.row}_B{B}",
            f"{rows.metric}, B={B}{rows.where}",
            "tok/s",
            med[(rows.measured, B)],
            med[(rows.reference, B)],
            rows.reference_is,
            r.median(),
            rows.value_is,
            _spread(r),
        )


def real_table(real_runs: pd.DataFrame, model: str = REAL_MODEL) -> pd.DataFrame:
    """The real model's decode rows (``real_decode_B<n>``, one per batch size in
    ``real_runs``, columns ``TABLE_COLUMNS``, no goal), built as the ``decode_B<n>`` rows are;
    no rows when ``real_runs`` is empty (the model was not fetched).

    Args:
        real_runs: :func:`workbench.bench.realmodel.real_decode_runs`' frame (tok/s per run).
        model: the name written into each row's metric.
    """
    rows: list[list[Any]] = []
    if len(real_runs):
        real = replace(DECODE_ROWS, row="real_decode", where=f", {model} (4-bit)")
        _pair_rows(_adder(rows), real_runs, sorted(int(b) for b in set(real_runs.B)), real)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def _paced_rows(
    add: Callable[..., None],
    requests: pd.DataFrame,
    gaps: pd.DataFrame,
    suffix: str,
    where: str,
    with_max: bool = False,
) -> None:
    """TTFT p95 and ITL p95 (and ITL max) of the default paced engine against mlx-lm."""
    name = paced_name(DEFAULT_TARGET)
    measures = [("ttft_p95", requests, "ttft_s", 0.95), ("itl_p95", gaps, "gap_s", 0.95)]
    if with_max:
        measures.append(("itl_max", gaps, "gap_s", 1.0))
    for row, frame, col, q in measures:
        ours, theirs = (
            frame[frame.engine == name][col].quantile(q),
            frame[frame.engine == MLX_LM][col].quantile(q),
        )
        add(
            f"paced_{row}{suffix}",
            f"{row.split('_')[0].upper()} {row.split('_')[1]}, {where}, pacing on",
            "s",
            ours,
            theirs,
            "mlx-lm",
            ours / theirs,
            "paced / mlx-lm (lower is better)",
        )


def _fmt(x: float, unit: str) -> str:
    return f"{x * 1e3:.1f} ms" if unit == "s" else f"{x:.1f} {unit}"


def table_text(table: pd.DataFrame) -> str:
    """Fixed-width text of the table: metric, measured, reference, value and what it is
    (``value_is``: a ratio of the two columns, or "median of pairs: ..." where it is the
    median of per-pair ratios, which need not equal measured / reference), spread, goal, met."""
    width = max(len(m) for m in table.metric)
    is_width = max(len(v) for v in table.value_is)
    lines = [
        f"{'metric':<{width}}  {'measured':>13}  {'reference':>13}  {'value':>7}  {'value is':<{is_width}}  "
        f"{'spread':>12}  {'goal':>7}  met"
    ]
    for _, r in table.iterrows():
        lines.append(
            f"{r.metric:<{width}}  {_fmt(r.measured, r.unit):>13}  {_fmt(r.reference, r.unit):>13}  "
            f"{r.value:7.3f}  {r.value_is:<{is_width}}  {r.spread:>12}  {r.goal:>7}  {r.met}"
        )
    return "\n".join(lines)


def goals_text(table: pd.DataFrame, device: str = "cpu") -> str:
    """Per row with a goal: met or missed, the goal in words (``GOAL_MEANINGS``) and, for a
    miss, what it means. On a CPU (``device``), the GPU goals (:func:`gpu_goal`) come after
    the others, apart, each with why this machine does not reach it. Text lines, for
    ``workbench bench``'s printed output."""

    def line(r: Any) -> str:
        goal, miss = GOAL_MEANINGS[goal_kind(r.row)]
        return (
            f"- {r.metric}: {'met' if r.met == 'yes' else 'MISSED'} ({r.value_is} = {r.value:.3f}, "
            f"goal {r.goal}): goal: {goal}" + ("" if r.met == "yes" else f"; a miss means: {miss}")
        )

    with_goal = table[table.goal != ""]
    on_gpu = [gpu_goal(row) is not None and device == "cpu" for row in with_goal.row]
    here, gpu = with_goal[[not g for g in on_gpu]], with_goal[on_gpu]
    lines = [
        f"goals this machine can reach: {(here.met == 'yes').sum()} of {len(here)} met "
        "(value is the row's value column; met: yes / no):",
        *map(line, here.itertuples()),
    ]
    if len(gpu):
        lines.append(
            f"goals set for a GPU (out of reach on this CPU; {(gpu.met == 'yes').sum()} of {len(gpu)} met):"
        )
        lines += [f"{line(r)}; why not here: {gpu_goal(r.row)}" for r in gpu.itertuples()]
    return "\n".join(lines)


def table_markdown(table: pd.DataFrame) -> str:
    """The table as a Markdown table (measured, reference and what it is, value, goal)."""
    lines = [
        "| metric | measured | reference | value | spread | goal | met |",
        "| --- | ---: | ---: | ---: | ---: | :---: | :---: |",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {r.metric} | {_fmt(r.measured, r.unit)} | {_fmt(r.reference, r.unit)} ({r.reference_is}) "
            f"| {r.value:.3f} ({r.value_is}) | {r.spread} | {r.goal} | {r.met} |"
        )
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    """CPU model (``lscpu``), cores (``nproc``), memory, Python, mlx / mlx-lm versions, BLAS."""
    from ..runtime.blas import STATUS
    from ..runtime.memory import STATUS as CACHE

    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        cpu = next(
            (ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), ""
        )
    except OSError:
        cpu = platform.processor()
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu or platform.machine(),
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gb, 1),
        "system": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "mlx": version("mlx"),
        "mlx_lm": version("mlx-lm"),
        "blas": STATUS.library or "MLX's bundled",
        "blas_note": STATUS.note,
        "mlx_cache": CACHE.note,
    }


FIGURES = {
    "throughput.png": "decode tok/s per engine and batch size, with the roofline bound",
    "latency.png": "TTFT and ITL distributions, staggered arrivals",
    "frontier.png": "TTFT p95 against ITL p95: mlx-lm, the workbench as shipped, and paced at each target",
    "join.png": "join into a free slot, by extend and by re-merge, against one decode step",
    "head_of_line.png": "running rows' tokens while a long prompt joins",
}


def meta_of(result: BenchResult) -> dict[str, Any]:
    """``result.meta`` plus the machine, the date and the decode runs' token agreement."""
    same, real_same = result.runs.same_tokens.dropna(), result.real_runs.same_tokens.dropna()
    return {
        **machine_info(),
        **result.meta,
        "date": datetime.date.today().isoformat(),
        "same_tokens_runs": f"{int(same.sum())}/{len(same)}",
        "real_same_tokens_runs": f"{int(real_same.sum())}/{len(real_same)}",
    }


def _outcomes(table: pd.DataFrame) -> list[str]:
    out = []
    for _, r in table[table.goal != ""].iterrows():
        verdict = "**met**" if r.met == "yes" else "**missed**"
        out.append(f"- {r.metric}: {verdict}, {r.value_is} = {r.value:.3f} (goal {r.goal})")
    return out


def _history_read_text(runs: pd.DataFrame) -> str:
    """How long converting the recorded snapshots took, per snapshot, from ``runs``."""
    timed = runs[runs.snapshots > 0] if "snapshots" in runs else runs.iloc[0:0]
    if timed.empty:
        return "no snapshots were recorded"
    per = (timed.history_read_s / timed.snapshots).median()
    return (
        f"{per * 1e3:.2f} ms per snapshot (median over {len(timed)} runs of {int(timed.snapshots.median())} "
        "snapshots)"
    )


def real_model_line(cfg: Any, meta: dict[str, Any]) -> str:
    """The Markdown bullet on the second shape: the real model and its decode runs'
    sizes, or why they were skipped (``meta["real_model_skipped"]``)."""
    if "real_model_skipped" in meta:
        return f"- second shape, the real model: **skipped**: {meta['real_model_skipped']}"
    return (
        f"- second shape, the real model: {meta['real_model']}; {int(meta['real_parameters']) / 1e6:.1f}M "
        f"parameters, the converted weights of `workbench models fetch {REAL_MODEL}`; decode "
        f"runs (the `real_decode` rows, no goal of their own) of the workbench and mlx-lm only at B = "
        f"{', '.join(map(str, cfg.real.batch_sizes))}: prompts of {cfg.real.prompt_tokens} tokens (its own "
        f"tokenizer), max_tokens {cfg.real.max_tokens}, measured runs per engine: {cfg.real.pairs}, after a "
        f"warm-up, alternating; mlx-lm's tokens equal the workbench's in {meta['real_same_tokens_runs']} runs"
    )


def markdown(result: BenchResult, table: pd.DataFrame, meta: dict[str, Any], notes: str) -> str:
    """``docs/benchmarks.md``: machine, load, BLAS, versions, model, the table, each
    goal's outcome, the definitions, the figures, then the kept hand-written ``notes``."""
    cfg = result.config
    gb = lambda x: f"{x / 1e9:.1f} GB/s"  # noqa: E731
    lines = [
        "# Benchmarks: the workbench against mlx-lm's BatchGenerator",
        "",
        f"Written by `workbench bench` ({meta['mode']} mode, {meta['date']}, {meta['wall_s'] / 60:.1f} min); "
        "`workbench bench --quick` is the CI smoke run. The numbers below are from one run on a shared machine: "
        "read the ratios, which come from alternating runs, more than the absolute rates.",
        "",
        "## Machine",
        "",
        f"- CPU: {meta['cpu']}, {meta['cores']} cores (`nproc`), {meta['memory_gib']} GiB; {meta['system']}",
        f"- load average (1 min) during the run: {meta['load_1min_min']:.2f} to {meta['load_1min_max']:.2f} "
        f"(at each section: {meta['load_1min_samples']}) on {meta['cores']} cores: other jobs shared the CPU",
        f"- BLAS: {meta['blas']} ({meta['blas_note']}); measured float32 matmul "
        f"{meta['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s",
        f"- MLX buffer cache: {meta.get('mlx_cache', 'not recorded')} (`workbench/runtime/memory.py`)",
        f"- memory bandwidth: {gb(meta['copy_bandwidth_bytes_per_s'])} (numpy copy, read + write); "
        f"an MLX copy reaches {gb(meta['mlx_copy_bytes_per_s'])}",
        f"- Python {meta['python']}, mlx {meta['mlx']}, mlx-lm {meta['mlx_lm']}, device {meta['device']}",
        "",
        "## Model",
        "",
        f"- {meta['model']}; {meta['parameters'] / 1e6:.1f}M parameters, {meta['dtype']} (random weights, seed 0, "
        "built in memory: speed depends on shapes only; float32 because float16 and bfloat16 decode steps "
        "measured 3-8x slower than float32 at B = 8 and 32 on this CPU: MLX's half-precision CPU matmuls do not "
        "reach the float32 BLAS)",
        f"- decode runs: B equal requests, prompts of {cfg.decode.prompt_tokens} tokens, "
        f"max_tokens {cfg.decode.max_tokens}, greedy, no stop ids, prefill_step_size {cfg.prefill_step_size}, "
        f"{cfg.decode.pairs} measured runs per engine "
        f"after a warm-up, alternating (A B C, C B A, ...); mlx-lm's tokens and those of the workbench with "
        f"recording off equal the workbench's of the same round in {meta['same_tokens_runs']} runs",
        f"- latency: {cfg.latency.requests} requests, prompts {min(result.requests.prompt_tokens)}-"
        f"{max(result.requests.prompt_tokens)} tokens, "
        f"one arrival every {meta['latency_arrival_interval_s'] * 1e3:.0f} ms "
        f"({cfg.latency.arrival_steps:g} decode steps at B={cfg.latency.max_batch}), "
        f"max_batch {cfg.latency.max_batch}, "
        f"{cfg.latency.rounds} round(s) per engine; the workbench also paced (`pacing=Pacing(itl_target_steps=t)`, "
        f"shortest prompt first with a {cfg.pacing.max_wait_steps:g}-step age bound) at t = "
        f"{', '.join(f'{t:g}' for t in cfg.pacing.targets)}; the loaded variant: one arrival every "
        f"{cfg.latency.loaded_arrival_steps:g} steps, paced at the default t = {DEFAULT_TARGET:g}",
        real_model_line(cfg, meta),
        "",
        "## Results",
        "",
        table_markdown(table),
        "",
        "## Goals",
        "",
        *_outcomes(table),
        "",
        "## Definitions",
        "",
        "- **decode tok/s**: tokens of the engine iterations after the first one that produced tokens, over the "
        "time from that iteration's return to the last one's; the same driver stamps both engines (one iteration: "
        "the workbench's `admit(); step(); filter()`, one mlx-lm `next_generated()`). The workbench runs as "
        "shipped: events and a snapshot after every call (`history_size=64`).",
        "- **instrumentation overhead**: the same runs with `history_size=0` (no snapshots; events are always "
        "logged); value = decode time instrumented / time off. The engine captures a snapshot after every call "
        "without waiting for the forward it launched and converts it to numpy when it is first read; the "
        "benchmark reads them all after each run, outside the timed window: "
        f"{_history_read_text(result.runs)}.",
        "- **TTFT / ITL**: from each engine's event log (the workbench's own; for mlx-lm the benchmark records "
        "submit and token events stamped when `next_generated()` returns): first token - submit, and the gaps "
        "between consecutive tokens of a request.",
        "- **pacing**: `Scheduler(pacing=...)` plans each iteration against a time budget: the predicted decode step "
        "plus as much prefill (and joins) as fits under the target gap (t x the predicted step), with the chunk length "
        "chosen per iteration from a cost model learned from the engine's own forwards (`engine/levers/pacing.py`); "
        f"`pacing=True` is t = {DEFAULT_TARGET:g}. Tokens are unchanged. "
        "E2E p95 and goodput are in `frontier.png`'s data "
        "(`workbench.bench.pacing.frontier_summary`).",
        "- **join cost**: one row joins rows of 1k-token context (random K/V, after a few decode steps); free slot = "
        "`cache_internals.fill_slots` into the cache row of an evicted request (the engine's join whenever a row was "
        "evicted since the last step), extend = `caches.join` (mlx-lm's `BatchKVCache.extend`, the engine's join "
        "otherwise and mlx-lm's always; into fresh pages = the same right after `mx.clear_cache()`, so its new "
        "buffers page-fault, as when a batch grows to a size whose buffers MLX has not cached), "
        "re-merge = `extract` every row and `merge`; each over the median "
        "time of one bare `[B, 1]` forward at that context.",
        "- **head-of-line**: running rows decode while a long prompt joins (the same chunk size for both engines). "
        "Max gap = the largest gap between two tokens of a running row overlapping the joiner's submit .. first "
        "token; one chunk = the longest of the workbench's prefill chunks (its `prefill` event minus the event "
        "before it); one step = the median gap of running rows before the joiner arrived.",
        "- **checkpoint**: `Scheduler.checkpoint()` copies no tensor: MLX arrays are immutable, so it holds new "
        "handles on the batch's cache buffers (`cache_internals.clone_caches`; its other part is Python lists of "
        "the live request states). Measured on the join scenario's batch (random K/V): taking it; the next decode "
        "step, which cannot update the shared buffers in place and copies each layer's keys and values once (the "
        "step after that writes in place again); and the MLX memory the checkpoint keeps alive once the live batch "
        "has moved on (its buffers; freed when the checkpoint is dropped). Engine calls also take a savepoint "
        "before each call (for interrupt safety) that shares append-only KV buffers without blocking in-place "
        "writes; its cost is inside every decode measurement above.",
        "- **long session**: the bundled model serves a steady stream (4 rows busy, 2 queued) through "
        "`run(max_steps=1)`, the call a notebook or the Panel makes, for "
        f"{int(result.session.step.max()):,} steps; value = median seconds per call over the last 200 steps / over "
        "the first 200 (the event log, request map and history grow all session).",
        "- **roofline**: bytes per step = weights read by a step (the untied input embedding excluded) + B x "
        "context x KV bytes per token; memory bound = B x bandwidth / bytes; compute bound = B x matmul flop/s / "
        "(2 x weight parameters + attention flops per row); attainable = the smaller.",
        "",
        "## Figures",
        "",
        *[f"![{desc}](benchmarks/{name})" for name, desc in FIGURES.items()],
        "",
        "Data: " + ", ".join(f"`benchmarks/{name}` ({desc})" for name, desc in CSV_FILES.items()) + ".",
        "",
        NOTES_MARKER,
        "",
        notes.strip(),
        "",
    ]
    return "\n".join(lines)


def write_figures(data: Path) -> None:
    """Draw ``FIGURES`` into ``data`` from the CSV files there (so a figure can be redrawn
    from a stored run without running it again)."""
    from .figures import render_frontier, render_head_of_line, render_join, render_throughput, render_ttft_itl

    read = lambda name: read_frame(name, data)  # noqa: E731
    meta = read_meta(data)
    figures = {
        "throughput.png": render_throughput(read("runs.csv"), read("roofline.csv")),
        "latency.png": render_ttft_itl(read("requests.csv"), read("gaps.csv")),
        "frontier.png": render_frontier(
            {
                "staggered arrivals": (read("requests.csv"), read("gaps.csv")),
                "loaded arrivals": (read("loaded_requests.csv"), read("loaded_gaps.csv")),
            }
        ),
        "join.png": render_join(read("join.csv"), int(meta["join_rows"]), int(meta["join_context_tokens"])),
        "head_of_line.png": render_head_of_line(read("head_of_line.csv")),
    }
    for name, fig in figures.items():
        fig.savefig(data / name, dpi=110)


def write_outputs(result: BenchResult, out_dir: Path) -> pd.DataFrame:
    """Write ``out_dir/benchmarks/*.csv``, ``*.png`` and ``out_dir/benchmarks.md`` (keeping
    the hand-written notes below :data:`NOTES_MARKER` of an existing file). Returns the table."""
    data = Path(out_dir) / "benchmarks"
    data.mkdir(parents=True, exist_ok=True)
    table = build_table(result)
    meta = meta_of(result)
    frames = {
        "table.csv": table,
        "runs.csv": result.runs,
        "requests.csv": result.requests,
        "gaps.csv": result.gaps,
        "loaded_requests.csv": result.loaded_requests,
        "loaded_gaps.csv": result.loaded_gaps,
        "join.csv": result.join,
        "head_of_line.csv": result.hol,
        "roofline.csv": result.roofline,
        "checkpoint.csv": result.checkpoint,
        "session.csv": result.session,
        "real_runs.csv": result.real_runs,
        "meta.csv": pd.DataFrame(
            {
                "key": list(meta),
                "value": [json.dumps(v) if not isinstance(v, str) else v for v in meta.values()],
            }
        ),
    }
    for name, frame in frames.items():
        frame.to_csv(data / name, index=False)
    write_figures(data)
    md = Path(out_dir) / "benchmarks.md"
    old = md.read_text() if md.exists() else ""
    notes = old.split(NOTES_MARKER, 1)[1] if NOTES_MARKER in old else ""
    md.write_text(markdown(result, table, meta, notes))
    return table


def bench_job(
    quick: bool = False,
    out_dir: Path | None = None,
    echo=print,
    progress: bool = True,
    real_model: bool = True,
) -> int:
    """The job behind ``workbench bench``: run the full (or ``quick``) benchmark, write its
    files under ``out_dir`` (default ``workbench-out``: a user's run never rewrites the
    documented numbers; ``docs`` for maintainers), print the table; ``real_model=False``
    skips the real-model rows. Returns the exit code (0)."""
    from .run import FULL_CONFIG, QUICK_CONFIG, run_bench

    out = Path(out_dir) if out_dir is not None else Path("workbench-out")
    (out / "benchmarks").mkdir(parents=True, exist_ok=True)  # fail before a long run, not after
    result = run_bench(QUICK_CONFIG if quick else FULL_CONFIG, echo, progress, real_model)
    table = write_outputs(result, out)
    echo(table_text(table))
    echo(goals_text(table, "gpu" if result.meta["device"].lower().startswith("device(gpu") else "cpu"))
    if result.meta["load_1min_max"] > (os.cpu_count() or 1):
        echo(
            f"note: other jobs loaded the machine (load average up to {result.meta['load_1min_max']:.2f} on "
            f"{os.cpu_count()} cores), so timing goals may be missed by noise; re-run on a quiet machine"
        )
    if "real_model_skipped" in result.meta:
        echo(f"real-model rows: skipped: {result.meta['real_model_skipped']}")
    echo(
        f"load average (1 min) during the run: {result.meta['load_1min_min']:.2f} to "
        f"{result.meta['load_1min_max']:.2f}; {result.meta['wall_s']:.0f} s"
    )
    echo(f"wrote {out / 'benchmarks.md'} and {out / 'benchmarks'}/ ({', '.join([*CSV_FILES, *FIGURES])})")
    return 0
