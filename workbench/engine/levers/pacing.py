"""Pacing: plan each iteration against a time budget, so running rows' inter-token gaps
stay under a target while joiners still reach their first token quickly.

Knows: the cost of the engine's forwards (:class:`workbench.engine.levers.cost.CostModel`, and
what this engine measured), the shape of the next prefill chunk. Must not know: requests,
the queue, events (the scheduler asks; :class:`Pacer` answers and learns).

One *iteration* is ``admit(); step(); filter()``; its budget is *time*
(``docs/pacing.md``; design notes: ``docs/lab/engine-notes.md``)::

    target     = itl_target_s, or itl_target_steps x the predicted decode step (default 8)
    prefill    = target - predicted decode step      (inf while no row is running)
    chunk k    = the most tokens with predicted prefill_s(rows, k, start) <= what is left
    join       = run when its predicted [n, 1] forward still fits (or nothing ran yet)

The scheduler reports each paced ``admit()``::

    pacer.begin_iteration(now_s, step_index, rows, width_tokens)  # admit() starts
    pacer.observe_prefill(rows, tokens, start_tokens, seconds)    # each chunk it runs
    pacer.end_iteration(now_s)                                    # admit() returns
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .cost import CostModel, nonnegative_lstsq, prefill_features

SAMPLES = 64  # measured forwards kept for the online fit / correction
RECENT = 16  # of which the latest this many set the correction ratio
PREDICTIONS = 4096  # predictions kept, with what was then measured (prediction_errors)


@dataclass(frozen=True)
class Pacing:
    """Options of the per-iteration time budget (``Scheduler(pacing=Pacing(...))``).

    Args:
        itl_target_s: the running rows' inter-token gap to stay under (seconds), or
            ``None`` for ``itl_target_steps`` x the predicted decode step.
        itl_target_steps: the target as a multiple of the decode step (``> 1``; default 8).
        min_chunk_tokens: the smallest prefill chunk worth running (tokens, ``>= 1``);
            an iteration that has run nothing yet runs at least this much. In the packed
            layout (:mod:`workbench.engine.levers.packed_pacing`) a forward with prefill
            waiting carries at least this many prefill tokens, over its budget if it must.
        cost_model: a prior :class:`~workbench.engine.levers.cost.CostModel` for this model and
            machine (``workbench.CostModel.load(path)``), corrected by measurements; or
            ``None`` to learn the costs from this engine's own forwards.

    Raises:
        ValueError: naming the field, for a target ``<= 0``, ``itl_target_steps <= 1`` or
            ``min_chunk_tokens < 1``.
    """

    itl_target_s: float | None = None
    itl_target_steps: float = 8.0
    min_chunk_tokens: int = 16
    cost_model: CostModel | None = None

    def __post_init__(self) -> None:
        if self.itl_target_s is not None and not (
            isinstance(self.itl_target_s, (int, float)) and self.itl_target_s > 0
        ):
            raise ValueError(
                f"Pacing.itl_target_s must be a number of seconds > 0 or None, got {self.itl_target_s!r}"
            )
        if not (isinstance(self.itl_target_steps, (int, float)) and self.itl_target_steps > 1):
            raise ValueError(f"Pacing.itl_target_steps must be a number > 1, got {self.itl_target_steps!r}")
        if (
            isinstance(self.min_chunk_tokens, bool)
            or not isinstance(self.min_chunk_tokens, int)
            or self.min_chunk_tokens < 1
        ):
            raise ValueError(f"Pacing.min_chunk_tokens must be an int >= 1, got {self.min_chunk_tokens!r}")
        if self.cost_model is not None and not isinstance(self.cost_model, CostModel):
            raise ValueError(
                f"Pacing.cost_model must be a CostModel or None, got {type(self.cost_model).__name__}"
            )


def pacing_from(spec: Any) -> Pacing | None:
    """The :class:`Pacing` that ``Scheduler(pacing=spec)`` means, or ``None`` (off).

    ``spec`` is ``None``/``False`` (off), ``True`` (the defaults), a number (the target
    inter-token gap in seconds), or a :class:`Pacing` (returned as it is).

    Raises:
        ValueError: for anything else (naming ``pacing``)."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return Pacing()
    if isinstance(spec, Pacing):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        if not spec > 0:
            raise ValueError(
                f"pacing={spec!r}: a target in seconds must be > 0 (or pacing=True for "
                f"{Pacing().itl_target_steps:g} x the decode step)"
            )
        return Pacing(itl_target_s=float(spec))
    raise ValueError(f"pacing must be None, True, a target in seconds, or a Pacing, got {spec!r}")


