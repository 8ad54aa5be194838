"""Calibration: measure the engine's forwards on this machine and fit a :class:`CostModel`.

Knows: the scheduler's public API and :class:`workbench.engine.prefill.PrefillGroup` (what
``admit()`` runs), the cost model's features (:func:`workbench.sim.costmodel.prefill_features`,
:func:`~workbench.sim.costmodel.decode_features`), numpy least squares. Must not know: the
scheduler's internals, replays. The cost model itself runs nothing; this module is the
only part of the simulation that runs the engine.

:func:`measure_costs` times prefill chunks and decode steps (``PREFILL_COLUMNS`` /
``DECODE_COLUMNS`` frames, seconds); :func:`fit_cost_model` fits the coefficients by
least squares on the median time of each distinct measured configuration (typical,
spikes ignored: on a shared machine the fastest time would predict an idle machine, not
what a replay measures; a coefficient that comes out negative is fixed at 0 and the rest
refitted); :func:`calibrate` does both. ``workbench calibrate`` writes the result as JSON
and prints :func:`fit_errors_text`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..engine.levers.cost import nonnegative_lstsq
from ..engine.prefill import PrefillGroup
from ..engine.request import Request
from ..engine.scheduler import Scheduler
from ..workloads.workload import prompt_of_length
from .costmodel import CostModel, decode_features, prefill_features

PREFILL_COLUMNS = ["rows", "tokens", "start_tokens", "time_s"]
DECODE_COLUMNS = ["batch_size", "kv_width_tokens", "time_s"]


def fit_cost_model(prefill: pd.DataFrame, decode: pd.DataFrame, label: str = "") -> CostModel:
    """Fit a :class:`CostModel` from measurements.

    Args:
        prefill: rows with ``PREFILL_COLUMNS`` (one chunk of a group each).
        decode: rows with ``DECODE_COLUMNS`` (one decode step each). Repeated
            configurations (same rows, tokens and start, or same batch size and width)
            are reduced to their median time before fitting.

    Raises:
        ValueError: with fewer than 3 distinct configurations in either frame.
    """
    p = prefill.groupby(["rows", "tokens", "start_tokens"], as_index=False).time_s.median()
    d = decode.groupby(["batch_size", "kv_width_tokens"], as_index=False).time_s.median()
    pc = nonnegative_lstsq(prefill_features(p.rows, p.tokens, p.start_tokens), p.time_s.to_numpy(float))
    dc = nonnegative_lstsq(decode_features(d.batch_size, d.kv_width_tokens), d.time_s.to_numpy(float))
    return CostModel(*map(float, pc), *map(float, dc), label=label)


def measure_costs(
    model: Any,
    tokenizer: Any,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    kv_widths_tokens: Sequence[int] = (32, 128, 512),
    chunk_tokens: Sequence[int] = (16, 64, 256),
    group_rows: Sequence[int] = (1, 4),
    prefill_context_tokens: int = 512,
    decode_steps: int = 6,
    repeats: int = 3,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Measure prefill chunks and decode steps of ``model`` on this machine.

    Prefill: for each group size ``B`` in ``group_rows`` and chunk size ``C``, ``B``
    prompts of ``prefill_context_tokens`` run through
    :class:`~workbench.engine.prefill.PrefillGroup` in chunks of ``C`` (each timed, at its start
    position). Decode: for each ``B`` and ``W``, ``B`` prompts of ``W``
    tokens are admitted into a :class:`~workbench.engine.scheduler.Scheduler`, then
    ``decode_steps`` steps are timed after one warm-up step. Everything ``repeats`` times.

    Returns:
        ``(prefill [N, PREFILL_COLUMNS], decode [M, DECODE_COLUMNS])``, times in seconds.
    """
    prefill_rows, decode_rows = [], []
    for _ in range(repeats):
        _measure_prefill(model, tokenizer, group_rows, chunk_tokens, prefill_context_tokens, prefill_rows)
        _measure_decode(model, tokenizer, batch_sizes, kv_widths_tokens, decode_steps, decode_rows)
    return (
        pd.DataFrame(prefill_rows, columns=PREFILL_COLUMNS),
        pd.DataFrame(decode_rows, columns=DECODE_COLUMNS),
    )


def _measure_prefill(model, tokenizer, group_rows, chunk_tokens, context_tokens, out) -> None:
    for b in group_rows:
        for c in chunk_tokens:
            prompts = [prompt_of_length(tokenizer, context_tokens, 3 * c + 7 * i) for i in range(b)]
            group = PrefillGroup(model, prompts, c)
            while not group.done:
                start = group.position
                t0 = time.perf_counter()
                k = group.run_chunk()[0]
                out.append((b, k, start, time.perf_counter() - t0))


def _measure_decode(model, tokenizer, batch_sizes, kv_widths_tokens, decode_steps, rows) -> None:
    for b in batch_sizes:
        for w in kv_widths_tokens:
            sched = Scheduler(
                model, tokenizer, max_batch=b, prefill_step_size=max(kv_widths_tokens), history_size=0
            )
            for i in range(b):
                sched.submit(
                    Request(
                        prompt=prompt_of_length(tokenizer, w, 11 * i),
                        max_tokens=decode_steps + 2,
                        stop_ids=[],
                    )
                )
            sched.admit()
            sched.step()
            for _ in range(decode_steps):
                width = sched.snapshot().kv_width_tokens
                t0 = time.perf_counter()
                sched.step()
                rows.append((b, width, time.perf_counter() - t0))


def calibrate(model: Any, tokenizer: Any, label: str = "", **measure_kwargs: Any) -> CostModel:
    """:func:`measure_costs` (``measure_kwargs`` are its keywords) then
    :func:`fit_cost_model` (``label`` names the model and machine).

    Raises:
        ValueError: as :func:`fit_cost_model`, when the measurements cover fewer than 3
            configurations."""
    prefill, decode = measure_costs(model, tokenizer, **measure_kwargs)
    return fit_cost_model(prefill, decode, label=label)


def fit_errors_text(cost: CostModel, prefill: pd.DataFrame, decode: pd.DataFrame) -> str:
    """Per kind (prefill, decode): how many distinct configurations were measured and the
    median relative error of ``cost``'s prediction against each one's median time (text
    lines, as ``workbench calibrate`` prints them)."""
    lines = []
    for name, frame, keys, predict in (
        (
            "prefill",
            prefill,
            ["rows", "tokens", "start_tokens"],
            lambda r: cost.prefill_s(r.tokens, r.start_tokens, r.rows),
        ),
        (
            "decode",
            decode,
            ["batch_size", "kv_width_tokens"],
            lambda r: cost.decode_s(r.batch_size, r.kv_width_tokens),
        ),
    ):
        med = frame.groupby(keys, as_index=False).time_s.median()
        err = (pd.Series([predict(r) for r in med.itertuples()]) - med.time_s).abs() / med.time_s
        lines.append(
            f"{name}: {len(med)} configurations, median relative error {err.median():.0%} "
            "(vs the median of each)"
        )
    return "\n".join(lines)
