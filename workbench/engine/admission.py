"""Admission: which queued requests join next, and which running rows to preempt for
them. Decisions only: nothing here runs the model or changes state.

Rules (the scheduler applies the :class:`Decision`):

- at most ``min(max_batch - running rows, prompt_concurrency)`` requests join at once,
  taken in the policy's order;
- with a KV budget, a request joins only while the caches' projected bytes
  (:class:`workbench.engine.kv.allocation.KVPlan`) stay within it; the first that does not
  fit stops the choice, so the policy's order holds;
- when not even the first fits, running rows of *lower* priority are preempted (lowest
  first, the latest joined among equals) if that makes it fit; never when it would not,
  and never a row that could not resume alone on an idle engine.

No starvation: one request alone on an empty engine always fits; :meth:`Admission.wedge`
names an idle engine that would still admit none (why: ``docs/lab/engine-notes.md``,
"admission.py"). A policy is any object with ``name`` and ``order(queue: [Queued]) -> [uid]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .kv.allocation import KVPlan, RowTokens
from .kv.ledger import joiner_tokens
from .state import RequestState


@dataclass(frozen=True)
class Queued:
    """What a policy may see of a queued request.

    Attributes:
        uid: request id. prompt_tokens: prompt length (tokens). priority: larger first
        (for :class:`Priority`). arrival: submit order (0, 1, ...). waited_s: seconds
        since it was submitted, by the scheduler's clock.
    """

    uid: int
    prompt_tokens: int
    priority: int
    arrival: int
    waited_s: float = 0.0


class Policy(Protocol):
    """Orders the queue for admission."""

    name: str

    def order(self, queue: Sequence[Queued]) -> list[int]:
        """Uids in the order they should be admitted."""


class FCFS:
    """First come, first served (mlx-lm's and vLLM's default)."""

    name = "fcfs"

    def order(self, queue: Sequence[Queued]) -> list[int]:
        """Uids by arrival."""
        return [q.uid for q in sorted(queue, key=lambda q: q.arrival)]


class ShortestPromptFirst:
    """Shortest prompt first (ties by arrival), lowering TTFT; a request waiting ``max_wait_s``
    seconds goes before every younger one (``None``: no bound). SGLang's ``--schedule-policy``.

    Raises:
        ValueError: for ``max_wait_s <= 0``.
    """

    name = "shortest-prompt-first"

    def __init__(self, max_wait_s: float | None = None):
        if max_wait_s is not None and not max_wait_s > 0:
            raise ValueError(f"max_wait_s must be > 0 seconds or None, got {max_wait_s!r}")
        self.max_wait_s = max_wait_s

    def order(self, queue: Sequence[Queued]) -> list[int]:
        """Uids: those waiting ``>= max_wait_s`` by arrival, then by prompt tokens."""
        late = lambda q: self.max_wait_s is not None and q.waited_s >= self.max_wait_s  # noqa: E731
        return [
            q.uid
            for q in sorted(queue, key=lambda q: (not late(q), 0 if late(q) else q.prompt_tokens, q.arrival))
        ]

    def __repr__(self) -> str:
        return f"ShortestPromptFirst(max_wait_s={self.max_wait_s!r})"


class Priority:
    """Highest ``Request.priority`` first (ties by arrival)."""

    name = "priority"

    def order(self, queue: Sequence[Queued]) -> list[int]:
        """Uids by priority (highest first), then arrival."""
        return [q.uid for q in sorted(queue, key=lambda q: (-q.priority, q.arrival))]


POLICIES = {p.name: p for p in (FCFS, ShortestPromptFirst, Priority)}


def policy_from(spec: "str | Policy") -> Policy:
    """A policy object from a name in ``POLICIES`` or a policy object itself.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if isinstance(spec, str):
        if spec not in POLICIES:
            raise ValueError(f"policy must be one of {sorted(POLICIES)} or a Policy object, got {spec!r}")
        return POLICIES[spec]()
    if not callable(getattr(spec, "order", None)):
        raise ValueError(f"policy object {spec!r} has no order(queue) method")
    return spec


