"""Clocks for replays: ``() -> seconds`` objects the Scheduler reads (its ``clock=``),
moved by the replay driver.

Knows: ``time.perf_counter`` and ``time.sleep``. Must not know: the scheduler, models.

- :class:`WallClock`: real seconds since it was made; ``wait_until(t)`` sleeps.
- :class:`VirtualClock`: seconds that move only when told. ``advance(dt)`` adds a cost
  (e.g. from a cost model), ``jump_to(t)`` skips idle time to the next arrival, and
  ``with clock.measuring():`` lets real time flow inside the block only (so a replay
  costs what the engine calls cost, not the driver's bookkeeping or idle gaps).

Both support ``with clock.pinned(t):``: reads inside the block return ``t``. The replay
driver submits a request pinned to its arrival time, so the ``submit`` event carries the
moment the request reached the server, even when the engine was busy in an iteration
then and picked it up at the iteration's end (a server timestamps arrival on receipt,
as vLLM's ``arrival_time`` does). Event times are therefore non-decreasing except that a
``submit`` may be earlier than the events logged just before it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager


class _Pinnable:
    _pinned_s: float | None = None

    def _now_s(self) -> float:
        raise NotImplementedError

    def __call__(self) -> float:
        """Current time in seconds (the pinned time inside ``pinned``)."""
        return self._now_s() if self._pinned_s is None else self._pinned_s

    @contextmanager
    def pinned(self, t_s: float) -> Iterator[None]:
        """Reads inside the block return ``t_s``."""
        self._pinned_s = float(t_s)
        try:
            yield
        finally:
            self._pinned_s = None


class WallClock(_Pinnable):
    """Real time: seconds since construction (``time.perf_counter``)."""

    def __init__(self):
        self._start = time.perf_counter()

    def _now_s(self) -> float:
        return time.perf_counter() - self._start

    def wait_until(self, t_s: float) -> None:
        """Sleep until the clock reads ``t_s`` (returns at once if already past)."""
        delay_s = t_s - self()
        if delay_s > 0:
            time.sleep(delay_s)


class VirtualClock(_Pinnable):
    """Virtual seconds, starting at ``start_s``; they move only by :meth:`advance`,
    :meth:`jump_to` and inside :meth:`measuring`."""

    def __init__(self, start_s: float = 0.0):
        self.now_s = float(start_s)
        self._measuring_since: float | None = None

    def _now_s(self) -> float:
        if self._measuring_since is None:
            return self.now_s
        return self.now_s + (time.perf_counter() - self._measuring_since)

    def advance(self, dt_s: float) -> None:
        """Move forward by ``dt_s`` seconds.

        Raises: ValueError for a negative or non-finite ``dt_s``."""
        if not math.isfinite(dt_s) or dt_s < 0:
            raise ValueError(f"a clock only moves forward by a finite dt_s >= 0, got {dt_s!r}")
        self.now_s += dt_s

    def jump_to(self, t_s: float) -> None:
        """Move to ``t_s`` if that is later (skipping idle time); never backwards."""
        self.now_s = max(self.now_s, float(t_s))

    def wait_until(self, t_s: float) -> None:
        """Virtual waiting is a jump: :meth:`jump_to`."""
        self.jump_to(t_s)

    @contextmanager
    def measuring(self) -> Iterator[None]:
        """Real time flows inside the block and is added when it ends."""
        self._measuring_since = time.perf_counter()
        try:
            yield
        finally:
            self.now_s += time.perf_counter() - self._measuring_since
            self._measuring_since = None
