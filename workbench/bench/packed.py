"""The packed layout's benchmark (``workbench bench --packed``): the packed layout against
the padded one and mlx-lm's ``BatchGenerator`` on this machine, and Sarathi-Serve's
schedule comparison on the Azure window.

Knows: the engines behind :mod:`workbench.bench.engines`, the scenarios' arrivals and
alternation (:mod:`workbench.bench.scenarios`), the Azure trace
(:mod:`workbench.workloads.traces`), event-log metrics. Must not know: the engine's
internals beyond the scheduler's books (``batch``, ``ledger``) read after each iteration.

Sections (one model, the bundled tiny-llama; ``max_batch`` 8; the padded layout's prefill
chunk and the packed layout's token budget both ``CHUNK_TOKENS``; pages of 16):

- **decode**: ``B`` equal requests, alternating runs, decode tok/s over the window after
  the first token (:func:`workbench.bench.scenarios.decode_runs`);
- **staggered**, **loaded**: the latency workload (:func:`staggered_arrivals`) one arrival
  every 8 (3) decode steps at B = 8; TTFT p95, ITL p95 (``metrics.token_gaps``), through the
  padded layout, the packed one, the packed one paced (:data:`PACKED_PACED`), mlx-lm as shipped
  and mlx-lm with at most ``MAX_BATCH`` requests in flight (:data:`MLX_LM_EQUAL`, equal
  capacity: the goals' reference), with the floors measured in the run and where each
  workbench run's time went (:mod:`workbench.bench.latency_goals`);
- **azure**: the conv trace 10:00 + 12 s (time x 0.3, lengths x 0.25, prompts <= 512,
  outputs <= 128: 59 requests), the same numbers, plus per workbench run the peak KV
  bytes the caches held (padded: the arrays' ``nbytes``, prefilling group included;
  packed: pages held x page bytes, and the pools' allocation) against the peak bytes of
  the tokens they held, sampled after every iteration;
- **sarathi**: the azure window through the packed layout under its three schedules
  (``hybrid``: stall-free, ``prefill-first``, ``decode-first``;
  :mod:`workbench.engine.packed.plan`), TTFT and ITL p50 / p95 / p99 and throughput.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..engine.levers.pacing import Pacing
from ..engine.state import Status
from ..observe.events import events_frame
from ..observe.metrics import request_metrics, token_gaps
from ..runtime.loading import load
from ..workloads.traces import conv_window
from .decode_profile import decode_goal_lines, decode_profiles
from .engines import Arrival, MlxLmEngine, WorkbenchEngine, drive
from .latency_goals import Span, goal_verdicts, run_parts, ttft_floors
from .scenarios import MLX_LM, WORKBENCH, alternating, decode_runs, equal_prompts, staggered_arrivals

PADDED, PACKED = WORKBENCH, "workbench, packed"
PACKED_PACED = "workbench, packed, paced"
CHUNK_TOKENS, PAGE_TOKENS, MAX_BATCH = 512, 16, 8
# mlx-lm at the workbench's capacity, the latency goals' reference: at most MAX_BATCH requests
# prefilling or decoding (vLLM's benchmarks compare engines at equal max_num_seqs); MLX_LM is
# mlx-lm as shipped, whose generation batch can pass completion_batch_size (docs/packed.md,
# "Latency goals", point 5)
MLX_LM_EQUAL = f"mlx-lm, <= {MAX_BATCH} in flight"
# the paced packed engine's time budget, in decode-only forwards (Pacing's default): mlx-lm's
# ITL p95 is one of its prefill stalls, several decode steps long, and a packed forward with
# prefill has a fixed cost of its own of one to a few decode-only forwards, so a budget of 4
# left little more than the 16-token floor (docs/packed.md, "Latency goals")
PACED_STEPS = 8.0
SCHEDULE_NAMES = {
    "hybrid": "packed, hybrid (stall-free)",
    "prefill-first": "packed, prefill-first",
    "decode-first": "packed, decode-first",
}
GOALS = {
    "ttft_p95": 0.6,
    "itl_p95": 1.0,
    "kv_peak": 1.1,
}  # issue 27 (decode: decode_profile.DECODE_GOAL, issue 40)
DECODE_REFERENCES = {
    PADDED: ("packed_vs_padded", "the padded layout"),
    MLX_LM: ("packed_vs_mlx_lm", "mlx-lm"),
}


class TrackedWorkbench(WorkbenchEngine):
    """A :class:`WorkbenchEngine` that records every iteration's :class:`Span` (its start and
    return on the scheduler's clock, the prefill tokens it ran) and samples, after it, the KV
    bytes its caches hold and the bytes of the tokens in them (:meth:`kv_sample`)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.samples: list[tuple[int, int, int]] = []
        self.spans: list[Span] = []
        self.peak_rows = 0  # the most requests admitted and not yet evicted after an iteration

    def iterate(self) -> int:
        """One iteration (``admit(); step(); filter()``), its span, then one KV sample."""
        sched = self.sched
        start_s, first = sched.clock(), len(sched.events)
        tokens = super().iterate()
        prefill = sum(e.n_tokens for e in sched.events[first:] if e.kind == "prefill")
        self.spans.append(Span(start_s, sched.clock(), prefill))
        self.samples.append(kv_sample(sched))
        in_flight = sum(
            r.status in (Status.PREFILLING, Status.RUNNING) for r in sched.state.requests.values()
        )
        self.peak_rows = max(self.peak_rows, in_flight)
        return tokens


