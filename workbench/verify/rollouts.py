"""Oracles for rows of one batch checked against the same request run alone: a rollout of
``submit_n`` against ``Request(seed=seed + i)``, a constrained row against itself alone, a
speculating row against itself without speculation; and the event-log facts beside them
(how many prompt tokens a group of rows prefilled, which rows drafted).

Knows: the scheduler's public contract (``fresh``, ``submit``, ``run``, ``request``), its
events. Must not know: views.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..engine.request import Request


def _close(a: Any, b: Any, atol: float) -> bool:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=0, atol=atol))


def equals_alone(sched: Any, uid: int, request: Request, atol: float = 1e-4, **changes: Any) -> bool:
    """Whether row ``uid`` of ``sched`` equals ``request`` run alone in ``sched.fresh(**changes)``
    (the same model and settings, ``changes`` replacing some, e.g. ``speculative=None``): the
    same tokens and, per token, the same top-k token ids (when the request asks
    ``top_logprobs``); log-probs and top-k log-probs (nats) within ``atol``.

    The batched row may be read while it runs; the request alone runs to its end.

    >>> equals_alone(sched, 0, dataclasses.replace(rollout, seed=7))  # doctest: +SKIP
    True
    """
    ours = sched.request(uid)
    solo = sched.fresh(**changes)
    theirs = solo.request(_run_alone(solo, request))
    ids = [[t for t, _ in p] for p in ours.top_logprobs] == [[t for t, _ in p] for p in theirs.top_logprobs]
    top_lp = _close(
        [[lp for _, lp in p] for p in ours.top_logprobs],
        [[lp for _, lp in p] for p in theirs.top_logprobs],
        atol,
    )
    return (
        list(ours.tokens) == list(theirs.tokens)
        and ids
        and top_lp
        and _close(ours.logprobs, theirs.logprobs, atol)
    )


def _run_alone(sched: Any, request: Request) -> int:
    uid = sched.submit(dataclasses.replace(request, on_token=None))  # a callback stays with the batched run
    sched.run()
    return uid


def prefilled_tokens(events: Iterable[Any], uids: Iterable[int]) -> int:
    """Prompt tokens the ``prefill`` events of ``uids`` fed (a shared prompt prefilled once
    counts once: the rows of ``submit_n`` share one prefill, its last token feeds the join)."""
    uids = set(uids)
    return sum(e.n_tokens for e in events if e.kind == "prefill" and e.uid in uids)


def drafted_uids(events: Iterable[Any]) -> list[int]:
    """The uids with at least one ``draft`` event (rows that speculated), ascending."""
    return sorted({e.uid for e in events if e.kind == "draft"})
