"""Bookkeeping of the engine: the event log and the snapshot history.

Knows: events, snapshots, the injected clock. Must not know: MLX, caches, requests (it
is told what to log; a snapshot arrives as a capture function, converted on first read).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from .events import Event
from .snapshot import Snapshot


class History(deque):
    """A ring buffer (``collections.deque`` with ``maxlen``) of :class:`Snapshot` s whose
    entries may be stored as capture functions: each is converted to its
    :class:`Snapshot` the first time it is read (index, iteration), then kept.

    ``checkpoints`` is aligned with it: the engine checkpoint kept with each snapshot
    (``Scheduler(history_checkpoints=N)``), or ``None``."""

    def __init__(self, iterable=(), maxlen: int | None = None):
        super().__init__(iterable, maxlen)
        self.checkpoints: deque = deque(maxlen=maxlen)

    def checkpoint(self, index: int) -> Any:
        """The checkpoint kept with ``history[index]``, for ``Scheduler.restore``; ``None``
        when none was kept for it.

        Raises:
            IndexError: for an index outside the history.
        """
        return self.checkpoints[index]

    def __getitem__(self, i):
        item = super().__getitem__(i)
        if not isinstance(item, Snapshot):
            item = item()
            super().__setitem__(i, item)
        return item

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __reversed__(self):
        return (self[i] for i in range(len(self) - 1, -1, -1))


class Recorder:
    """The event log and the snapshot history of one scheduler.

    Args:
        clock: ``() -> seconds``, stamped on every event.
        history_size: snapshots kept (``0``: none recorded).

    Attributes:
        events: every :class:`Event` so far, in order.
        history: the latest snapshots (:class:`History`).
        checkpoints: aligned with ``history``: the engine checkpoint kept with each
            snapshot, or ``None`` (see :meth:`keep_checkpoint`).
    """

    def __init__(self, clock: Callable[[], float], history_size: int):
        self.clock = clock
        self.events: list[Event] = []
        self.history = History(maxlen=history_size)
        self.checkpoints = self.history.checkpoints
        self._recorded_at = -1  # len(events) when the last snapshot was recorded

    def log(self, kind: str, uid: int, step: int, **fields: Any) -> Event:
        """Append and return an event of ``kind`` for ``uid`` at decode step ``step``."""
        event = Event(kind=kind, uid=uid, step=step, time_s=self.clock(), **fields)
        self.events.append(event)
        return event

    def record(self, capture: Callable[[], Snapshot]) -> None:
        """Append a snapshot (as its capture function) to the history."""
        if self.history.maxlen:
            self.history.append(capture)
            self.checkpoints.append(None)
            self._recorded_at = len(self.events)

    def keep_checkpoint(self, checkpoint: Any, keep: int) -> None:
        """Keep ``checkpoint`` (any object; the engine's state at the latest snapshot)
        with the latest history entry, and at most ``keep`` checkpoints in all (older
        ones are dropped: each holds its cache buffers alive)."""
        if not self.checkpoints:
            return
        self.checkpoints[-1] = checkpoint
        held = [i for i, c in enumerate(self.checkpoints) if c is not None]
        for i in held[: max(0, len(held) - keep)]:
            self.checkpoints[i] = None

    @property
    def stale(self) -> bool:
        """True when events happened since the last recorded snapshot (or none was)."""
        return not self.history or self._recorded_at != len(self.events)

    def mark(self) -> tuple:
        """Where the books stand now, for :meth:`rollback` (O(history size), not O(events))."""
        return (
            len(self.events),
            list(super(History, self.history).__iter__()),
            list(self.checkpoints),
            self._recorded_at,
        )

    def rollback(self, mark: tuple) -> None:
        """Drop what was logged and recorded since ``mark``."""
        n_events, history, checkpoints, recorded_at = mark
        del self.events[n_events:]
        self.history.clear()
        self.history.extend(history)
        self.checkpoints.clear()
        self.checkpoints.extend(checkpoints)
        self._recorded_at = recorded_at

    def clone(self, clock: Callable[[], float] | None = None, history_size: int | None = None) -> "Recorder":
        """A copy with its own event list and history (events and snapshots are immutable
        and shared); ``clock`` and ``history_size`` replace this one's when given."""
        out = Recorder(
            clock or self.clock, self.history.maxlen or 0 if history_size is None else history_size
        )
        out.events = list(self.events)
        out.history.extend(super(History, self.history).__iter__())  # entries as stored, unconverted
        out.checkpoints.extend(self.checkpoints)
        out._recorded_at = self._recorded_at
        return out