def kv_sample(sched: Any) -> tuple[int, int, int]:
    """``(held_bytes, token_bytes, allocated_bytes)`` of a scheduler now: packed, pages x
    page bytes, the tokens in pages x bytes per token, the pools; padded, the caches'
    ``nbytes`` (batch + prefilling group), prompt + fed tokens of every row and the
    prefilled tokens of the group x bytes per token, the same ``nbytes``."""
    st = sched.state
    if sched.packed:
        per_token = st.batch.page_bytes // st.batch.page_size
        return st.batch.kv_bytes, sum(st.batch.held) * per_token, st.batch.pool_bytes
    per_token = sched.ledger.base.full_token_bytes
    held = sched.ledger.held(st)
    tokens = sum(r.context_tokens for r in st.batch.rows)
    tokens += sum(done for _, done, _ in st.prefilling.progress()) if st.prefilling else 0
    return held.batch_bytes + held.prefill_bytes, tokens * per_token, held.batch_bytes + held.prefill_bytes


def factories(
    model: Any, tokenizer: Any, names: Sequence[str], rows: int = MAX_BATCH
) -> dict[str, Callable[[], Any]]:
    """Fresh-engine factories: the padded workbench (:data:`PADDED`), the packed one
    (:data:`PACKED`, hybrid), the packed one paced (:data:`PACKED_PACED`: each forward's prefill
    capped to a time budget of :data:`PACED_STEPS` decode-only forwards, learned from its own
    forwards, :mod:`workbench.engine.levers.packed_pacing`), the packed one under each schedule
    (:data:`SCHEDULE_NAMES`), mlx-lm as shipped (:data:`MLX_LM`) and mlx-lm with at most
    ``MAX_BATCH`` requests in flight (:data:`MLX_LM_EQUAL`), all at ``rows`` rows (``max_batch``;
    mlx-lm's ``completion_batch_size`` and ``prefill_batch_size``) and ``CHUNK_TOKENS``."""

    def workbench(**kw: Any) -> Callable[[], Any]:
        return lambda: TrackedWorkbench(model, tokenizer, rows, CHUNK_TOKENS, history_size=64, **kw)

    packed = dict(layout="packed", page_size=PAGE_TOKENS, max_num_batched_tokens=CHUNK_TOKENS)
    every = {
        PADDED: workbench(),
        PACKED: workbench(**packed),
        PACKED_PACED: workbench(**packed, pacing=Pacing(itl_target_steps=PACED_STEPS)),
        MLX_LM: lambda: MlxLmEngine(model, rows, CHUNK_TOKENS),
        MLX_LM_EQUAL: lambda: MlxLmEngine(model, MAX_BATCH, CHUNK_TOKENS, max_in_flight=MAX_BATCH),
    }
    every.update({name: workbench(**packed, packed_schedule=s) for s, name in SCHEDULE_NAMES.items()})
    return {n: every[n] for n in names}


