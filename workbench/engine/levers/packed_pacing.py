"""Pacing in the packed layout: each packed ``[1, T]`` forward's prefill tokens capped so
that its predicted time stays within the per-step time budget, beside the token budget
(``max_num_batched_tokens``).

Knows: :class:`~workbench.engine.levers.pacing.Pacing` and
:class:`~workbench.engine.levers.pacing.Pacer` (the options, the predictions log), the cost
of a packed forward (:meth:`~workbench.engine.levers.cost.CostModel.packed_s`), chunks
(:class:`workbench.observe.packed.Chunk`). Must not know: pages, the batch, events: the
scheduler hands :meth:`PackedPacer.choose` a planner ``tokens -> chunks`` (the packed plan at
that token budget) and reports each forward's measured seconds (:meth:`PackedPacer.observe`).

Sarathi-Serve sizes its token budget from the latency target (the most tokens per hybrid
batch whose iteration stays within the TBT SLO, profiled once); here it is chosen per
forward from a cost model corrected by this engine's own forwards::

    budget_s   = itl_target_s, or itl_target_steps x the predicted decode-only forward
                 (the forward's decode rows alone); inf when the forward has no decode row
    tokens     = the most T <= max_num_batched_tokens whose plan (decode tokens first, then
                 prefill chunks in row order) is predicted to take <= budget_s
    floor      = the decode rows + min_chunk_tokens: a forward with prefill waiting carries
                 at least that (over the budget when it must), so prefill always progresses

A prediction is the prior ``cost_model``'s ``packed_s`` scaled by the median measured /
predicted ratio of the latest forwards; without a prior, medians of this engine's own
latest forwards (:meth:`PackedPacer.measured_rates`)::

    forward_s  = D                       a forward without prefill
               = F + c x prefill tokens  a forward with prefill
    D          = median seconds of the latest forwards without prefill (decode rows only)
    c, F       = the Theil-Sen line through the latest forwards with prefill: c the median
                 slope over pairs of different prefill tokens, F the median intercept (>= D;
                 a mixed forward runs the general [1, T] path, dearer than decode rows alone)

else unknown (the forward runs the floor: a probe). Medians, not a least-squares fit of
every term: on a shared CPU a forward now and then takes several times its cost, which pulls
a fit's coefficients anywhere (``docs/packed.md``, "Pacing: a time budget per forward"), while
a median moves only when most forwards do; the budget only needs the two rates at the sizes
the engine runs. A forward's measured time runs from when it could start (when it was
planned, or for one built from unread tokens the read of the one before) to its tokens
read: what a running row waits between two tokens.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

from ...observe.packed import DECODE, Chunk
from .pacing import RECENT, SAMPLES, Pacer, Pacing

Plan = Callable[[int], Sequence[Chunk]]  # token budget -> the packed forward's chunks


def packed_features(chunks: Sequence[Chunk]) -> np.ndarray:
    """``[5]`` float64 of one packed forward: ``1``, decode rows ``R``, the keys they attend
    ``sum W_r`` (each ``end``), prefill tokens ``sum k_c``, causal pairs
    ``sum (k_c * s_c + k_c * (k_c + 1) / 2)`` (the terms of ``CostModel.packed_s``)."""
    decode = [c.end for c in chunks if c.kind == DECODE]
    prefill = [(c.n_tokens, c.start) for c in chunks if c.kind != DECODE]
    pairs = sum(k * s + k * (k + 1) / 2 for k, s in prefill)
    return np.array([1.0, len(decode), sum(decode), sum(k for k, _ in prefill), pairs], np.float64)


@dataclass(frozen=True)
class PacedForward:
    """The pacer's decision on one packed forward.

    Attributes:
        chunks: the forward's chunks. token_cap: most tokens the time budget let it carry
            (``<= max_num_batched_tokens``). predicted_s: its predicted seconds (``None``:
            nothing known yet). budget_s: the time budget (seconds; ``inf``: no decode row).
        started_s: clock seconds from which its time is measured.
    """

    chunks: tuple[Chunk, ...]
    token_cap: int
    predicted_s: float | None
    budget_s: float
    started_s: float

    @property
    def over_budget(self) -> bool:
        """Whether it is predicted (or unknown) to run past its budget (the progress floor)."""
        return self.predicted_s is None or self.predicted_s > self.budget_s


def theil_sen(points: Sequence[tuple[int, float]], base_s: float) -> tuple[float, float]:
    """``(c, F)``: the line ``seconds = F + c x tokens`` through ``points`` (``(prefill tokens,
    seconds)``, tokens ``>= 1``) by Theil-Sen: ``c`` the median slope over the pairs of
    different token counts (``>= 0``), ``F`` the median of ``seconds - c x tokens``. A few
    points far off the line (a forward the machine slowed) move neither median. With one
    token count only: ``c`` the median of ``(seconds - base_s) / tokens`` and ``F = base_s``.

    >>> c, fixed = theil_sen([(10, 0.003), (20, 0.005), (40, 0.009), (30, 0.5)], 0.002)
    >>> round(c, 6), round(fixed, 6)
    (0.0002, 0.001)
    """
    slopes = [(s2 - s1) / (k2 - k1) for (k1, s1), (k2, s2) in combinations(points, 2) if k1 != k2]
    if not slopes:
        return max(float(np.median([(s - base_s) / k for k, s in points])), 0.0), base_s
    c = max(float(np.median(slopes)), 0.0)
    return c, float(np.median([s - c * k for k, s in points]))


class PackedPacer(Pacer):
    """A :class:`Pacing`'s estimates for the packed layout: predicts packed forwards, learns
    from measured ones, and caps each forward's tokens (:meth:`choose`). Times are seconds of
    the scheduler's clock. mlx-lm has no counterpart (its ``BatchGenerator`` prefills a fixed
    ``prefill_step_size``); it plays the part of Sarathi-Serve's token budget derived from a
    latency target, chosen per forward, beside vLLM's ``max_num_batched_tokens``.

    Args:
        pacing: the options. token_budget: the scheduler's ``max_num_batched_tokens``
            (``config.token_budget``).

    Attributes:
        packed_samples: the latest ``SAMPLES`` measured forwards, ``(features [5], prior
            seconds or NaN, measured seconds)``. predictions: as :class:`Pacer`'s (kind
            ``"packed"``; :meth:`prediction_errors`).
    """

    def __init__(self, pacing: Pacing, token_budget: int):
        super().__init__(pacing, token_budget)
        self.token_budget = token_budget
        self.packed_samples: deque[tuple[np.ndarray, float, float]] = deque(maxlen=SAMPLES)
        self._rates: tuple[float, float, float] | None = None  # measured_rates, until a new measurement
        self._packed_ratio: float | None = None

    # -- predicting --------------------------------------------------------------------
    def forward_s(self, chunks: Sequence[Chunk]) -> float | None:
        """Predicted seconds of the packed forward of ``chunks`` (``0.0`` for none), or
        ``None`` while nothing is known (no prior, and no forward without prefill or none
        with prefill measured yet: :meth:`measured_rates`)."""
        if not chunks:
            return 0.0
        prior = self.pacing.cost_model
        if prior is not None:
            return self._prior_s(chunks) * self._ratio_now()
        rates = self.measured_rates()
        if rates is None:
            return None
        decode_s, fixed_s, token_s = rates
        prefill = sum(c.n_tokens for c in chunks if c.kind != DECODE)
        return fixed_s + token_s * prefill if prefill else decode_s

    def forward_budget_s(self, chunks: Sequence[Chunk]) -> float:
        """The time budget of the forward of ``chunks`` (seconds): ``itl_target_s``, or
        ``itl_target_steps`` x the predicted forward of its decode chunks alone (``nan``
        while that is unknown); ``inf`` when it has no decode chunk (no running row waits)."""
        decode = [c for c in chunks if c.kind == DECODE]
        if not decode:
            return math.inf
        if self.pacing.itl_target_s is not None:
            return self.pacing.itl_target_s
        step = self.forward_s(decode)
        return math.nan if step is None else self.pacing.itl_target_steps * step

    def choose(self, plan: Plan, full: Sequence[Chunk], now_s: float) -> PacedForward:
        """The forward to run: ``full`` (the plan at ``max_num_batched_tokens``) when it is
        predicted to fit its budget or carries no prefill, else ``plan(T)`` for the most
        tokens ``T`` predicted to fit (binary search: the plan's cost grows with ``T``),
        never fewer than the floor (decode rows + ``min_chunk_tokens``, at most the token
        budget). ``now_s``: clock seconds now (its time is measured from there)."""
        full = tuple(full)
        budget_s, predicted = self.forward_budget_s(full), self.forward_s(full)
        decode = sum(c.kind == DECODE for c in full)
        if decode == len(full) or math.isinf(budget_s) or (predicted is not None and predicted <= budget_s):
            return PacedForward(full, self.token_budget, predicted, budget_s, now_s)
        floor = min(decode + self.pacing.min_chunk_tokens, self.token_budget)
        lo, hi = floor, self.token_budget  # largest T >= floor whose plan fits (else the floor)
        if not math.isnan(budget_s) and predicted is not None:
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.forward_s(plan(mid)) <= budget_s:
                    lo = mid
                else:
                    hi = mid - 1
        chunks = tuple(plan(lo))
        return PacedForward(chunks, lo, self.forward_s(chunks), budget_s, now_s)

    @staticmethod
    def started(paced: PacedForward | None, read_s: float) -> PacedForward | None:
        """``paced`` (a forward built from unread tokens) measured from ``read_s`` at the
        earliest: the read of the forward before it, when its own evaluation starts."""
        return None if paced is None else replace(paced, started_s=max(paced.started_s, read_s))

    # -- learning ----------------------------------------------------------------------
    def observe(self, paced: PacedForward | None, read_s: float) -> None:
        """The forward ``paced`` stands for was read at ``read_s`` (clock seconds): learn its
        measured time, ``read_s - paced.started_s`` (ignored unless ``> 0``)."""
        if paced is None or not paced.chunks or read_s <= paced.started_s:
            return
        seconds = read_s - paced.started_s
        prior = self._prior_s(paced.chunks) if self.pacing.cost_model is not None else math.nan
        self._note("packed", paced.predicted_s, seconds, prior)
        self.packed_samples.append((packed_features(paced.chunks), prior, seconds))
        self._rates = self._packed_ratio = None

    def _prior_s(self, chunks: Sequence[Chunk]) -> float:
        decode = [c.end for c in chunks if c.kind == DECODE]
        return self.pacing.cost_model.packed_s(
            decode, [(c.n_tokens, c.start) for c in chunks if c.kind != DECODE]
        )

    def _ratio_now(self) -> float:
        """The prior's correction: median measured / prior over the latest ``RECENT``
        forwards (1 with none), computed once per new measurement."""
        if self._packed_ratio is None:
            pairs = [(p, s) for _, p, s in list(self.packed_samples)[-RECENT:]]
            self._packed_ratio = self._ratio(pairs)
        return self._packed_ratio

    def measured_rates(self) -> tuple[float, float, float] | None:
        """``(D, F, c)`` of the module docstring (seconds, seconds, seconds per prefill token;
        ``c >= 0``, ``F >= D``) from the latest ``RECENT`` measured forwards without prefill
        and the latest ``RECENT`` with, computed once per new measurement; ``None`` until one
        of each was measured."""
        if self._rates is None:
            samples = list(self.packed_samples)
            decode = [s for f, _, s in samples if f[3] == 0][-RECENT:]
            mixed = [(f[3], s) for f, _, s in samples if f[3] > 0][-RECENT:]
            if decode and mixed:
                d = float(np.median(decode))
                c, fixed = theil_sen(mixed, d)
                self._rates = (d, max(fixed, d), c)
        return self._rates

    def text(self) -> str:
        """One line: the predictions' basis (prior or learned) and the forwards measured."""
        basis = "prior cost model, corrected" if self.pacing.cost_model is not None else "learned online"
        return f"packed pacing ({basis}): {len(self.packed_samples)} packed forwards measured"
