"""First divergence, localised to a layer: where in the model batching changed a row's
numbers.

Knows: :mod:`workbench.verify.rerun` (one decode forward re-run in its batch and alone,
every layer recorded), the solo oracle (:mod:`workbench.verify.oracle`, to find the first
suspect token), a scheduler's public checkpoints (``Scheduler.checkpoint()``,
``history.checkpoint(i)``). Must not know: how the engine runs a step beyond what
:mod:`~workbench.verify.rerun` mirrors.

The oracle says "row r differs at token t"; :func:`localize` says where. It re-runs the
forward that computed token ``t`` batched and alone and compares, layer by layer, the
row's two records (:class:`~workbench.verify.rerun.StepRecord`):

- the layer's output at the fed position ``P`` (``|Δ|`` over ``hidden``), and
- the layer's KV cache over the row's real positions ``0 .. P`` (never its padding): keys
  and values written by earlier steps (a difference there was made before this step) and
  by this one (position ``P``).

A layer is *over tolerance* where ``|Δ| > rtol * max|reference|`` for its output or its
cache (each scaled by the solo side's largest magnitude in that layer). ``rtol`` defaults
to :data:`DEFAULT_RTOL`, 11 times the largest float32 noise measured between correct
batched and solo runs of the six bundled models (:data:`MEASURED_NOISE`: 9.1e-6 on an H200
with full float32 matmuls; on the CPU 5.6e-6 with OpenBLAS, 2.0e-6 with MLX's own matmuls,
where five of the six agree bit for bit; ``scripts/lab/layer_noise.py``,
``docs/divergence.md``). TF32 matmuls (5e-4 to 1e-2) are over it at layer 0: a cause found,
not noise.

Worked example (4 layers, the fed token at ``P = 9``, a fault in layer 2's batched
output for this row)::

    layer  max|Δ| out  tol out   max|Δ| kv  over  first position
    0      3e-7        1e-4·|h0|  2e-7       no    -
    1      4e-7        ...        3e-7       no    -
    2      8e-2        ...        3e-7       yes   9      <- first layer, this step's token
    3      9e-2        ...        5e-2       yes   9         (layer 3's K/V at 9: its input changed)

Axis letters as in :mod:`workbench.verify.rerun`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..engine.checkpoint import Checkpoint
from .oracle import DEFAULT_ATOL, ref_request, scheduler_trace, solo_reference
from .rerun import BatchedStep, StepRecord, batched_step, solo_step

# largest relative |Δ| of a correct batch: bundled models, float32, CPU and GPU (scripts/lab/layer_noise.py)
MEASURED_NOISE = 9.1e-6
# 11x MEASURED_NOISE; the planted faults and bf16 are 29x to 7,900x over it (scripts/lab/layer_noise.py)
DEFAULT_RTOL = 1e-4
COLUMNS = [
    "layer",
    "max_abs_delta",
    "mean_abs_delta",
    "tolerance",
    "kv_max_abs_delta",
    "kv_tolerance",
    "over",
    "first_position",
    "n_positions_over",
    "positions",
]


def layer_table(
    batched: StepRecord, solo: StepRecord, position: int, rtol: float = DEFAULT_RTOL
) -> pd.DataFrame:
    """Δ per layer between the batched and the solo record of one row's forward.

    Args:
        batched, solo: the two records (same model: ``[n_layers, hidden]`` outputs, per
            layer ``[T, K]`` caches with ``T = position + 1``).
        position: ``P``, the fed token's position (the outputs' position).
        rtol: relative tolerance (of each layer's largest solo magnitude).

    Returns:
        One row per layer, columns :data:`COLUMNS`: ``max_abs_delta`` / ``mean_abs_delta``
        of the output at ``P``; ``tolerance`` (absolute, for the output); ``kv_max_abs_delta``
        over the cache's real positions and ``kv_tolerance`` (NaN where the cache is not
        compared); ``over`` (bool); ``first_position`` (the first position over tolerance,
        ``<NA>`` if none; ``P`` when only the output is), ``n_positions_over`` and
        ``positions`` (a tuple of them, ascending).

    Raises:
        ValueError: when the records' shapes differ (not the same model).
    """
    if batched.hidden.shape != solo.hidden.shape:
        raise ValueError(f"records of different models: hidden {batched.hidden.shape} vs {solo.hidden.shape}")
    rows = []
    for i, (hb, hs) in enumerate(zip(batched.hidden, solo.hidden)):
        delta = np.abs(hb - hs)  # [hidden]
        tol = rtol * float(np.abs(hs).max())
        kv_delta, kv_tol, over_kv = _kv_over(batched.kv[i], solo.kv[i], rtol)
        over_out = bool(delta.max() > tol)
        positions = sorted(set(over_kv) | ({position} if over_out else set()))
        rows.append(
            {
                "layer": i,
                "max_abs_delta": float(delta.max()),
                "mean_abs_delta": float(delta.mean()),
                "tolerance": tol,
                "kv_max_abs_delta": kv_delta,
                "kv_tolerance": kv_tol,
                "over": bool(positions),
                "first_position": positions[0] if positions else pd.NA,
                "n_positions_over": len(positions),
                "positions": tuple(positions),
            }
        )
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["first_position"] = table["first_position"].astype("Int64")
    return table


def _kv_over(kb: np.ndarray | None, ks: np.ndarray | None, rtol: float) -> tuple[float, float, list[int]]:
    """``(max |Δ|, tolerance, positions over it)`` of one layer's caches ``[T, K]``
    (NaN, NaN, none when a side is missing). Caches of different lengths are compared on
    the positions both hold; the positions only one holds are over, and ``max |Δ|`` is
    ``inf`` (the batch cache holds more or fewer tokens than the row has: a bug)."""
    if kb is None or ks is None:
        return float("nan"), float("nan"), []
    T = min(len(kb), len(ks))
    per_position = np.abs(kb[:T] - ks[:T]).max(axis=1, initial=0.0)  # [T]
    tol = rtol * float(np.abs(ks).max(initial=0.0))
    over = [int(p) for p in np.flatnonzero(per_position > tol)] + list(range(T, max(len(kb), len(ks))))
    worst = float(per_position.max(initial=0.0)) if len(kb) == len(ks) else float("inf")
    return worst, tol, over


@dataclass(frozen=True)
class LayerDivergence:
    """Where one row's forward differs between its batch and alone.

    Attributes:
        uid: the request. row: its row in the batch. batch_size: rows in the forward.
        step: the decode step index of the forward (the checkpoint's ``step``).
        token_index: the token whose distribution the forward computes (``n + 1`` for a
            row with ``n`` read tokens).
        position: ``P``, the fed token's position in the row (RoPE position).
        left_padding: the row's left padding in the batch cache (positions).
        fed_token: the token fed. rtol: the relative tolerance used.
        table: :func:`layer_table`'s per-layer Δ.
        logprob_max_abs_delta: ``max |Δ|`` of the final log-probabilities ``[V]`` (nats).
        batched_argmax, solo_argmax: each side's most likely next token.
    """

    uid: int
    row: int
    batch_size: int
    step: int
    token_index: int
    position: int
    left_padding: int
    fed_token: int
    rtol: float
    table: pd.DataFrame
    logprob_max_abs_delta: float
    batched_argmax: int
    solo_argmax: int

    @property
    def first_layer(self) -> int | None:
        """The first layer over tolerance, or ``None`` when every layer agrees."""
        over = self.table.loc[self.table["over"], "layer"]
        return int(over.iloc[0]) if len(over) else None

    @property
    def positions(self) -> list[int]:
        """The positions over tolerance at :attr:`first_layer` (``[]`` when none): the
        fed position ``P`` alone for a fault of this step; earlier positions when the
        cache was already different before it."""
        layer = self.first_layer
        return [] if layer is None else list(self.table.iloc[layer]["positions"])

    @property
    def ok(self) -> bool:
        """True when no layer is over tolerance."""
        return self.first_layer is None

    @property
    def relative_delta(self) -> float:
        """The largest ``max|Δ| / max|reference|`` of any layer's output or cache (the
        quantity :attr:`rtol` bounds): about 1e-6 for a correct float32 batch."""
        t = self.table
        ratios = pd.concat([t["max_abs_delta"] / t["tolerance"], t["kv_max_abs_delta"] / t["kv_tolerance"]])
        return float(ratios.max(skipna=True)) * self.rtol

    def text(self) -> str:
        """One line for humans: the verdict, the first layer and its positions."""
        head = (
            f"uid {self.uid} (row {self.row} of {self.batch_size}, left padding {self.left_padding}), "
            f"step {self.step}, token {self.token_index} (fed at position {self.position})"
        )
        if self.ok:
            return (
                f"{head}: every layer within tolerance (rtol {self.rtol:.0e}), "
                f"max |dlogprob| {self.logprob_max_abs_delta:.1e}"
            )
        t = self.table.iloc[self.first_layer]
        where = (
            "this step's token only"
            if self.positions == [self.position]
            else "its cache differs, written by earlier steps: localize an earlier token"
        )
        return (
            f"{head}: first over tolerance at layer {self.first_layer} "
            f"(output max |d| {t['max_abs_delta']:.2e}, tolerance {t['tolerance']:.2e}), "
            f"positions {ranges(self.positions)} ({where}); next token batched {self.batched_argmax}, "
            f"alone {self.solo_argmax}"
        )


def ranges(positions: list[int]) -> str:
    """Compact text of sorted ints: ``[3, 4, 5, 9]`` -> ``"3-5, 9"``.

    >>> ranges([3, 4, 5, 9]), ranges([]), ranges([7])
    ('3-5, 9', '-', '7')
    """
    if not positions:
        return "-"
    parts, start = [], positions[0]
    for prev, cur in zip(positions, positions[1:] + [None]):
        if cur != prev + 1 if cur is not None else True:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(parts)


def checkpoint_before_token(sched: Any, uid: int, token_index: int) -> Checkpoint:
    """The checkpoint just before the step whose forward computed ``uid``'s token
    ``token_index``: the latest one kept with the history (``Scheduler(history_checkpoints=N)``)
    at which the row had read ``token_index - 1`` tokens.

    Raises:
        ValueError: for ``token_index < 1`` (token 0 comes from the join forward, not a
            decode step), or when no kept checkpoint has the row at that point (keep more
            with ``history_checkpoints``, or take one with ``sched.checkpoint()`` before
            the step).
    """
    if token_index < 1:
        raise ValueError(
            f"token {token_index}: a row's first token comes from its join forward, not a "
            "decode step; localize token 1: what the prefill and the join wrote differently "
            "shows there in the caches at the prompt's positions"
        )
    for i in range(len(sched.history) - 1, -1, -1):
        cp = sched.history.checkpoint(i)
        rows = {r.uid: r for r in cp.state.batch.rows} if cp is not None else {}
        if uid in rows and len(rows[uid].tokens) == token_index - 1:
            return cp
    raise ValueError(
        f"no kept checkpoint has uid {uid} running with {token_index - 1} tokens read "
        f"(scheduler history_checkpoints={sched.config.history_checkpoints}); keep more, or pass "
        "checkpoint=sched.checkpoint() taken before that step"
    )


def localize(
    sched: Any,
    uid: int,
    *,
    token: int | None = None,
    checkpoint: Checkpoint | None = None,
    rtol: float = DEFAULT_RTOL,
    reference_model: Any = None,
) -> LayerDivergence:
    """Re-run one decode forward of row ``uid`` batched and alone, every layer recorded,
    and say where they first differ (:class:`LayerDivergence`; ``.table`` per layer).

    Which forward: the one computing token ``token`` (found with
    :func:`checkpoint_before_token`), else the next ``step()``'s from ``checkpoint``,
    else from the scheduler's state now. Nothing in the scheduler or the checkpoint
    changes.

    Args:
        sched: the :class:`~workbench.engine.scheduler.Scheduler` (its ``model``,
            ``prefill_step_size``, ``max_kv_size`` and checkpoints are used).
        uid: a request holding a row of the batch at that point.
        token: the token index to explain (e.g. ``RowResult.first_divergence_step``, or
            :func:`first_suspect_token`); needs ``Scheduler(history_checkpoints=N)``.
        checkpoint: a checkpoint taken before the step to re-run, by ``sched`` or by any
            scheduler on the same model object (a fork's, its parent's).
        rtol: relative tolerance per layer (default :data:`DEFAULT_RTOL`).
        reference_model: the model of the solo side (default ``sched.model``), e.g. the
            float32 model when the scheduler runs a bf16 copy of it.

    Raises:
        ValueError: for both ``token`` and ``checkpoint``, a checkpoint on another model
            (or not a checkpoint), a uid without a row there, or as
            :func:`checkpoint_before_token`.
    """
    if token is not None and checkpoint is not None:
        raise ValueError("give token or checkpoint, not both")
    if token is not None:
        checkpoint = checkpoint_before_token(sched, uid, token)
    elif checkpoint is None:
        checkpoint = sched.checkpoint()
    if not isinstance(checkpoint, Checkpoint) or checkpoint.model_id != id(sched.model):
        raise ValueError(
            "checkpoint must be a Checkpoint taken on this scheduler's model (by it, or by a "
            "scheduler it was forked from or that was forked from it)"
        )
    state = next((r for r in checkpoint.state.batch.rows if r.uid == uid), None)
    batched = batched_step(sched.model, checkpoint, uid)
    prompt, tokens = list(state.valid.prompt_ids), list(state.tokens)
    solo = solo_step(
        reference_model or sched.model,
        prompt,
        tokens,
        batched.fed_token,
        sched.config.prefill_step_size,
        sched.config.max_kv_size,
    )
    return _report(uid, checkpoint.step, len(tokens) + 1, len(prompt) + len(tokens), batched, solo, rtol)


def _report(
    uid: int, step: int, token_index: int, position: int, batched: BatchedStep, solo: StepRecord, rtol: float
) -> LayerDivergence:
    rec = batched.record
    return LayerDivergence(
        uid=uid,
        row=batched.row,
        batch_size=batched.batch_size,
        step=step,
        token_index=token_index,
        position=position,
        left_padding=batched.left_padding,
        fed_token=batched.fed_token,
        rtol=rtol,
        table=layer_table(rec, solo, position, rtol),
        logprob_max_abs_delta=float(np.abs(rec.logprobs - solo.logprobs).max()),
        batched_argmax=int(rec.logprobs.argmax()),
        solo_argmax=int(solo.logprobs.argmax()),
    )


def first_suspect_token(sched: Any, uid: int, atol: float = DEFAULT_ATOL) -> int | None:
    """The first token of ``uid`` that differs from the solo oracle (mlx-lm's
    ``generate_step`` alone, :func:`~workbench.verify.oracle.solo_reference`): its token
    differs, or its log-probability by more than ``atol`` (nats). ``None`` when every
    token agrees. The row's tokens so far are compared (finished or not; greedy rows).

    Raises:
        ValueError: for an unknown uid (as ``sched.tokens``).
    """
    ours = scheduler_trace(sched, uid)
    ref = solo_reference(
        sched.model,
        ref_request(sched.request_of(uid)),
        sched.config.prefill_step_size,
        sched.config.max_kv_size,
    )
    for t, (a, b) in enumerate(zip(ours.tokens, ref.tokens)):
        if a != b or abs(ours.logprobs[t] - ref.logprobs[t]) > atol:
            return t
    return None
