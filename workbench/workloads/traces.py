"""Real request traces: the Azure LLM inference trace format, windowed and scaled to fit
a small model.

Knows: the CSV format (``TIMESTAMP, ContextTokens, GeneratedTokens``; one row per
request), where the shared copy of the 2023 traces lives, and
:mod:`workbench.workloads.workload` (to turn lengths into requests). Must not know: the scheduler.

The traces (conversation and coding services, 2023-11-16, about one hour each) are
published by Microsoft Azure under CC-BY with: Patel et al., "Splitwise: Efficient
generative LLM inference using phase splitting", ISCA 2024. They carry lengths, not
text, so prompts are synthesized to the exact lengths (:func:`synthesize_prompts`).
They are not copied into this repository: :func:`trace_path` finds them in
``$WORKBENCH_TRACE_DIR`` or ``<repo>/../shared/data/azure-llm-inference-2023/``.

Fitting a trace to a small model (:func:`fit_lengths`), per request, in this order:

1. ``length_scale``: both lengths multiplied, rounded, at least 1 token;
2. caps: prompt at most ``max_prompt_tokens``, output at most ``max_output_tokens``;
3. context: if prompt + output exceeds ``context_tokens``, the prompt is cut to
   ``context_tokens - output`` (the output is cut too if it alone needs more than
   ``context_tokens - 1``).

Example: lengths (1500, 300) with scale 1.0, no caps, context 1024 -> (724, 300).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..engine.request import Request
from ..runtime.loading import DATA_DIR
from .distributions import LogNormal
from .workload import Workload, synthesize_prompts, synthetic

TRACE_DIR_ENV = "WORKBENCH_TRACE_DIR"
DEFAULT_TRACE_DIR = DATA_DIR.parent.parent / "shared" / "data" / "azure-llm-inference-2023"
TRACE_FILES = {"conv": "AzureLLMInferenceTrace_conv.csv", "code": "AzureLLMInferenceTrace_code.csv"}
TRACE_COLUMNS = ["arrival_s", "prompt_tokens", "output_tokens"]
CITATION = (
    'Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", '
    "ISCA 2024 (Azure LLM inference trace 2023, CC-BY)"
)


def trace_dir() -> Path:
    """``$WORKBENCH_TRACE_DIR`` if set, else ``<repo>/../shared/data/azure-llm-inference-2023``."""
    return Path(os.environ.get(TRACE_DIR_ENV) or DEFAULT_TRACE_DIR)


def trace_path(name: str = "conv") -> Path:
    """Path of the ``conv`` or ``code`` trace in :func:`trace_dir`.

    Raises:
        ValueError: for another name.
        FileNotFoundError: when the file is absent, saying where it was looked for and how
            to point elsewhere.
    """
    if name not in TRACE_FILES:
        raise ValueError(f"trace name must be one of {sorted(TRACE_FILES)}, got {name!r}")
    path = trace_dir() / TRACE_FILES[name]
    if not path.is_file():
        raise FileNotFoundError(
            f"Azure trace {path} not found; set ${TRACE_DIR_ENV} to a folder holding {TRACE_FILES[name]} "
            "(from github.com/Azure/AzurePublicDataset)"
        )
    return path


def trace_missing(name: str = "conv") -> str | None:
    """A message saying that the ``conv`` or ``code`` trace is absent, where it was looked
    for and how to point at it (``$WORKBENCH_TRACE_DIR``), in lines that fit a notebook's
    output area (at most 100 characters beside the folder's path); ``None`` when
    :func:`trace_path` finds it.

    Raises:
        ValueError: for another name.
    """
    try:
        trace_path(name)
    except FileNotFoundError:
        return (
            f"No Azure {name} trace in {trace_dir()}.\n"
            f"To replay the real trace, set ${TRACE_DIR_ENV} to a folder holding\n"
            f"{TRACE_FILES[name]} (github.com/Azure/AzurePublicDataset, AzureLLMInferenceDataset2023)."
        )
    return None


def read_azure_trace(path: str | Path) -> pd.DataFrame:
    """Read a trace CSV into ``TRACE_COLUMNS``: ``arrival_s`` (float64 seconds since the
    first request, sorted), ``prompt_tokens`` and ``output_tokens`` (int64).

    Raises:
        ValueError: naming the missing columns when the file is not in the trace format.
    """
    raw = pd.read_csv(path)
    missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(raw.columns)
    if missing:
        raise ValueError(f"{path}: not an Azure LLM inference trace, missing column(s) {sorted(missing)}")
    stamps = pd.to_datetime(raw.TIMESTAMP, format="ISO8601")
    out = pd.DataFrame(
        {
            "arrival_s": (stamps - stamps.min()).dt.total_seconds().to_numpy(np.float64),
            "prompt_tokens": raw.ContextTokens.to_numpy(np.int64),
            "output_tokens": raw.GeneratedTokens.to_numpy(np.int64),
        }
    )
    return out.sort_values("arrival_s", kind="stable").reset_index(drop=True)


def window(
    trace: pd.DataFrame, start_s: float = 0.0, duration_s: float | None = None, time_scale: float = 1.0
) -> pd.DataFrame:
    """Requests arriving in ``[start_s, start_s + duration_s)`` (trace seconds), with
    times shifted to start at 0 and multiplied by ``time_scale`` (0.5 = twice the rate).

    Raises:
        ValueError: for ``time_scale <= 0`` or ``duration_s <= 0``.
    """
    if not time_scale > 0 or (duration_s is not None and not duration_s > 0):
        raise ValueError(f"need time_scale > 0 and duration_s > 0 or None, got {time_scale}, {duration_s}")
    end_s = np.inf if duration_s is None else start_s + duration_s
    w = trace[(trace.arrival_s >= start_s) & (trace.arrival_s < end_s)].copy()
    w["arrival_s"] = (w.arrival_s - start_s) * time_scale
    return w.reset_index(drop=True)


def fit_lengths(
    prompt_tokens: Any,
    output_tokens: Any,
    length_scale: float = 1.0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    context_tokens: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Scale and cap ``[N]`` prompt and output lengths (see the module docstring).

    Returns:
        ``(prompt_tokens [N], output_tokens [N])`` int64, each ``>= 1``, and
        ``prompt + output <= context_tokens`` when that is given.

    Raises:
        ValueError: for ``length_scale <= 0``, a cap ``< 1`` or ``context_tokens < 2``.
    """
    if not length_scale > 0:
        raise ValueError(f"length_scale must be > 0, got {length_scale}")
    for name, cap, least in (
        ("max_prompt_tokens", max_prompt_tokens, 1),
        ("max_output_tokens", max_output_tokens, 1),
        ("context_tokens", context_tokens, 2),
    ):
        if cap is not None and cap < least:
            raise ValueError(f"{name} must be >= {least}, got {cap}")
    p = np.maximum(np.rint(np.asarray(prompt_tokens, np.float64) * length_scale), 1).astype(np.int64)
    o = np.maximum(np.rint(np.asarray(output_tokens, np.float64) * length_scale), 1).astype(np.int64)
    p = np.minimum(p, max_prompt_tokens) if max_prompt_tokens else p
    o = np.minimum(o, max_output_tokens) if max_output_tokens else o
    if context_tokens:
        o = np.minimum(o, context_tokens - 1)
        p = np.minimum(p, context_tokens - o)
    return p, o


def trace_workload(
    trace: pd.DataFrame | str | Path,
    tokenizer: Any,
    seed: int | np.random.Generator = 0,
    *,
    start_s: float = 0.0,
    duration_s: float | None = None,
    time_scale: float = 1.0,
    length_scale: float = 1.0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    context_tokens: int | None = 2048,
    max_requests: int | None = None,
    name: str | None = None,
) -> Workload:
    """A :class:`Workload` from a trace window: arrival times from the trace, prompts
    synthesized to the fitted prompt lengths, ``max_tokens`` = the fitted output length
    and ``stop_ids=[]`` (so each request generates exactly its trace output length).

    Args:
        trace: a :func:`read_azure_trace` frame, or a path to a trace CSV.
        tokenizer: cuts the prompts; ``seed`` picks where (deterministic).
        start_s, duration_s, time_scale: see :func:`window`.
        length_scale, max_prompt_tokens, max_output_tokens, context_tokens: see
            :func:`fit_lengths`; ``context_tokens`` defaults to the bundled models'
            ``max_position_embeddings`` (2048).
        max_requests: keep only the first this many requests of the window.
    """
    frame = trace if isinstance(trace, pd.DataFrame) else read_azure_trace(trace)
    w = window(frame, start_s, duration_s, time_scale).head(max_requests)
    p, o = fit_lengths(
        w.prompt_tokens, w.output_tokens, length_scale, max_prompt_tokens, max_output_tokens, context_tokens
    )
    prompts = synthesize_prompts(tokenizer, p, seed)
    label = name or f"trace window {start_s:g}+{duration_s if duration_s is not None else 'end'} s"
    return Workload(
        tuple(
            (float(t), Request(prompt=ids, max_tokens=int(m), stop_ids=[]))
            for t, ids, m in zip(w.arrival_s, prompts, o)
        ),
        name=label,
    )


# the Azure conversation window the packed bench and the cost lab scripts replay:
CONV_WINDOW = dict(start_s=600, duration_s=12, time_scale=0.3, length_scale=0.25)
CONV_LIMITS = dict(max_prompt_tokens=512, max_output_tokens=128)


def conv_window(tokenizer: Any, name: str | None = None) -> Workload:
    """The Azure conversation trace's 10:00 + 12 s window (:data:`CONV_WINDOW`: arrivals
    0.3x apart, lengths x 0.25, prompts <= 512 and outputs <= 128 tokens), as a
    :func:`trace_workload` cut by ``tokenizer`` (seed 0).

    Raises:
        FileNotFoundError: the trace is absent (see :func:`trace_path`).
    """
    return trace_workload(
        read_azure_trace(trace_path("conv")), tokenizer, seed=0, name=name, **CONV_WINDOW, **CONV_LIMITS
    )


# a synthetic stand-in for CONV_WINDOW, fitted to it (request count, rate, length medians and
# log-spreads, caps): what notebooks 06 and 12 replay where the trace is absent.
CONV_STANDIN = dict(
    n_requests=59,
    rate_per_s=16.4,
    prompt_tokens=LogNormal(260, 0.9, high=CONV_LIMITS["max_prompt_tokens"]),
    output_tokens=LogNormal(42, 0.8, high=CONV_LIMITS["max_output_tokens"]),
)


def conv_window_or_standin(tokenizer: Any, name: str = "conv 10:00+12 s") -> Workload:
    """:func:`conv_window` named ``name`` when the conversation trace is there, else the
    seeded synthetic stand-in :data:`CONV_STANDIN` (Poisson arrivals, log-normal lengths
    fitted to the window), named ``"synthetic stand-in for <name>"`` so every table and
    figure title says which one ran. :func:`trace_missing` says why the trace is absent.

    Example: ``conv_window_or_standin(tokenizer).name`` is ``"conv 10:00+12 s"`` with the
    trace and ``"synthetic stand-in for conv 10:00+12 s"`` without.
    """
    if trace_missing("conv") is None:
        return conv_window(tokenizer, name=name)
    return synthetic(tokenizer, seed=0, name=f"synthetic stand-in for {name}", **CONV_STANDIN)
