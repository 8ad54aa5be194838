"""What a quantized KV cache (``Scheduler(kv_bits=...)``) saves and costs against the float
cache: bytes per token, the decode step's time at ``B`` rows x ``S`` tokens of context, and
how many rows admission runs under the same byte budget.

Knows: :mod:`workbench.engine.levers.quantized_kv` (the batched quantized cache, its settings),
:func:`workbench.engine.kv.profile.kv_profile` (bytes per token), the join-cost scenario's
random K/V caches (:mod:`workbench.bench.scenarios`), the scheduler's public calls. Must not
know: the cache's internals.

A setting is ``(kv_bits, kv_group_size)``; ``kv_bits=None`` is the float cache. Bytes are
exact (array ``nbytes``); step times are medians of wall-clock seconds and depend on the
machine (the docs state which); row counts under a budget are deterministic.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import pandas as pd

from ..engine.kv import caches as kv
from ..engine.kv.profile import kv_profile, projected_bytes
from ..engine.levers.quantized_attention import attention_path
from ..engine.levers.quantized_kv import KVQuant, check_model, quantize_batch
from ..engine.request import Request
from ..engine.scheduler import Scheduler
from ..workloads.workload import prompt_of_length
from .scenarios import _filled_rows, _timed

Setting = tuple[int | None, int]


# The columns of step_cost's and admission_under_budget's frames, one row per setting
STEP_COLUMNS = (
    "setting",
    "rows",
    "context_tokens",
    "kv_bytes",
    "step_s",
    "step_s_p25",
    "step_s_p75",
    "load_1min",
    "vs_float",
)
ADMISSION_COLUMNS = (
    "setting",
    "kv_budget_bytes",
    "request_bytes",
    "max_rows",
    "decode_steps",
    "tokens_per_step",
)


def label(setting: Setting) -> str:
    """``float`` or ``q<bits>/g<group>``, e.g. ``q4/g64``."""
    bits, group = setting
    return "float" if bits is None else f"q{bits}/g{group}"


def _quant(setting: Setting) -> KVQuant | None:
    return None if setting[0] is None else KVQuant(setting[0], setting[1])


def bytes_per_token(model: Any, settings: Sequence[Setting]) -> pd.DataFrame:
    """KV bytes one token costs in every layer (keys + values; packed values, scales and
    biases when quantized), from :func:`kv_profile`'s probe. Columns ``setting``,
    ``kv_bits``, ``kv_group_size``, ``bytes_per_token``, ``vs_float`` (ratio to the first
    float setting, or to the first setting)."""
    rows = [
        (label(s), s[0], s[1], projected_bytes(kv_profile(model, kv_quant=_quant(s)), 1)) for s in settings
    ]
    frame = pd.DataFrame(rows, columns=["setting", "kv_bits", "kv_group_size", "bytes_per_token"])
    base = frame.loc[frame.kv_bits.isna(), "bytes_per_token"]
    frame["vs_float"] = frame.bytes_per_token / (base.iloc[0] if len(base) else frame.bytes_per_token.iloc[0])
    return frame


def _quartiles(times: Sequence[float]) -> tuple[float, float, float]:
    """Median, 25th and 75th percentile of ``times`` (one value: that value three times)."""
    if len(times) == 1:
        return times[0], times[0], times[0]
    p25, p50, p75 = statistics.quantiles(times, n=4, method="inclusive")
    return p50, p25, p75


def step_cost(
    model: Any,
    rows: int,
    context_tokens: int,
    settings: Sequence[Setting],
    repeats: int = 5,
    warm_steps: int = 2,
) -> pd.DataFrame:
    """Seconds of one decode forward ``[rows, 1]`` over a batch cache of ``context_tokens``
    random keys and values per row, float or quantized (the float cache through
    :func:`quantize_batch`, as the engine converts it), and the cache's bytes. Settings
    are measured in turn within each repeat (so drift hits all alike); medians over
    ``repeats``. Columns ``setting``, ``rows``, ``context_tokens``, ``kv_bytes``,
    ``step_s`` (median), ``step_s_p25`` / ``step_s_p75`` (the quartiles of the repeats: the
    middle half of them lies between),
    ``load_1min`` (the machine's 1-minute load average when the timed repeats began; NaN
    where the OS has none), ``vs_float`` (median step time ratio to the float setting).
    Quantized settings
    attend as a scheduler with them would (:func:`~workbench.engine.levers.quantized_kv.check_model`:
    ``quantized_matmul``, or dequantizing where the device lacks it)."""
    base = kv.merge_rows(_filled_rows(model, rows, context_tokens))
    mx.eval([c.state for c in base])
    caches = {}
    for s in settings:
        q = _quant(s)
        caches[s] = (
            kv.merge_rows(_filled_rows(model, rows, context_tokens)) if q is None else quantize_batch(base, q)
        )
        mx.eval([c.state for c in caches[s]])
    token = mx.zeros((rows, 1), dtype=mx.uint32)
    paths = {s: None if s[0] is None else check_model(model, _quant(s)).attention for s in settings}

    def step(s: Setting) -> Callable[[], mx.array]:
        def forward() -> mx.array:
            with attention_path(model, paths[s]):  # the path a scheduler with this setting takes
                return mx.argmax(model(token, cache=caches[s])[:, -1, :], axis=-1)

        return forward

    for s in settings:
        for _ in range(warm_steps):
            _timed(step(s))
    times: dict[Setting, list[float]] = {s: [] for s in settings}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for _ in range(repeats):
        for s in settings:
            times[s].append(_timed(step(s)))
    frame = pd.DataFrame(
        [
            (
                label(s),
                rows,
                context_tokens,
                kv.kv_bytes(caches[s]),
                statistics.median(t),
                min(t),
                max(t),
                load,
            )
            for s, t in times.items()
        ],
        columns=list(STEP_COLUMNS[:-1]),  # vs_float follows from step_s
    )
    base_s = frame.loc[frame.setting == "float", "step_s"]
    frame["vs_float"] = frame.step_s / (base_s.iloc[0] if len(base_s) else frame.step_s.iloc[0])
    return frame


def admission_under_budget(
    model: Any,
    tokenizer: Any,
    settings: Sequence[Setting],
    budget_requests: int = 2,
    n_requests: int = 12,
    prompt_tokens: int = 48,
    max_tokens: int = 16,
    max_batch: int = 12,
) -> pd.DataFrame:
    """The same ``n_requests`` (``prompt_tokens`` + ``max_tokens``) through a scheduler
    whose ``kv_budget_bytes`` is what ``budget_requests`` float requests project; per
    setting the most rows running at once, the decode steps to finish them all, and
    generated tokens per decode step. Deterministic (no clock is read for it).

    Columns ``setting``, ``kv_budget_bytes``, ``request_bytes`` (one request's projected
    bytes alone), ``max_rows``, ``decode_steps``, ``tokens_per_step``.
    """

    def sched_of(s: Setting, **kw: Any) -> Scheduler:
        quant = (
            dict(kv_bits=s[0], kv_group_size=s[1]) if s[0] is not None else {}
        )  # a float cache has no groups
        return Scheduler(model, tokenizer, history_size=0, **quant, **kw)

    def one_request(s: Setting) -> int:
        sched = sched_of(s)
        sched.submit(Request(prompt=prompt_of_length(tokenizer, prompt_tokens), max_tokens=max_tokens))
        sched.admit()
        return sched.kv_projected_bytes

    budget = budget_requests * one_request((None, settings[0][1]))
    out = []
    for s in settings:
        sched = sched_of(s, max_batch=max_batch, kv_budget_bytes=budget)
        for i in range(n_requests):
            sched.submit(
                Request(prompt=prompt_of_length(tokenizer, prompt_tokens, 17 * i), max_tokens=max_tokens)
            )
        most = 0
        while not sched.idle:
            sched.admit()
            most = max(most, len(sched.batch))
            sched.step()
            sched.filter()
        tokens = sum(len(sched.tokens(u)) for u in sched.requests)
        out.append(
            (label(s), budget, one_request(s), most, sched.step_index, tokens / max(sched.step_index, 1))
        )
    return pd.DataFrame(
        out,
        columns=list(ADMISSION_COLUMNS),
    )
