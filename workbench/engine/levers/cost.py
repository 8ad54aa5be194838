"""The cost of the engine's forwards in seconds: a small linear model the engine can
plan with (the per-iteration time budget, :mod:`workbench.engine.levers.pacing`) and the
simulation replays with (:mod:`workbench.sim.costmodel`).

Model (seconds; every coefficient ``>= 0``)::

    prefill chunk of B rows x k tokens, after s cached tokens (pads included):
        prefill_s = p_chunk + B * (p_token * k + p_pair * (k * s + k * (k + 1) / 2))
                                                        └─ causal (query, key) pairs
    [B, 1] forward (a decode step, or a join feeding each joiner's last prompt token)
    at KV width W:
        decode_s  = d_step + d_row * B + d_kv * B * W
    packed [1, T] forward (layout="packed"): R decode rows, row r attending W_r keys,
    and prefill chunks c of k_c tokens after s_c (each request its own keys, no pads):
        packed_s  = max(d_step if R, p_chunk if any chunk) + d_row * R + d_kv * sum_r W_r
                    + sum_c (p_token * k_c + p_pair * (k_c * s_c + k_c * (k_c + 1) / 2))
                    └─ one forward's fixed cost (the weights read once), each token its own

Fitting the coefficients from measurements is :func:`nonnegative_lstsq`. Runs nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np


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

    def prefill_s(self, tokens: int, start_tokens: int = 0, rows: int = 1) -> float:
        """Seconds for a prefill chunk of ``rows`` x ``tokens`` after ``start_tokens``."""
        return float(prefill_features([rows], [tokens], [start_tokens])[0] @ self._prefill_coef)

    def decode_s(self, batch_size: int, kv_width_tokens: int) -> float:
        """Seconds for one decode step of ``batch_size`` rows at KV width; 0 for no rows."""
        if batch_size <= 0:
            return 0.0
        return float(decode_features([batch_size], [kv_width_tokens])[0] @ self._decode_coef)

    def packed_s(self, decode_kv_tokens: Sequence[int], prefill: Sequence[tuple[int, int]] = ()) -> float:
        """Seconds for one packed ``[1, T]`` forward of decode rows attending
        ``decode_kv_tokens`` keys each and prefill chunks ``(tokens, start_tokens)``."""
        fixed = max(
            self.decode_s_per_step if decode_kv_tokens else 0.0, self.prefill_s_per_chunk if prefill else 0.0
        )
        rows = (
            len(decode_kv_tokens) * self.decode_s_per_row + sum(decode_kv_tokens) * self.decode_s_per_kv_token
        )
        chunks = sum(self.prefill_s(k, s) - self.prefill_s_per_chunk for k, s in prefill)
        return fixed + rows + chunks

    @property
    def _prefill_coef(self) -> np.ndarray:
        return np.array([self.prefill_s_per_chunk, self.prefill_s_per_token, self.prefill_s_per_pair])

    @property
    def _decode_coef(self) -> np.ndarray:
        return np.array([self.decode_s_per_step, self.decode_s_per_row, self.decode_s_per_kv_token])

    def to_dict(self) -> dict[str, Any]:
        """The fitted coefficients (seconds, per token / per pair / per row) as a JSON-ready dict."""
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
        """Read a cost model written by ``save`` / ``scripts/calibrate_cost_model.py``.

        Raises:
            FileNotFoundError: for a missing file."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    def text(self) -> str:
        """Deterministic multi-line form in microseconds."""
        us = lambda s: f"{s * 1e6:.4g} us"
        return "\n".join(
            [
                f"cost model{f' ({self.label})' if self.label else ''}:",
                f"  prefill chunk: {us(self.prefill_s_per_chunk)} + {us(self.prefill_s_per_token)}/token"
                f" + {us(self.prefill_s_per_pair)}/attended pair",
                f"  decode step:   {us(self.decode_s_per_step)} + {us(self.decode_s_per_row)}/row"
                f" + {us(self.decode_s_per_kv_token)}/row/KV token",
            ]
        )

    def __str__(self) -> str:
        return self.text()


def prefill_features(rows: Iterable[int], tokens: Iterable[int], start_tokens: Iterable[int]) -> np.ndarray:
    """``[N, 3]`` float64: ``1``, ``B * k``, ``B *`` causal pairs ``(k * s + k * (k + 1) / 2)``."""
    b = np.asarray(list(rows), np.float64)
    k = np.asarray(list(tokens), np.float64)
    s = np.asarray(list(start_tokens), np.float64)
    return np.stack([np.ones_like(k), b * k, b * (k * s + k * (k + 1) / 2)], axis=1)


def decode_features(batch_size: Iterable[int], kv_width_tokens: Iterable[int]) -> np.ndarray:
    """``[N, 3]`` float64: ``1``, ``B``, ``B * W``."""
    b = np.asarray(list(batch_size), np.float64)
    w = np.asarray(list(kv_width_tokens), np.float64)
    return np.stack([np.ones_like(b), b, b * w], axis=1)


def nonnegative_lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares ``X [N, F] @ c [F] ~ y [N]`` with ``c >= 0`` (the most negative fixed at 0, refit).

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
