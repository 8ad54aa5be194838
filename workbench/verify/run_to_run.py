"""Run-to-run determinism of the batch-invariant mode: the same requests through two fresh
``Scheduler(batch_invariant=True)`` give the same tokens and log-probs (issue 39's "same input
twice", beside ``workbench.verify.invariance``'s alone-vs-batched).

Knows: :class:`workbench.Scheduler`, :class:`workbench.Request`. Must not know: the mode's
internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..engine.request import Request
from ..engine.scheduler import Scheduler


def twice(
    model: Any, tokenizer: Any, requests: Sequence[Request], max_batch: int, prefill_step_size: int = 16
) -> tuple[list, list]:
    """Each run's ``[(tokens, log-probs)]`` per request, in submit order: ``requests`` all
    submitted at once into a fresh ``Scheduler(batch_invariant=True, max_batch=max_batch,
    prefill_step_size=prefill_step_size)``, twice. Equal lists: the mode is deterministic
    run to run for this input (``==``, no tolerance)."""
    runs = []
    for _ in range(2):
        sched = Scheduler(
            model, tokenizer, max_batch=max_batch, prefill_step_size=prefill_step_size, batch_invariant=True
        )
        uids = [sched.submit(r) for r in requests]
        sched.run()
        runs.append([(sched.tokens(u), sched.logprobs(u)) for u in uids])
    return runs[0], runs[1]
