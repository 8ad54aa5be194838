"""A calibrated cost model of the engine's calls, for replays on a virtual clock.

Knows: the two kinds of forward the scheduler runs (prefill chunks and ``[B, 1]`` decode
steps), the ``prefill`` and ``join`` events, numpy least squares. Must not know: the
scheduler's internals (measurement drives the public API and
:class:`workbench.prefill.PrefillGroup`, which is what ``admit()`` runs).

Model (seconds; every coefficient ``>= 0``)::

    prefill chunk of k tokens of one row, after s cached tokens:
        prefill_s = p_chunk + p_token * k + p_pair * (k * s + k * (k + 1) / 2)
                                                      └─ causal (query, key) pairs
    decode step of B rows at KV width W:
        decode_s  = d_step + d_row * B + d_kv * B * W
    join of n rows (one [n, 1] forward over their prompts of w_i tokens):
        join_s    = d_step + sum_i (d_row + d_kv * w_i)

Simplifications, stated: a group's prefill is charged per row from its real (non-pad)
tokens, so right-padding compute is not charged; the ``filter`` call costs nothing.

:func:`fit_cost_model` fits the coefficients by least squares on the median time of each
distinct measured configuration (robust to the spikes of a contended machine; a
coefficient that comes out negative is fixed at 0 and the rest refitted); :func:`measure_costs` measures the
current machine; :func:`calibrate` does both. :class:`CostMeter` turns the events of one
``admit()`` into seconds for a replay.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from .events import Event
from .prefill import PrefillGroup
from .request import Request
from .scheduler import Scheduler
from .workloads import prompt_of_length

PREFILL_COLUMNS = ["tokens", "start_tokens", "time_s"]
DECODE_COLUMNS = ["batch_size", "kv_width_tokens", "time_s"]


@dataclass(frozen=True)
class CostModel:
    """Seconds per engine operation for one model on one machine (see module docstring).

    Attributes:
        prefill_s_per_chunk, prefill_s_per_token, prefill_s_per_pair: ``p_chunk``,
            ``p_token``, ``p_pair``.
        decode_s_per_step, decode_s_per_row, decode_s_per_kv_token: ``d_step``, ``d_row``,
            ``d_kv`` (per row per KV position).
        label: where the numbers come from (model, machine).
    """

    prefill_s_per_chunk: float = 0.0
    prefill_s_per_token: float = 0.0
    prefill_s_per_pair: float = 0.0
    decode_s_per_step: float = 0.0
    decode_s_per_row: float = 0.0
    decode_s_per_kv_token: float = 0.0
    label: str = ""

    def prefill_s(self, tokens: int, start_tokens: int = 0) -> float:
        """Seconds for a prefill chunk of ``tokens`` of one row after ``start_tokens``."""
        return float(prefill_features([tokens], [start_tokens])[0] @ self._prefill_coef)

    def decode_s(self, batch_size: int, kv_width_tokens: int) -> float:
        """Seconds for one decode step of ``batch_size`` rows at KV width; 0 for no rows."""
        if batch_size <= 0:
            return 0.0
        return float(decode_features([batch_size], [kv_width_tokens])[0] @ self._decode_coef)

    def join_s(self, prompt_tokens: Sequence[int]) -> float:
        """Seconds for the ``[n, 1]`` forward joining rows with these prompt lengths."""
        if not len(prompt_tokens):
            return 0.0
        return self.decode_s_per_step + sum(self.decode_s_per_row + self.decode_s_per_kv_token * w
                                            for w in prompt_tokens)

    @property
    def _prefill_coef(self) -> np.ndarray:
        return np.array([self.prefill_s_per_chunk, self.prefill_s_per_token, self.prefill_s_per_pair])

    @property
    def _decode_coef(self) -> np.ndarray:
        return np.array([self.decode_s_per_step, self.decode_s_per_row, self.decode_s_per_kv_token])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CostModel":
        """Raises ValueError naming unknown keys."""
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"CostModel: unknown field(s) {sorted(unknown)}")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        """Write as indented JSON (diffable)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def text(self) -> str:
        """Deterministic multi-line form in microseconds."""
        us = lambda s: f"{s * 1e6:.4g} us"
        return "\n".join([
            f"cost model{f' ({self.label})' if self.label else ''}:",
            f"  prefill chunk: {us(self.prefill_s_per_chunk)} + {us(self.prefill_s_per_token)}/token"
            f" + {us(self.prefill_s_per_pair)}/attended pair",
            f"  decode step:   {us(self.decode_s_per_step)} + {us(self.decode_s_per_row)}/row"
            f" + {us(self.decode_s_per_kv_token)}/row/KV token",
        ])

    def __str__(self) -> str:
        return self.text()


def prefill_features(tokens: Iterable[int], start_tokens: Iterable[int]) -> np.ndarray:
    """``[N, 3]`` float64: ``1``, ``k``, causal pairs ``k * s + k * (k + 1) / 2``."""
    k = np.asarray(list(tokens), np.float64)
    s = np.asarray(list(start_tokens), np.float64)
    return np.stack([np.ones_like(k), k, k * s + k * (k + 1) / 2], axis=1)


def decode_features(batch_size: Iterable[int], kv_width_tokens: Iterable[int]) -> np.ndarray:
    """``[N, 3]`` float64: ``1``, ``B``, ``B * W``."""
    b = np.asarray(list(batch_size), np.float64)
    w = np.asarray(list(kv_width_tokens), np.float64)
    return np.stack([np.ones_like(b), b, b * w], axis=1)


