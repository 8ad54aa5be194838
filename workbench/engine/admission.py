"""Admission: which queued requests join next, and which running rows to preempt for
them. Decisions only: nothing here runs the model or changes state.

Knows: request states (prompt length, priority, tokens held and reachable, join order),
the KV projection (:class:`workbench.engine.kv.allocation.KVPlan`), the admission policy (:mod:`workbench.engine.policies`), the batch limits and the KV budget.
Must not know: MLX, caches, events.

Rules (the scheduler applies the :class:`Decision`):

- at most ``min(max_batch - running rows, prompt_concurrency)`` requests join at once,
  taken in the policy's order;
- with a KV budget, a request joins only while the bytes the caches will really hold
  stay within it: the :class:`workbench.engine.kv.allocation.KVPlan` projection of the
  running batch and the chosen group (mlx-lm's 256-token growth step, every row padded
  to the widest, the group's own caches while it prefills, free slots, ring windows and
  SSM states); the first that does not fit stops the choice (nobody jumps it, so the
  policy's order holds);
- when not even the first request fits, running rows of *lower* priority are preempted
  (lowest priority first, the latest joined among equals) if that makes it fit; never
  when it would not.

Starvation: the first request in the policy's order waits only while running rows hold
bytes; rows finish, their bytes go, and a request alone on an empty engine always fits
(the scheduler refuses at ``submit`` one that would not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .kv.allocation import KVPlan, RowTokens
from .policies import Policy, Queued
from .state import RequestState


def joiner_tokens(s: RequestState) -> RowTokens:
    """A queued request as a joiner: its input tokens (prompt, plus generated tokens when
    resuming) and the most it may hold (prompt + ``max_tokens``)."""
    return RowTokens(s.uid, len(s.inputs), len(s.valid.prompt_ids) + s.valid.request.max_tokens)


def row_tokens(s: RequestState) -> RowTokens:
    """A running row: the tokens its cache holds and the most it may hold (what it holds,
    once finished)."""
    held = s.context_tokens
    return RowTokens(s.uid, held, held if s.finished else len(s.valid.prompt_ids) + s.valid.request.max_tokens)


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
        requests prefilled together. kv_budget_bytes: bytes the caches may hold, by the
        :class:`~workbench.engine.kv.allocation.KVPlan` projection (``None``: no budget).
    """

    policy: Policy
    max_batch: int
    prompt_concurrency: int
    kv_budget_bytes: int | None = None

    def decide(self, queue: Sequence[RequestState], running: Sequence[RequestState], plan: KVPlan | None = None,
               now_s: float = 0.0) -> Decision:
        """Choose from ``queue`` (arrival order) given the ``running`` rows (unfinished
        ones count for preemption) and ``plan``, the batch's allocation now and the
        projection admission checks against ``kv_budget_bytes`` (``None`` or no budget:
        bytes are not checked); ``now_s`` (the scheduler's clock) gives each request's
        ``waited_s``."""
        slots = min(self.max_batch - len(running), self.prompt_concurrency)
        if slots <= 0 or not queue:
            return Decision()
        by_uid = {s.uid: s for s in queue}
        seen = [Queued(s.uid, len(s.valid.prompt_ids), s.valid.request.priority, i, now_s - s.submitted_s)
                for i, s in enumerate(queue)]
        chosen: list[RowTokens] = []
        preempt: list[int] = []
        for uid in self.policy.order(seen)[:slots]:
            group = chosen + [joiner_tokens(by_uid[uid])]
            if not self._fits(plan, group, preempt):
                if chosen:
                    break
                preempt = self._victims(by_uid[uid], running, plan, group)
                if not preempt:
                    break
            chosen = group
        return Decision([j.uid for j in chosen], preempt)

    def _fits(self, plan: KVPlan | None, joiners: list[RowTokens], dropped: list[int]) -> bool:
        return (self.kv_budget_bytes is None or plan is None
                or plan.projected_bytes(joiners, dropped) <= self.kv_budget_bytes)

    def _victims(self, joiner: RequestState, running: Sequence[RequestState], plan: KVPlan | None,
                 group: list[RowTokens]) -> list[int]:
        """Running unfinished rows of lower priority than ``joiner`` to preempt so that
        ``group`` (the joiner alone) fits, lowest priority (then latest joined) first;
        ``[]`` if even all of them would not make room."""
        want = joiner.valid.request.priority
        lower = [s for s in running if not s.finished and s.valid.request.priority < want]
        victims: list[int] = []
        for s in sorted(lower, key=lambda s: (s.valid.request.priority, -s.join_order)):
            if self._fits(plan, group, victims):
                break
            victims.append(s.uid)
        return victims if self._fits(plan, group, victims) else []