def azure_arrivals(tokenizer: Any) -> list[Arrival]:
    """The azure window of the module docstring, as arrivals."""
    work = conv_window(tokenizer)
    return [Arrival(tuple(r.prompt), r.max_tokens, at_s=t) for t, r in work.arrivals]


def latency(
    fac: dict[str, Callable[[], Any]],
    arrivals: list[Arrival],
    rounds: int,
    scenario: str,
    echo: Callable[[str], None],
    warm_up: bool = True,
    run: Callable[[Any, list[Arrival]], tuple[pd.DataFrame, list, list]] | None = None,
    floors: dict[str, float] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each engine through ``arrivals`` once (warm-up, discarded; not with ``warm_up=False``),
    then ``rounds`` times alternating. Returns ``(summary, kv)``: per run ``scenario,
    engine, round`` and TTFT / ITL p50, p95, p99 (seconds), tokens per second of makespan,
    where a workbench run's time went (:data:`~workbench.bench.latency_goals.PART_COLUMNS`,
    NaN for mlx-lm) and ``floors`` (``ttft_floor_p95_s``, ``itl_floor_s``; NaN without);
    per workbench run its KV peaks (``peak_held_bytes``, ``peak_token_bytes``,
    ``peak_allocated_bytes``). ``run(fac[name], arrivals) -> (events, kv samples, spans)``
    drives one engine (default: a fresh engine on the wall clock,
    :func:`workbench.bench.engines.drive`; the cost clock's is
    :func:`workbench.bench.packed_cost.run_on_cost_clock`)."""
    drive_one = _run if run is None else run
    floors = {"ttft_floor_p95_s": float("nan"), "itl_floor_s": float("nan")} | (floors or {})
    rows, kv = [], []
    for name in fac if warm_up else ():
        drive_one(fac[name], arrivals)
    for rnd, name in alternating(list(fac), rounds):
        events, samples, spans = drive_one(fac[name], arrivals)
        r, g = request_metrics(events), token_gaps(events)
        span_s = events[events.kind == "token"].time_s.max() - events[events.kind == "submit"].time_s.min()
        run = dict(scenario=scenario, engine=name, round=rnd)
        row = dict(run, requests=len(r), throughput_tok_per_s=int((events.kind == "token").sum()) / span_s)
        for q in (50, 95, 99):
            row[f"ttft_p{q}_s"], row[f"itl_p{q}_s"] = r.ttft_s.quantile(q / 100), g.gap_s.quantile(q / 100)
        row["peak_rows"] = events.attrs.get("peak_rows", float("nan"))
        rows.append(row | run_parts(events, spans) | floors)
        if samples:
            held, tokens, allocated = zip(*samples)
            kv.append(
                dict(
                    run,
                    peak_held_bytes=max(held),
                    peak_token_bytes=max(tokens),
                    peak_allocated_bytes=max(allocated),
                )
            )
        echo(
            f"  {scenario:<9} {name:<28} round {rnd}: TTFT p95 {row['ttft_p95_s'] * 1e3:7.1f} ms, "
            f"ITL p95 {row['itl_p95_s'] * 1e3:6.1f} ms"
        )
    return pd.DataFrame(rows), pd.DataFrame(kv)


def readings(engine: Any) -> tuple[pd.DataFrame, list, list[Span]]:
    """What a driven engine recorded: its events frame (``attrs["peak_rows"]``: the most
    requests it held in flight, NaN where it does not count them), its KV samples and its
    iteration spans (empty where it records none)."""
    events = events_frame(engine.events)
    events.attrs["peak_rows"] = getattr(engine, "peak_rows", float("nan"))  # requests in flight
    return events, list(getattr(engine, "samples", [])), list(getattr(engine, "spans", []))


def _run(factory: Callable[[], Any], arrivals: list[Arrival]) -> tuple[pd.DataFrame, list, list[Span]]:
    engine = factory()
    try:
        drive(engine, arrivals)
        return readings(engine)
    finally:
        engine.close()


@dataclass(frozen=True)
class PackedBenchResult:
    """What :func:`run_packed_bench` measured: ``decode`` (decode runs), ``latency`` (one
    row per run), ``kv`` (KV peaks per workbench run), ``meta`` (sizes, load, seconds),
    ``profile`` (per ``B`` and engine, where the decode step's time went:
    :func:`~workbench.bench.decode_profile.decode_profiles`; empty for runs written before it)."""

    decode: pd.DataFrame
    latency: pd.DataFrame
    kv: pd.DataFrame
    meta: dict
    profile: pd.DataFrame = field(default_factory=pd.DataFrame)


def _decode_sections(
    model: Any, tokenizer: Any, sizes: Sequence[int], pairs: int, repeats: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per ``B`` in ``sizes``: the decode runs (``pairs`` alternating pairs) and the step
    profile (``repeats`` runs per engine) of the padded layout, the packed one and mlx-lm, each
    with ``max(B, MAX_BATCH)`` rows, on ``B`` equal prompts of 16 tokens decoding 24."""
    decode, profile = [], []
    for B in sizes:
        engines = factories(model, tokenizer, (PADDED, PACKED, MLX_LM), max(B, MAX_BATCH))
        prompts = equal_prompts(tokenizer, B, 16)
        decode.append(decode_runs(engines, prompts, 24, pairs, lambda s: None).assign(B=B))
        profile.append(decode_profiles(engines, prompts, 24, repeats=repeats))
    return pd.concat(decode, ignore_index=True), pd.concat(profile, ignore_index=True)


