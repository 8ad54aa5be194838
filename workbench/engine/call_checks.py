"""Checks of the ``Scheduler``'s public calls that are not about a request: a state-changing call
made from inside a request's ``on_token`` (``step()`` is half-read there), and ``run()``'s
arguments. Leaves: no engine state is read or changed here.

Knows: :class:`~workbench.engine.request.Request`. Must not know: the batch, layouts, caches.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

from .request import Request


def refuse_inside_on_token(uid: int | None, call: str) -> None:
    """Raise where ``call`` comes from uid ``uid``'s ``on_token`` while ``step()`` delivers
    tokens (``uid`` ``None``: not inside one): the step is half-read (rows after this one not yet
    given their tokens), so a nested step, admission, eviction, preemption, run or restore would
    corrupt it. The scheduler contains it as any ``on_token`` exception: only the calling row
    ends (``submit`` and ``abort`` stay allowed there: they queue or mark, and the step reads on).
    No mlx-lm counterpart (mlx-lm's ``BatchGenerator`` takes no callbacks).

    Raises:
        RuntimeError: naming the call, the row and what to do instead."""
    if uid is not None:
        raise RuntimeError(
            f"Scheduler.{call}() called from inside uid {uid}'s on_token while step() delivers this "
            f"step's tokens; only submit() and abort() may be called there: call {call}() after step() returns"
        )


def run_arguments(arrivals: Iterable[Any], max_steps: Any) -> list[tuple[int, Any]]:
    """``arrivals`` as a list of ``(step, Request or dict)`` pairs, checked with ``max_steps``
    (``Scheduler.run``'s arguments: steps are decode steps, whole numbers ``>= 0``; a
    :class:`~workbench.workloads.workload.Workload`'s seconds are not steps). No mlx-lm
    counterpart.

    Raises:
        ValueError: ``max_steps`` not a whole number >= 0 or ``None``, or an arrival not such a
            pair (naming it)."""
    if max_steps is not None and (
        isinstance(max_steps, bool) or not isinstance(max_steps, numbers.Integral) or max_steps < 0
    ):
        raise ValueError(
            f"run(): max_steps must be a whole number >= 0 decode steps or None, got {max_steps!r}"
        )
    pairs = list(arrivals)
    for a in pairs:
        if not (
            isinstance(a, (tuple, list))
            and len(a) == 2
            and isinstance(a[0], numbers.Integral)
            and not isinstance(a[0], bool)
            and a[0] >= 0
            and isinstance(a[1], (Request, dict))
        ):
            raise ValueError(
                f"run(): each arrival must be a (step, Request) pair with a whole-number step >= 0, got {a!r:.200}"
            )
    return pairs
