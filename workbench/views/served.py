"""What a Panel reads of a served scheduler: a copy taken on the engine thread.

Knows: the scheduler's public readers (``history``, ``events``, ``request_of``, ``tokens``,
``config``, ``tokenizer``, ``id``, ``step_index``). Must not know: HTTP, the engine thread
(the caller hands :func:`engine_copy` to ``server.between``, which runs it between two
engine calls).

A served scheduler (``wb.serve``) is stepped by its engine thread; another thread that
reads ``sched.history`` or ``sched.events`` while a step appends to them may see a half-made
state (or ``deque mutated during iteration``). So the Panel never reads it directly while
served: it asks the engine thread for an :class:`EngineCopy` (``server.between(engine_copy)``),
a copy of what the panel draws, and draws from that on its own thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engine.scheduler import Scheduler
from ..observe.recorder import History

COPY_EVENTS = 4000  # the latest events copied: what the panel's timeline and latency views read


@dataclass(frozen=True)
class EngineCopy:
    """The readers of a :class:`Scheduler` a Panel uses, frozen at one moment between two
    engine calls: ``history`` (a copy of the :class:`History` with its checkpoints),
    ``events`` (the latest ``COPY_EVENTS``), ``n_events`` (how many the engine had logged),
    the requests of every uid in the history (prompt and tokens), and the scheduler's
    ``config``, ``tokenizer``, ``id`` and ``step_index`` (shared, read only)."""

    history: History
    events: list
    n_events: int
    requests: dict
    config: Any
    tokenizer: Any
    id: str
    step_index: int

    def request_of(self, uid: int) -> Any:
        """The validated request of ``uid`` (``Scheduler.request_of``). Raises: KeyError."""
        return self.requests[uid][0]

    def tokens(self, uid: int) -> list[int]:
        """``uid``'s generated tokens when copied (``Scheduler.tokens``). Raises: KeyError."""
        return list(self.requests[uid][1])

    @property
    def key(self) -> tuple[int, int]:
        """What changes when the engine does: the events logged and the latest snapshot's step."""
        return self.n_events, self.history[-1].step if len(self.history) else -1


def engine_copy(sched: Scheduler) -> EngineCopy:
    """Copy what a Panel draws of ``sched``; call it on the thread that steps ``sched``
    (``server.between(engine_copy)``) or while nobody steps it. Converts the history's
    pending snapshots (their capture functions) on the way, as reading them would."""
    source = sched.history
    history = History(list(source), maxlen=source.maxlen)
    history.checkpoints.extend(source.checkpoints)
    requests = {}
    for uid in {u for snap in history for u in snap.uids}:
        try:
            requests[uid] = (sched.request_of(uid), tuple(sched.tokens(uid)))
        except KeyError:  # a restore dropped it from the engine
            continue
    events = sched.events
    return EngineCopy(
        history,
        list(events[-COPY_EVENTS:]),
        len(events),
        requests,
        sched.config,
        sched.tokenizer,
        sched.id,
        sched.step_index,
    )