def run_packed_bench(quick: bool = False, echo: Callable[[str], None] = print) -> PackedBenchResult:
    """Every section of the module docstring (``quick``: one pair / round each, B = 8
    only; else B = 1, 8 and 32), and after the decode runs each B's step profile
    (:func:`~workbench.bench.decode_profile.decode_profiles`, 1 run per engine quick, else 3).
    Returns the measured frames."""
    started_s, loads = time.perf_counter(), [os.getloadavg()[0]]
    model, tokenizer = load("tiny-llama")
    pairs, rounds, sizes = (1, 1, (8,)) if quick else (3, 2, (1, 8, 32))
    echo("decode throughput (alternating runs), then each B's step profile")
    decode, profile = _decode_sections(model, tokenizer, sizes, pairs, repeats=1 if quick else 3)
    at_8 = decode[decode.B == 8]
    step_s = at_8[at_8.engine == PADDED].step_s.median()
    itl_floor_s = float(at_8.groupby("engine").step_s.median().min())  # the decode step at B = 8
    three = factories(model, tokenizer, (PADDED, PACKED, PACKED_PACED, MLX_LM, MLX_LM_EQUAL))
    parts = []

    def scenario_run(scenario: str, arrivals: list[Arrival]) -> tuple[pd.DataFrame, pd.DataFrame]:
        # the floors before and after the engines' runs, the lower kept: load that comes and goes
        # can only raise a measurement
        before = ttft_floors(model, [a.prompt for a in arrivals])
        floors = {"ttft_floor_p95_s": float("nan"), "itl_floor_s": itl_floor_s}
        summary_kv = latency(three, arrivals, rounds, scenario, echo, floors=floors)
        lowest = np.minimum(before, ttft_floors(model, [a.prompt for a in arrivals]))
        ttft_floor = float(np.quantile(lowest, 0.95))
        echo(f"  floors: pure prefill p95 {ttft_floor * 1e3:.1f} ms, decode step {itl_floor_s * 1e3:.1f} ms")
        summary_kv[0]["ttft_floor_p95_s"] = ttft_floor
        return summary_kv

    for scenario, every_steps in (("staggered", 8), ("loaded", 3)):
        loads.append(os.getloadavg()[0])
        echo(f"{scenario} arrivals (one every {every_steps} decode steps of {step_s * 1e3:.1f} ms)")
        parts.append(scenario_run(scenario, staggered_arrivals(tokenizer, 16, every_steps * step_s)))
    loads.append(os.getloadavg()[0])
    echo("azure window (conv 10:00 + 12 s)")
    arrivals = azure_arrivals(tokenizer)
    parts.append(scenario_run("azure", arrivals))
    loads.append(os.getloadavg()[0])
    echo("sarathi: packed schedules on the azure window")
    parts.append(
        latency(factories(model, tokenizer, list(SCHEDULE_NAMES.values())), arrivals, rounds, "sarathi", echo)
    )
    loads.append(os.getloadavg()[0])
    meta = dict(
        mode="quick" if quick else "full",
        model="tiny-llama",
        max_batch=MAX_BATCH,
        chunk_tokens=CHUNK_TOKENS,
        page_tokens=PAGE_TOKENS,
        decode_step_s=step_s,
        azure_requests=len(arrivals),
        load_1min_min=min(loads),
        load_1min_max=max(loads),
        cores=os.cpu_count(),
        wall_s=time.perf_counter() - started_s,
    )
    return PackedBenchResult(
        decode,
        pd.concat([p[0] for p in parts], ignore_index=True),
        pd.concat([p[1] for p in parts], ignore_index=True),
        meta,
        profile,
    )


