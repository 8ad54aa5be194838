"""The batch-invariant mode's projection hook with each projection's plan resolved once
(``docs/batch-invariance.md``, "Cost", the eighteenth session).

Knows: :func:`workbench.engine.levers.invariant.blocked` and the mode's
:class:`~workbench.engine.levers.invariant.Invariance` (row blocks, fused groups), both reached
through the ``ops`` module :mod:`.invariant` passes in (this module imports nothing from it, so
no import circle, and a lab script's stand-in for ``invariant.blocked`` is seen). Must not know:
requests, the scheduler.

Why: on CUDA a decode step is host-bound, and the hook runs for every projection of every
layer (113 calls a step on a 16-layer llama, 65 of them matmuls where q / k / v and gate / up
are fused). Each call used to look up its row blocks and fused group, build a padding closure
and a lambda, and cut its fused member's columns with an ``Ellipsis`` index. Here a
projection's :class:`Runner` (what it calls, its blocks, its group and columns) is made the
first time the mode sees the projection and kept in :attr:`Invariance.runners` for every
later forward, checked against the weight array it was made for; one :class:`_Forward` per
forward holds what its projections share (the input padded last, the fused groups' outputs).
The graph is the one the mode built before, op for op, so every row keeps its bits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import mlx.core as mx


class _Forward:
    """What one forward's projections share: the input padded last (q / k / v and gate / up
    read one ``x``; the input held so that its identity stays its own) and each fused group's
    output ``id(group) -> (x, [..., N] output)``."""

    __slots__ = ("ops", "x", "padded_for", "call", "padded", "done")

    def __init__(self, ops: ModuleType) -> None:
        self.ops = ops  # :mod:`.invariant`
        self.x = self.padded_for = self.padded = None
        self.call = 0
        self.done: dict = {}

    def pad(self, rows: mx.array, call: int) -> mx.array:
        """:func:`~.invariant.zero_padded` of ``rows`` (the reshaped :attr:`x`), made once per
        input and call size: ``[call, K]``. Raises ``ValueError`` for ``call`` below the
        rows (:func:`~.invariant.zero_padded`)."""
        if self.padded_for is not self.x or self.call != call:
            self.padded_for, self.call = self.x, call
            self.padded = self.ops.zero_padded(rows, call)
        return self.padded


Runner = Callable[[mx.array, _Forward], mx.array]  # (x [..., K], the forward) -> [..., N]


def _alone(inv: Any, module: Any, plain: Callable[[Any, mx.array], mx.array]) -> Runner:
    """``module`` projected on its own in :func:`~.invariant.blocked` row blocks."""
    blocks, apart = inv.plan_for(module)
    f = functools.partial(plain, module)

    def run(x: mx.array, fwd: _Forward) -> mx.array:
        return fwd.ops.blocked(f, x, blocks, apart, fwd.pad)

    return run


def _member(inv: Any, group: Any, i: int, alone: Runner) -> Runner:
    """Member ``i`` of fused ``group``: its columns of the group's projection of ``x``, made at
    the group's first call with ``x`` (whichever member calls first) and served to the others;
    ``alone`` where the group's weights were replaced since it was fused."""
    blocks, apart = inv.plan_for(group.module)
    columns = slice(*group.bounds[i])
    decode = (slice(None), slice(None), columns)  # y[:, :, start:stop] for a [B, L, N] output
    key = id(group)

    def run(x: mx.array, fwd: _Forward) -> mx.array:
        got = fwd.done.get(key)
        if got is None or got[0] is not x:
            if not group.intact():
                return alone(x, fwd)
            got = fwd.done[key] = (x, fwd.ops.blocked(group, x, blocks, apart, fwd.pad))
        y = got[1]
        return (
            y[decode] if y.ndim == 3 else y[(slice(None),) * (y.ndim - 1) + (columns,)]
        )  # y[..., start:stop]

    return run


def runner(inv: Any, module: Any, plain: Callable[[Any, mx.array], mx.array]) -> Runner:
    """The :data:`Runner` of projection ``module`` (``plain(module, x)``: MLX's own call), made
    once per module and weight array and kept in ``inv.runners`` (``inv``: the mode's
    :class:`~.invariant.Invariance`). No mlx-lm counterpart. Raises nothing (the runner
    raises what ``plain`` raises)."""
    weight = module["weight"]
    known = inv.runners.get(id(module))
    if known is None or known[0] is not weight:
        run = _alone(inv, module, plain)
        member = inv.fused.get(id(module))
        if member is not None:
            run = _member(inv, member[0], member[1], run)
        known = inv.runners[id(module)] = (weight, run)
    return known[1]


def blocked_projection(
    inv: Any, ops: ModuleType
) -> Callable[[Any, Callable[[Any, mx.array], mx.array], mx.array], mx.array]:
    """The ``projections`` hook (:class:`workbench.engine.model_hooks.ModelHooks`) of one
    forward: each projection ``plain(module, x)`` in :func:`~.invariant.blocked` row blocks, a
    member of a fused group (:attr:`~.invariant.Invariance.fused`) served its columns of the
    group's projection of ``x``. Make one per forward (``inv``: the mode's
    :class:`~.invariant.Invariance`; ``ops``: :mod:`.invariant`, whose ``blocked`` and
    ``zero_padded`` it calls). No mlx-lm counterpart (mlx-lm calls each projection as
    is). Raises nothing (the hook raises what a projection raises)."""
    fwd = _Forward(ops)
    runners = inv.runners

    def project(module: Any, plain: Callable[[Any, mx.array], mx.array], x: mx.array) -> mx.array:
        known = runners.get(id(module))
        run = known[1] if known is not None and known[0] is module["weight"] else runner(inv, module, plain)
        fwd.x = x
        return run(x, fwd)

    return project
