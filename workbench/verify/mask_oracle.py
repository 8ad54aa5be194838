"""Mask oracle: record the masks a model's layers actually receive during a decode step,
and compare them with a snapshot's per-group masks.

Knows: how mlx-lm model modules build masks (they call ``scaled_dot_product_attention``
with the mask of each attention layer, and ``create_ssm_mask`` for recurrent layers, both
imported by name into the model's module). Must not know: the scheduler's internals
beyond ``Scheduler.batch_cache``.

Usage::

    snap, caches = sched.snapshot(), sched.batch_cache
    with recorded_masks(model) as seen:
        sched.step()
    assert mismatches(snap, seen, caches) == []

or, the same through the scheduler's public calls only::

    assert checked_step(sched).ok                   # one decode step
    assert all(c.ok for c in run_checked(sched))    # admit / step / filter until idle
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.kv import caches as kv
from ..observe.forward_masks import ForwardMask, causal_mask
from ..observe.snapshot import Snapshot


@dataclass(frozen=True)
class SeenMask:
    """One mask a layer received: the layer's cache object id and the mask, ``[B, S]``
    bool at a decode step (``None`` when the model passed no mask), ``[B, N, S]`` at a
    prefill forward (``recorded_masks(prefill=True)``)."""

    cache_id: int
    mask: np.ndarray | None


@contextmanager
def recorded_masks(model: Any, prefill: bool = False) -> Iterator[list[SeenMask]]:
    """Within the block, record every single-token (decode) mask the model's layers get,
    or with ``prefill=True`` every multi-token (prefill) mask, as ``[B, N, S]`` bool
    (mlx-lm's ``"causal"`` written out as :func:`~workbench.observe.forward_masks.causal_mask`).

    Patches the model module's ``scaled_dot_product_attention`` and ``create_ssm_mask``
    (restored on exit).

    Raises:
        ValueError: if the model's module has neither function (unknown architecture).
    """
    module = sys.modules[type(model).__module__]
    seen: list[SeenMask] = []
    originals = {}

    def as_rows(mask, B):
        return None if mask is None or isinstance(mask, str) else np.array(mask).reshape(B, -1)

    def as_queries_by_keys(mask, B, N, S):
        if mask is None:
            return np.ones((B, N, S), bool)
        if isinstance(mask, str):  # "causal": the queries are the last N of the S keys
            return np.repeat(causal_mask(N, S - N), B, axis=0)
        return np.broadcast_to(np.array(mask), (B, 1, N, S)).reshape(B, N, S).astype(bool)

    if hasattr(module, "scaled_dot_product_attention"):
        sdpa = originals["scaled_dot_product_attention"] = module.scaled_dot_product_attention

        def recording_sdpa(queries, keys, values, cache, scale, mask, **kw):
            B, _, N, _ = queries.shape  # [B, n_heads, N, head_dim]; N == 1: a decode step
            if N == 1 and not prefill:
                seen.append(SeenMask(id(cache), as_rows(mask, B)))
            elif N > 1 and prefill:  # keys: [B, n_kv_heads, S, head_dim]
                seen.append(SeenMask(id(cache), as_queries_by_keys(mask, B, N, keys.shape[2])))
            return sdpa(queries, keys, values, cache=cache, scale=scale, mask=mask, **kw)

        module.scaled_dot_product_attention = recording_sdpa
    if hasattr(module, "create_ssm_mask") and not prefill:
        ssm_mask = originals["create_ssm_mask"] = module.create_ssm_mask

        def recording_ssm_mask(h, cache=None):
            mask = ssm_mask(h, cache)
            if h.shape[1] == 1:  # h: [B, 1, hidden]
                seen.append(SeenMask(id(cache), as_rows(mask, h.shape[0])))
            return mask

        module.create_ssm_mask = recording_ssm_mask
    if not originals:
        raise ValueError(
            f"{module.__name__} has no scaled_dot_product_attention or create_ssm_mask to record"
        )
    try:
        yield seen
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


def mismatches(snap: Snapshot, seen: list[SeenMask], caches: list[Any]) -> list[str]:
    """Compare each recorded mask with the snapshot's mask of the layer's group.

    Args:
        snap: taken just before the step.
        seen: what :func:`recorded_masks` recorded during that step.
        caches: the batch cache during the step (``Scheduler.batch_cache``).

    Returns:
        One message per disagreement (empty when all agree). A ``None`` mask counts as
        all-True; an ``ssm`` mask is compared with the group's ``[B, 1]`` mask.
    """
    group_of = {id(c): name for name, layers in kv.layer_groups(caches).items() for _, c in layers}
    problems = []
    for i, s in enumerate(seen):
        name = group_of.get(s.cache_id)
        if name is None:
            problems.append(f"call {i}: a cache that is not in the batch cache")
            continue
        expected = snap.group(name).mask
        got = np.ones_like(expected) if s.mask is None else s.mask
        if got.shape != expected.shape or not np.array_equal(got, expected):
            problems.append(
                f"call {i} [{name}]: model saw {got.astype(int).tolist()}, "
                f"snapshot has {expected.astype(int).tolist()}"
            )
    return problems


def prefill_mismatches(forwards: list[ForwardMask], seen: list[SeenMask]) -> list[str]:
    """Compare the prefill masks the layers received (:func:`recorded_masks` with
    ``prefill=True``, one per attention layer and forward) with ``forwards``, the same
    forwards as :func:`~workbench.observe.forward_masks.prefill_forwards` reads them from
    the event log, in order. Returns one message per disagreement (empty when all agree)."""
    if not forwards:
        return [f"{len(seen)} prefill masks recorded but no prefill forward in the log"] if seen else []
    per_forward, extra = divmod(len(seen), len(forwards))
    if extra or not per_forward:
        return [f"{len(seen)} prefill masks recorded for {len(forwards)} forwards"]
    problems = []
    for i, s in enumerate(seen):
        f = forwards[i // per_forward]
        if s.mask.shape != f.mask.shape or not np.array_equal(s.mask, f.mask):
            problems.append(
                f"call {i} [{f.label}]: model saw shape {s.mask.shape}, the view has {f.mask.shape}"
                + ("" if s.mask.shape != f.mask.shape else " with other cells")
            )
    return problems


@dataclass(frozen=True)
class StepCheck:
    """One decode step checked by the mask oracle.

    Attributes:
        snapshot: the batch as the step saw it (taken just before it).
        n_masks: how many masks the layers received during the step (one per attention
            layer, one per forward for the recurrent layers).
        problems: :func:`mismatches`' messages, one per disagreement; empty when every
            mask equals the snapshot's.
    """

    snapshot: Snapshot
    n_masks: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        """True when every recorded mask equals the snapshot's."""
        return not self.problems


def checked_step(sched: Any) -> StepCheck:
    """``sched.step()`` under the mask oracle: snapshot, record the masks the layers
    receive during the step (:func:`recorded_masks`), compare (:func:`mismatches`).

    Args:
        sched: a :class:`~workbench.engine.scheduler.Scheduler` with running rows (its
            ``model``, ``batch_cache``, ``snapshot()`` and ``step()`` are used).

    Raises:
        ValueError: when the model's module records no masks (see :func:`recorded_masks`);
            whatever ``step()`` raises.
    """
    return _checked_step(sched, sched.snapshot())


def _checked_step(sched: Any, snap: Snapshot) -> StepCheck:
    caches = sched.batch_cache
    with recorded_masks(sched.model) as seen:
        sched.step()
    return StepCheck(snap, len(seen), mismatches(snap, seen, caches))


def run_checked(sched: Any) -> list[StepCheck]:
    """Drive ``admit(); step(); filter()`` until ``sched`` is idle, every step a
    :func:`checked_step`. A call whose ``admit()`` leaves no running row (a prompt still
    prefilling in chunks) skips the step.

    Returns:
        One :class:`StepCheck` per decode step, in order (empty when ``sched`` was idle).

    Raises:
        ValueError: as :func:`checked_step`.
    """
    checks = []
    while not sched.idle:
        sched.admit()
        snap = sched.snapshot()
        if snap.batch_size:
            checks.append(_checked_step(sched, snap))
        sched.filter()
    return checks
