"""Admission policies: which queued requests join next.

Knows: a queued request's uid, prompt length, priority and arrival order. Must not know:
MLX, caches, the scheduler's loop (policies are configuration, not forks of it).

A policy is any object with ``name`` and ``order(queue) -> list[uid]``; the scheduler
admits the first ``slots`` uids of that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


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
    """Shortest prompt first (ties by arrival): the least prefill work first, which lowers
    TTFT; alone it can starve long prompts, so ``max_wait_s`` bounds it: a request that has
    waited that long goes before every younger one (oldest first). Mirrors SGLang's
    ``--schedule-policy`` orderings with an age bound.

    Args:
        max_wait_s: seconds after which a request is served first-come-first-served
            (``None``: no bound, pure shortest-first).

    Raises:
        ValueError: for ``max_wait_s <= 0``.
    """

    name = "shortest-prompt-first"

    def __init__(self, max_wait_s: float | None = None):
        if max_wait_s is not None and not max_wait_s > 0:
            raise ValueError(f"max_wait_s must be > 0 seconds or None, got {max_wait_s!r}")
        self.max_wait_s = max_wait_s

    def order(self, queue: Sequence[Queued]) -> list[int]:
        """Uids: those waiting ``>= max_wait_s`` by arrival, then the rest by prompt
        tokens, then arrival."""
        late = lambda q: self.max_wait_s is not None and q.waited_s >= self.max_wait_s  # noqa: E731
        return [q.uid for q in sorted(queue, key=lambda q: (not late(q), 0 if late(q) else q.prompt_tokens, q.arrival))]

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