def summary(result: PackedBenchResult) -> pd.DataFrame:
    """Per scenario and engine: the medians over rounds of the latency numbers, and the
    TTFT and ITL p95 ratios to mlx-lm's as shipped (``*_vs_mlx_lm``) and, where the run has
    it, to mlx-lm's at equal capacity (``*_vs_mlx_lm_equal``, :data:`MLX_LM_EQUAL`)."""
    lat = result.latency.groupby(["scenario", "engine"], sort=False).median(numeric_only=True).reset_index()
    lat = lat.drop(columns=["round"])
    for engine, suffix in ((MLX_LM, "_vs_mlx_lm"), (MLX_LM_EQUAL, "_vs_mlx_lm_equal")):
        if engine not in set(lat.engine):
            continue
        for col in ("ttft_p95_s", "itl_p95_s"):
            ref = lat[lat.engine == engine].set_index("scenario")[col]
            lat[col.replace("_s", suffix)] = lat[col] / lat.scenario.map(ref)
    return lat


def goal_reference(s: pd.DataFrame) -> str:
    """The engine the latency goals are measured against in summary ``s``:
    :data:`MLX_LM_EQUAL` (equal capacity) where the run has it, else :data:`MLX_LM` (runs
    written before it)."""
    return MLX_LM_EQUAL if MLX_LM_EQUAL in set(s.engine) else MLX_LM


def kv_table(result: PackedBenchResult) -> pd.DataFrame:
    """Per scenario and workbench engine: peak bytes held, peak bytes of tokens held, their
    ratio, and the packed pools' allocation over the tokens' peak (maxima over rounds)."""
    kv = (
        result.kv.groupby(["scenario", "engine"], sort=False)
        .max(numeric_only=True)
        .reset_index()
        .drop(columns="round")
    )
    kv["held_vs_tokens"] = kv.peak_held_bytes / kv.peak_token_bytes
    kv["allocated_vs_tokens"] = kv.peak_allocated_bytes / kv.peak_token_bytes
    return kv


def decode_table(result: PackedBenchResult) -> pd.DataFrame:
    """Per ``B``: median decode tok/s per engine and the packed / padded and packed /
    mlx-lm ratios (medians of per-pair ratios)."""
    d = result.decode.pivot_table(index=["B", "pair"], columns="engine", values="tok_per_s")
    out = d.groupby("B").median()
    out["packed_vs_padded"] = (d[PACKED] / d[PADDED]).groupby("B").median()
    out["packed_vs_mlx_lm"] = (d[PACKED] / d[MLX_LM]).groupby("B").median()
    return out.reset_index()


