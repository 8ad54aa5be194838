"""Admission: which queued requests join next, and which running rows to preempt for
them. Decisions only: nothing here runs the model or changes state.

Knows: request states (prompt length, priority, projected KV bytes, join order), the
admission policy (:mod:`workbench.engine.policies`), the batch limits and the KV budget.
Must not know: MLX, caches, events.

Rules (the scheduler applies the :class:`Decision`):

- at most ``min(max_batch - running rows, prompt_concurrency)`` requests join at once,
  taken in the policy's order;
- with a KV budget, a request joins only while the projected KV bytes of running,
  prefilling and chosen requests stay within it; the first that does not fit stops the
  choice (nobody jumps it, so the policy's order holds);
- when not even the first request fits, running rows of *lower* priority are preempted
  (lowest priority first, the latest joined among equals) if that makes it fit; never
  when it would not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .policies import Policy, Queued
from .state import RequestState


@dataclass(frozen=True)
class Decision:
    """What admission decided: uids to admit (in order) and running uids to preempt first."""

    admit: list[int] = field(default_factory=list)
    preempt: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Admission:
    """The admission rules of one scheduler.

    Args:
        policy: orders the queue. max_batch: most running rows. prompt_concurrency: most
        requests prefilled together. kv_budget_bytes: projected KV bytes allowed
        (``None``: no budget).
    """

    policy: Policy
    max_batch: int
    prompt_concurrency: int
    kv_budget_bytes: int | None = None

    def decide(self, queue: Sequence[RequestState], running: Sequence[RequestState], used_bytes: int) -> Decision:
        """Choose from ``queue`` (arrival order) given the ``running`` rows (unfinished
        ones count for preemption) and the projected bytes ``used_bytes`` already held by
        running and prefilling requests."""
        slots = min(self.max_batch - len(running), self.prompt_concurrency)
        if slots <= 0 or not queue:
            return Decision()
        by_uid = {s.uid: s for s in queue}
        seen = [Queued(s.uid, len(s.valid.prompt_ids), s.valid.request.priority, i) for i, s in enumerate(queue)]
        chosen, preempt = [], []
        for uid in self.policy.order(seen)[:slots]:
            need = by_uid[uid].projected_bytes
            if not self._fits(used_bytes + need):
                if chosen:
                    break
                preempt = self._victims(by_uid[uid], running, used_bytes)
                if not preempt:
                    break
                used_bytes -= sum(s.projected_bytes for s in running if s.uid in preempt)
            chosen.append(uid)
            used_bytes += need
        return Decision(chosen, preempt)

    def _fits(self, projected_bytes: int) -> bool:
        return self.kv_budget_bytes is None or projected_bytes <= self.kv_budget_bytes

    def _victims(self, joiner: RequestState, running: Sequence[RequestState], used_bytes: int) -> list[int]:
        """Running unfinished rows of lower priority than ``joiner`` to preempt so that it
        fits, lowest priority (then latest joined) first; ``[]`` if even all of them
        would not make room."""
        want = joiner.valid.request.priority
        lower = [s for s in running if not s.finished and s.valid.request.priority < want]
        victims = []
        for s in sorted(lower, key=lambda s: (s.valid.request.priority, -s.join_order)):
            if self._fits(used_bytes + joiner.projected_bytes):
                break
            victims.append(s.uid)
            used_bytes -= s.projected_bytes
        return victims if self._fits(used_bytes + joiner.projected_bytes) else []