@dataclass(frozen=True)
class Decision:
    """What admission decided: uids to admit (in order) and running uids to preempt first."""

    admit: list[int] = field(default_factory=list)
    preempt: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Admission:
    """The admission rules of one scheduler.

    Args:
        policy: orders the queue. config: the scheduler's settings (``max_batch``,
        ``prompt_concurrency``, ``kv_budget_bytes``: bytes by the ``KVPlan`` projection).
    """

    policy: Policy
    config: Any  # a workbench.engine.config.SchedulerConfig

    def decide(
        self,
        queue: Sequence[RequestState],
        running: Sequence[RequestState],
        plan: KVPlan | None = None,
        now_s: float = 0.0,
    ) -> Decision:
        """The :class:`Decision` for ``queue`` (arrival order) given the ``running`` rows, the
        ``plan`` (``None``: bytes not checked) and the clock ``now_s`` (seconds)."""
        cfg = self.config
        slots = min(cfg.max_batch - len(running), cfg.prompt_concurrency or cfg.max_batch)
        if slots <= 0 or not queue:
            return Decision()
        by_uid = {s.uid: s for s in queue}
        chosen: list[RowTokens] = []
        preempt: list[int] = []
        for uid in self.policy.order(_seen(queue, now_s))[:slots]:
            group = chosen + [joiner_tokens(by_uid[uid])]
            if not self._fits(plan, group, preempt):
                if chosen:
                    break
                preempt = self._victims(by_uid[uid], running, plan, group)
                if not preempt:
                    break
            chosen = group
        return Decision([j.uid for j in chosen], preempt)

    def decide_now(self, st: Any, ledger: Any, clock: Callable[[], float]) -> Decision:
        """The decision on engine state ``st`` now; on an idle engine, prompt-cache entries
        and held ``submit_n`` prompts yield first (the only change to ``st``)."""

        def decide(**held: bool) -> Decision:
            return self.decide(st.queue, st.batch.rows, ledger.plan(st, **held), clock())

        decision = decide()
        cache = st.prompt_cache
        if not decision.admit and not st.batch.rows and cache is not None and cache.nbytes:
            cache.trim_to(0)
            decision = decide()
        if not decision.admit and st.shared_prompts:
            unheld = decide(held_prompts=False)
            if unheld.admit:
                st.shared_prompts, decision = {}, unheld
        return decision

    def wedge(self, st: Any, ledger: Any) -> str:
        """Why an idle engine would admit none of ``st.queue`` (a wedge), else ``""``."""
        queue = st.queue
        if not queue or st.prefilling is not None or st.batch.rows:
            return ""
        plan = ledger.plan(st, held_prompts=False, prompt_cache=False)
        latest = max(s.submitted_s for s in queue)
        if self.decide(queue, (), plan, latest).admit:
            return ""
        first = self.policy.order(_seen(queue, latest))[:1]
        need = ""
        if first and plan is not None and self.config.kv_budget_bytes is not None:
            head = next(s for s in queue if s.uid == first[0])
            need = (
                f"; its first choice, uid {head.uid}, projects "
                f"{plan.projected_bytes([joiner_tokens(head)]):,} KV bytes alone "
                f"(kv_budget_bytes {self.config.kv_budget_bytes:,})"
            )
        return (
            f"the engine is idle with {len(queue)} queued request(s) (uids {[s.uid for s in queue][:8]}) "
            f"and policy {self.policy.name!r} admits none of them{need}: admission is wedged"
        )

    def _fits(self, plan: KVPlan | None, joiners: list[RowTokens], dropped: list[int]) -> bool:
        budget = self.config.kv_budget_bytes
        return budget is None or plan is None or plan.projected_bytes(joiners, dropped) <= budget

    def _victims(
        self,
        joiner: RequestState,
        running: Sequence[RequestState],
        plan: KVPlan | None,
        group: list[RowTokens],
    ) -> list[int]:
        """Rows to preempt so ``joiner`` fits (module rules); ``[]`` if none would make room."""
        want = joiner.valid.request.priority
        idle = plan.idle() if plan is not None else None
        lower = [
            s
            for s in running
            if not s.finished and s.valid.request.priority < want and self._fits(idle, [joiner_tokens(s)], [])
        ]
        victims: list[int] = []
        for s in sorted(lower, key=lambda s: (s.valid.request.priority, -s.join_order)):
            if self._fits(plan, group, victims):
                break
            victims.append(s.uid)
        return victims if self._fits(plan, group, victims) else []


def _seen(queue: Sequence[RequestState], now_s: float) -> list[Queued]:
    """What the policy sees of ``queue`` (arrival order) at ``now_s`` seconds."""
    return [
        Queued(s.uid, len(s.valid.prompt_ids), s.valid.request.priority, i, now_s - s.submitted_s)
        for i, s in enumerate(queue)
    ]