def frame_markdown(frame: pd.DataFrame) -> str:
    """``frame`` as a Markdown table (floats to 3 significant digits)."""
    cell = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + " --- |" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def read_result(folder: Path) -> PackedBenchResult:
    """A :class:`PackedBenchResult` read back from the files :func:`packed_bench_job`
    wrote under ``folder`` (``packed-bench/*.csv`` and ``meta.json``)."""
    import json

    sub = Path(folder) / "packed-bench"
    meta = json.loads((sub / "meta.json").read_text()) if (sub / "meta.json").exists() else {}
    profile = pd.read_csv(sub / "profile.csv") if (sub / "profile.csv").exists() else pd.DataFrame()
    return PackedBenchResult(
        *(pd.read_csv(sub / f"{n}.csv") for n in ("decode", "latency", "kv")), meta, profile
    )


def report_text(result: PackedBenchResult) -> str:
    """The markdown ``packed-bench.md``: the three tables, the goals of issues 27 and 40, and
    the decode step profile."""
    s, kv, dec = summary(result), kv_table(result), decode_table(result)
    m = {
        "mode": "?",
        "model": "tiny-llama",
        "max_batch": MAX_BATCH,
        "chunk_tokens": CHUNK_TOKENS,
        "page_tokens": PAGE_TOKENS,
        "load_1min_min": float("nan"),
        "load_1min_max": float("nan"),
        "cores": os.cpu_count(),
        "wall_s": float("nan"),
    } | result.meta
    lines = [
        f"# Packed layout benchmark (`workbench bench --packed{' --quick' if m['mode'] == 'quick' else ''}`)",
        "",
        f"Model {m['model']}, max_batch {m['max_batch']}, chunk / token budget {m['chunk_tokens']} tokens, pages "
        f"of {m['page_tokens']}; load average {m['load_1min_min']:.1f} to {m['load_1min_max']:.1f} on "
        f"{m['cores']} cores; {m['wall_s']:.0f} s.",
        "",
        "## Decode tok/s (alternating runs)",
        "",
        frame_markdown(dec),
        "",
        "## Latency (medians over rounds; seconds)",
        "",
        frame_markdown(s),
        "",
        "## KV bytes: peak held vs peak bytes of tokens held",
        "",
        frame_markdown(kv),
        "",
        "## Goals (issues 27 and 40)",
        "",
    ]
    lines += goal_lines(s, kv, dec, result.profile)
    if len(result.profile):
        lines += [
            "",
            "## Decode step profile (median full-batch step; ms)",
            "",
            frame_markdown(result.profile),
        ]
    return "\n".join(lines) + "\n"


def goal_lines(
    s: pd.DataFrame, kv: pd.DataFrame, dec: pd.DataFrame, profile: pd.DataFrame | None = None
) -> list[str]:
    """One line per goal: the packed layout's value, the goal, met or not; per latency
    scenario each measure's line (for a missed one its floor and where the time went:
    :func:`~workbench.bench.latency_goals.goal_verdicts`), then both at once; per decode ``B``
    the packed layout against the padded one and mlx-lm (for a missed one its floor and
    ``profile``'s split: :func:`~workbench.bench.decode_profile.decode_goal_lines`)."""
    against = goal_reference(s)
    out = [_reference_line(against)]
    reference = s[s.engine == against].set_index("scenario")
    mlx_engines = (MLX_LM, MLX_LM_EQUAL)
    for engine in (PACKED, PACKED_PACED, PADDED):  # the goals are the packed layout's; padded beside
        for _, row in s[(s.engine == engine) & s.scenario.isin(reference.index)].iterrows():
            out += goal_verdicts(row, reference.loc[row.scenario], against)
    if against == MLX_LM_EQUAL:
        out += _as_shipped_lines(s)
    if "peak_rows" in s:
        for scenario in reference.index:
            here = s[s.scenario == scenario].set_index("engine").peak_rows
            mlx = ", ".join(f"{e} {here[e]:.0f}" for e in mlx_engines if e in here.index)
            out.append(
                f"- {scenario}: requests in flight at most: {mlx}, the workbench "
                f"{here.drop(list(mlx_engines), errors='ignore').max():.0f} (max_batch {MAX_BATCH}; mlx-lm's "
                "generation batch can pass its completion_batch_size, see MlxLmEngine.peak_rows)"
            )
    out += decode_goal_lines(
        dec, profile if profile is not None else pd.DataFrame(), PACKED, DECODE_REFERENCES
    )
    for _, row in kv[kv.engine == PACKED].iterrows():
        out.append(
            f"- {row.scenario}: packed peak KV bytes {row.held_vs_tokens:.3f}x the bytes of the tokens held "
            f"(pools allocated {row.allocated_vs_tokens:.3f}x; goal <= {GOALS['kv_peak']}): "
            f"{'met' if row.held_vs_tokens <= GOALS['kv_peak'] else 'missed'}"
        )
    return out