@dataclass(frozen=True)
class Iteration:
    """The timing of one paced ``admit()`` (clock seconds): when it started and returned,
    and the seconds of prefill chunks it ran."""

    start_s: float
    end_s: float
    prefill_s: float

    def decode_since_s(self, now_s: float) -> float:
        """What a running row waited for besides prefill from this ``admit()`` to one
        starting at ``now_s``: from its end when it ran prefill, else from its start."""
        return now_s - (self.end_s if self.prefill_s else self.start_s)


class Pacer:
    """A :class:`Pacing`'s running estimates: predicts forwards, learns from measured ones,
    and keeps the timing of the scheduler's latest ``admit()`` (:meth:`begin_iteration`,
    :meth:`end_iteration`) to measure the decode time between two of them. Times are
    seconds of the scheduler's clock; chunks are ``[rows, tokens]`` forwards.

    Args:
        pacing: the options. prefill_step_size: the scheduler's (``config.prefill_step_size``):
            the longest chunk ever run, in tokens per row (activations stay bounded).

    Attributes:
        prefill_samples: the latest ``SAMPLES`` measured chunks, ``(rows, tokens,
            start_tokens, seconds)``. decode_samples: the latest measured iterations'
            non-prefill time, ``(rows, width_tokens, seconds)``. predictions: see
            :meth:`prediction_errors`. last_iteration: the latest paced ``admit()``'s
            :class:`Iteration`, or ``None``.
    """

    def __init__(self, pacing: Pacing, prefill_step_size: int):
        self.pacing, self.prefill_step_size = pacing, prefill_step_size
        self.prefill_samples: deque[tuple[int, int, int, float]] = deque(
            maxlen=SAMPLES
        )  # rows, tokens, start, s
        self.decode_samples: deque[tuple[int, int, float]] = deque(maxlen=SAMPLES)  # rows, width, s
        self._prefill_coef: np.ndarray | None = None
        self._ratios: dict[
            str, float
        ] = {}  # "prefill" / "decode": the prior's correction, until a new sample
        self.predictions: deque[tuple[str, float, float, float]] = deque(maxlen=PREDICTIONS)
        self.last_iteration: Iteration | None = None  # the latest admit() that returned
        self._step_index, self._start_s, self._prefill_s = 0, 0.0, 0.0  # the admit() in progress (or latest)

    # -- the scheduler's iterations ----------------------------------------------------
    def begin_iteration(self, now_s: float, step_index: int, rows: int, width_tokens: int) -> None:
        """A paced ``admit()`` starts at ``now_s`` (clock seconds) after ``step_index``
        decode steps, with ``rows`` running rows of at most ``width_tokens`` context.
        When exactly one step ran since the latest ``admit()`` returned, learns that
        iteration's non-prefill time (:meth:`observe_decode`). Waits for nothing."""
        last = self.last_iteration
        if last is not None and step_index == self._step_index + 1:
            self.observe_decode(rows, width_tokens, last.decode_since_s(now_s))
        self._step_index, self._start_s, self._prefill_s = step_index, now_s, 0.0

    def end_iteration(self, now_s: float) -> None:
        """The paced ``admit()`` begun last returns at ``now_s`` (clock seconds)."""
        self.last_iteration = Iteration(self._start_s, now_s, self._prefill_s)

    # -- learning ----------------------------------------------------------------------
    def observe_prefill(self, rows: int, tokens: int, start_tokens: int, seconds: float) -> None:
        """A measured prefill chunk of ``rows`` x ``tokens`` after ``start_tokens``
        (``seconds`` of clock time), run by the ``admit()`` in progress (its prefill time
        grows by ``seconds``)."""
        self._prefill_s += seconds
        if tokens > 0 and seconds > 0:
            prior = self.pacing.cost_model
            self._note(
                "prefill",
                self.prefill_s(rows, tokens, start_tokens),
                seconds,
                prior.prefill_s(tokens, start_tokens, rows) if prior is not None else math.nan,
            )
            self.prefill_samples.append((rows, tokens, start_tokens, seconds))
            self._prefill_coef = None
            self._ratios.pop("prefill", None)

    def observe_decode(self, rows: int, width_tokens: int, seconds: float) -> None:
        """A measured iteration's non-prefill time: ``seconds`` with ``rows`` running rows
        whose widest context is ``width_tokens`` (the ``[rows, 1]`` step, the filter and
        the driver's work between two ``admit()`` calls). Ignored unless ``rows > 0`` and
        ``seconds > 0``."""
        if rows > 0 and seconds > 0:
            prior = self.pacing.cost_model
            self._note(
                "decode",
                self.decode_s(rows, width_tokens) if self.decode_samples or prior else None,
                seconds,
                prior.decode_s(rows, width_tokens) if prior is not None else math.nan,
            )
            self.decode_samples.append((rows, width_tokens, seconds))
            self._ratios.pop("decode", None)

    def _note(self, kind: str, predicted_s: float | None, measured_s: float, prior_s: float) -> None:
        if predicted_s is not None:
            self.predictions.append((kind, predicted_s, measured_s, prior_s))

    def prediction_errors(self) -> pd.DataFrame:
        """Every prediction the pacer made before measuring the forward it predicted:
        ``kind`` (``prefill`` chunk / ``decode`` iteration), ``predicted_s`` (what it
        planned with), ``measured_s``, ``prior_s`` (the uncorrected prior cost model's,
        NaN without one) and the relative errors ``error`` and ``prior_error``
        (predicted / measured - 1: negative is optimistic). The latest ``PREDICTIONS``."""
        frame = pd.DataFrame(list(self.predictions), columns=["kind", "predicted_s", "measured_s", "prior_s"])
        return frame.assign(
            error=frame.predicted_s / frame.measured_s - 1, prior_error=frame.prior_s / frame.measured_s - 1
        )

    # -- predicting --------------------------------------------------------------------
    def decode_s(self, rows: int, width_tokens: int) -> float:
        """Predicted non-prefill seconds of an iteration with ``rows`` running rows (a
        ``[rows, 1]`` step) at a widest context of ``width_tokens``: the prior's, scaled by
        the latest measured / predicted ratio, or without a prior the median of the latest
        measured iterations (``0.0`` before any, and for ``rows <= 0``). Also what a join
        of ``rows`` rows is predicted to cost (its ``[rows, 1]`` forward)."""
        if rows <= 0:
            return 0.0
        prior = self.pacing.cost_model
        if prior is None:
            recent = [s for *_, s in list(self.decode_samples)[-RECENT:]]
            return float(np.median(recent)) if recent else 0.0
        return prior.decode_s(rows, width_tokens) * self._prior_ratio("decode")

    def prefill_s(self, rows: int, tokens: int, start_tokens: int) -> float | None:
        """Predicted seconds of a ``[rows, tokens]`` prefill chunk whose rows already hold
        ``start_tokens`` cached tokens, or ``None`` while nothing is known (no prior and no
        chunk measured yet). ``tokens = 0`` gives the forward's fixed part."""
        prior = self.pacing.cost_model
        if prior is not None:
            return prior.prefill_s(tokens, start_tokens, rows) * self._prior_ratio("prefill")
        coef = self._fit_prefill()
        if coef is None:
            return None
        return float(prefill_features([rows], [tokens], [start_tokens])[0] @ coef)

    def target_s(self, rows: int, width_tokens: int) -> float:
        """The inter-token gap to stay under (seconds): ``itl_target_s``, or
        ``itl_target_steps`` x :meth:`decode_s` ``(rows, width_tokens)``."""
        if self.pacing.itl_target_s is not None:
            return self.pacing.itl_target_s
        return self.pacing.itl_target_steps * self.decode_s(rows, width_tokens)

    def prefill_budget_s(self, rows: int, width_tokens: int) -> float:
        """Seconds of prefill (and joins) this iteration may run: ``inf`` with no running
        row, else target - predicted decode step (may be ``<= 0``)."""
        if rows <= 0:
            return math.inf
        return self.target_s(rows, width_tokens) - self.decode_s(rows, width_tokens)

    def chunk_tokens(
        self, budget_s: float, rows: int, start_tokens: int, remaining_tokens: int, first: bool
    ) -> int:
        """The chunk to run now, in tokens per row (``0``: none): the most tokens, up to
        ``remaining_tokens`` and the chunk cap, whose ``[rows, k]`` forward after
        ``start_tokens`` cached tokens is predicted to fit ``budget_s`` seconds (a power of
        two, or all ``remaining_tokens``) — unless that is shorter than an *efficient*
        chunk (:meth:`efficient_tokens`, at least ``min_chunk_tokens``): then none, or,
        when ``first`` (nothing ran this iteration), the efficient chunk itself, over the
        budget. With ``budget_s`` infinite (no running row): ``remaining_tokens`` up to the
        cap; before any cost is known: a ``min_chunk_tokens`` probe when ``first``, else none."""
        cap = min(remaining_tokens, self.prefill_step_size)
        if cap <= 0 or math.isinf(budget_s):
            return max(cap, 0)
        if self.prefill_s(rows, 1, start_tokens) is None:  # nothing learned yet: a probe chunk
            return min(cap, self.pacing.min_chunk_tokens) if first else 0
        lo, hi = 0, cap  # largest k with prefill_s(k) <= budget (monotone in k)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.prefill_s(rows, mid, start_tokens) <= budget_s:
                lo = mid
            else:
                hi = mid - 1
        efficient = min(
            cap, _bucket_up(max(self.efficient_tokens(rows, start_tokens), self.pacing.min_chunk_tokens))
        )
        if lo >= efficient:
            return lo if lo == cap else _bucket_down(lo)
        return efficient if first else 0

    def efficient_tokens(self, rows: int, start_tokens: int) -> int:
        """The shortest chunk (tokens per row) whose ``[rows, k]`` forward's per-token time
        is at least its fixed time (a forward's launch and weight read:
        ``prefill_s(rows, 0, start_tokens)``), up to the chunk cap; ``min_chunk_tokens``
        before any cost is known."""
        fixed = self.prefill_s(rows, 0, start_tokens)
        if fixed is None:
            return self.pacing.min_chunk_tokens
        lo, hi = 1, self.prefill_step_size
        while lo < hi:
            mid = (lo + hi) // 2
            if self.prefill_s(rows, mid, start_tokens) >= 2 * fixed:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _fit_prefill(self) -> np.ndarray | None:
        if self._prefill_coef is None:
            samples = list(self.prefill_samples)
            if len({(b, k) for b, k, _, _ in samples}) < 2 or len(samples) < 3:
                if not samples:
                    return None
                # one shape seen: a forward costs at least what a decode step costs (its
                # weights are read once either way); the rest is per token
                b, k, _, s = samples[-1]
                fixed = min(self.decode_s(1, 0), 0.9 * s)
                return np.array([fixed, (s - fixed) / (b * k), 0.0])
            rows, tokens, starts, secs = map(np.array, zip(*samples))
            self._prefill_coef = nonnegative_lstsq(prefill_features(rows, tokens, starts), secs.astype(float))
        return self._prefill_coef

    def _prior_ratio(self, kind: str) -> float:
        """The prior's correction for ``kind`` (``prefill`` / ``decode``): :meth:`_ratio`
        over the latest ``RECENT`` samples, computed once per new sample."""
        ratio = self._ratios.get(kind)
        if ratio is None:
            prior = self.pacing.cost_model
            if kind == "prefill":
                pairs = [
                    (prior.prefill_s(k, s0, b), s) for b, k, s0, s in list(self.prefill_samples)[-RECENT:]
                ]
            else:
                pairs = [(prior.decode_s(b, w), s) for b, w, s in list(self.decode_samples)[-RECENT:]]
            ratio = self._ratios[kind] = self._ratio(pairs)
        return ratio

    @staticmethod
    def _ratio(pairs: list[tuple[float, float]]) -> float:
        """Median measured / predicted over the latest ``RECENT`` pairs (1 with none)."""
        ratios = [s / p for p, s in pairs[-RECENT:] if p > 0]
        return float(np.median(ratios)) if ratios else 1.0

    def text(self) -> str:
        """One line: the predictions' basis (prior or learned) and the measured prefill
        chunks and decode iterations kept."""
        basis = "prior cost model, corrected" if self.pacing.cost_model is not None else "learned online"
        return (
            f"pacing ({basis}): {len(self.prefill_samples)} prefill and {len(self.decode_samples)} "
            f"decode measurements"
        )


def _bucket_down(tokens: int) -> int:
    """The largest power of two ``<= tokens``: chunk lengths from a small set of shapes,
    so a backend that compiles kernels per shape (MLX on CUDA) compiles each once."""
    return 1 << (max(1, tokens).bit_length() - 1)


def _bucket_up(tokens: int) -> int:
    """The smallest power of two ``>= tokens``."""
    return 1 << (max(1, tokens) - 1).bit_length()