def nonnegative_lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares ``X [N, F] @ c [F] ~ y [N]`` with ``c >= 0``: while a coefficient
    is negative, fix the most negative at 0 and refit the others (exact for the 3-feature
    fits here).

    Raises: ValueError when ``X`` has fewer rows than columns."""
    n, f = X.shape
    if n < f:
        raise ValueError(f"need at least {f} measurements to fit {f} coefficients, got {n}")
    active = list(range(f))
    coef = np.zeros(f)
    while active:
        coef = np.zeros(f)
        coef[active] = np.linalg.lstsq(X[:, active], y, rcond=None)[0]
        if coef.min() >= 0:
            return coef
        active.remove(int(np.argmin(coef)))
    return coef


def fit_cost_model(prefill: pd.DataFrame, decode: pd.DataFrame, label: str = "") -> CostModel:
    """Fit a :class:`CostModel` from measurements.

    Args:
        prefill: rows with ``PREFILL_COLUMNS`` (one chunk of one row each).
        decode: rows with ``DECODE_COLUMNS`` (one decode step each). Repeated
            configurations (same tokens and start, or same batch size and width) are
            reduced to their median time before fitting.

    Raises:
        ValueError: with fewer than 3 distinct configurations in either frame.
    """
    p = prefill.groupby(["tokens", "start_tokens"], as_index=False).time_s.median()
    d = decode.groupby(["batch_size", "kv_width_tokens"], as_index=False).time_s.median()
    pc = nonnegative_lstsq(prefill_features(p.tokens, p.start_tokens), p.time_s.to_numpy(float))
    dc = nonnegative_lstsq(decode_features(d.batch_size, d.kv_width_tokens), d.time_s.to_numpy(float))
    return CostModel(*map(float, pc), *map(float, dc), label=label)


def measure_costs(model: Any, tokenizer: Any, batch_sizes: Sequence[int] = (1, 2, 4, 8),
                  kv_widths_tokens: Sequence[int] = (32, 128, 512), chunk_tokens: Sequence[int] = (16, 64, 256),
                  prefill_context_tokens: int = 768, decode_steps: int = 6,
                  repeats: int = 3) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Measure prefill chunks and decode steps of ``model`` on this machine.

    Prefill: for each chunk size ``C``, one row's prompt of ``prefill_context_tokens``
    runs through :class:`~workbench.prefill.PrefillGroup` in chunks of ``C`` (each timed,
    at its start position). Decode: for each ``B`` and ``W``, ``B`` prompts of ``W``
    tokens are admitted into a :class:`~workbench.scheduler.Scheduler`, then
    ``decode_steps`` steps are timed after one warm-up step. Everything ``repeats`` times.

    Returns:
        ``(prefill [N, PREFILL_COLUMNS], decode [M, DECODE_COLUMNS])``, times in seconds.
    """
    prefill_rows, decode_rows = [], []
    for _ in range(repeats):
        _measure_prefill(model, tokenizer, chunk_tokens, prefill_context_tokens, prefill_rows)
        _measure_decode(model, tokenizer, batch_sizes, kv_widths_tokens, decode_steps, decode_rows)
    return (pd.DataFrame(prefill_rows, columns=PREFILL_COLUMNS), pd.DataFrame(decode_rows, columns=DECODE_COLUMNS))


def _measure_prefill(model, tokenizer, chunk_tokens, context_tokens, rows) -> None:
    for c in chunk_tokens:
        group = PrefillGroup(model, [prompt_of_length(tokenizer, context_tokens, 3 * c)], c)
        while not group.done:
            start = group.position
            t0 = time.perf_counter()
            k = group.run_chunk()[0]
            rows.append((k, start, time.perf_counter() - t0))


def _measure_decode(model, tokenizer, batch_sizes, kv_widths_tokens, decode_steps, rows) -> None:
    for b in batch_sizes:
        for w in kv_widths_tokens:
            sched = Scheduler(model, tokenizer, max_batch=b, prefill_step_size=max(kv_widths_tokens), history_size=0)
            for i in range(b):
                sched.submit(Request(prompt=prompt_of_length(tokenizer, w, 11 * i), max_tokens=decode_steps + 2,
                                     stop_ids=[]))
            sched.admit()
            sched.step()
            for _ in range(decode_steps):
                width = sched.snapshot().kv_width_tokens
                t0 = time.perf_counter()
                sched.step()
                rows.append((b, width, time.perf_counter() - t0))


def calibrate(model: Any, tokenizer: Any, label: str = "", **measure_kwargs: Any) -> CostModel:
    """:func:`measure_costs` then :func:`fit_cost_model`."""
    prefill, decode = measure_costs(model, tokenizer, **measure_kwargs)
    return fit_cost_model(prefill, decode, label=label)


class CostMeter:
    """Charges a replay's engine calls with a :class:`CostModel`.

    Tracks each uid's prefilled tokens, so a chunk's start position (for the pair term)
    comes from the events alone.
    """

    def __init__(self, cost: CostModel):
        self.cost = cost
        self._prefilled_tokens: dict[int, int] = {}

    def admit_s(self, events: Sequence[Event]) -> float:
        """Seconds for the ``prefill`` chunks and ``join`` s among the events of one
        ``admit()`` (other kinds cost nothing)."""
        total_s, joined = 0.0, []
        for e in events:
            if e.kind == "prefill":
                start = self._prefilled_tokens.get(e.uid, 0)
                total_s += self.cost.prefill_s(e.n_tokens, start)
                self._prefilled_tokens[e.uid] = start + e.n_tokens
            elif e.kind == "join":
                joined.append(e.n_tokens)
                self._prefilled_tokens.pop(e.uid, None)
        return total_s + self.cost.join_s(joined)

    def step_s(self, batch_size: int, kv_width_tokens: int) -> float:
        """Seconds for the next decode step (``CostModel.decode_s``)."""
        return self.cost.decode_s(batch_size, kv_width_tokens)