def _reference_line(against: str) -> str:
    if against == MLX_LM_EQUAL:
        return (
            f"- reference for the latency goals: {MLX_LM_EQUAL}, mlx-lm's BatchGenerator with at most "
            f"{MAX_BATCH} requests prefilling or decoding (the bench adapter queues the rest, their TTFT "
            f"counted from submit), as the workbench's max_batch {MAX_BATCH}: equal capacity, as vLLM's "
            "benchmarks compare engines at equal max_num_seqs; mlx-lm as shipped, which can hold more "
            "(its generation batch passes completion_batch_size), beside"
        )
    return (
        "- reference for the latency goals: mlx-lm as shipped (this run has no equal-capacity mlx-lm): "
        f"it can hold more requests in flight than the workbench's max_batch {MAX_BATCH}"
    )


def _as_shipped_lines(s: pd.DataFrame) -> list[str]:
    """The packed engines' p95 ratios to mlx-lm as shipped (the goals' old reference)."""
    if MLX_LM not in set(s.engine):
        return []
    shipped = s[s.engine == MLX_LM].set_index("scenario")
    out = []
    for engine in (PACKED, PACKED_PACED):
        for _, row in s[(s.engine == engine) & s.scenario.isin(shipped.index)].iterrows():
            ref = shipped.loc[row.scenario]
            ttft, itl = row.ttft_p95_s / ref.ttft_p95_s, row.itl_p95_s / ref.itl_p95_s
            met = ttft <= GOALS["ttft_p95"] and itl <= GOALS["itl_p95"]
            out.append(
                f"- {row.scenario}, {engine}: against mlx-lm as shipped, TTFT p95 {ttft:.2f}x, ITL p95 "
                f"{itl:.2f}x ({ref.ttft_p95_s * 1e3:.1f} / {ref.itl_p95_s * 1e3:.1f} ms): both goals "
                f"{'met' if met else 'missed'}"
            )
    return out


def packed_bench_job(
    quick: bool = False, out_dir: Path | None = None, echo: Callable[[str], None] = print
) -> int:
    """``workbench bench --packed``: run, write ``packed-bench.md`` and
    ``packed-bench/{decode,latency,kv,profile}.csv`` under ``out_dir`` (default
    ``workbench-out``), print the report. Returns the exit code (0)."""
    out = Path(out_dir) if out_dir is not None else Path("workbench-out")
    (out / "packed-bench").mkdir(parents=True, exist_ok=True)
    result = run_packed_bench(quick, echo)
    import json

    for name in ("decode", "latency", "kv", "profile"):
        getattr(result, name).to_csv(out / "packed-bench" / f"{name}.csv", index=False)
    (out / "packed-bench" / "meta.json").write_text(json.dumps(result.meta, indent=1, default=str))
    text = report_text(result)
    (out / "packed-bench.md").write_text(text)
    echo(text)
    return 0
