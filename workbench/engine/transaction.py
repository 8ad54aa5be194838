"""Engine calls as transactions: the decorator the scheduler's public calls wear, and a
guard that holds a second SIGINT while a rollback runs.

Knows: Python's ``signal`` module, the scheduler's ``_transaction`` context (savepoint,
rollback: :mod:`workbench.engine.checkpoint`). Must not know: what a call does.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from typing import Any, Callable


@contextlib.contextmanager
def sigint_deferred():
    """Hold SIGINT ("Kernel → Interrupt") while the body runs and deliver it after (its
    handler, e.g. ``KeyboardInterrupt``, then runs); on the main thread with a Python
    SIGINT handler only (elsewhere Python runs no SIGINT handler)."""
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous) or threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            previous(signal.SIGINT, held[0])


def transactional(prompt_cache: bool = False, idle: Callable[[Any], bool] | None = None) -> Callable:
    """Decorate a public engine call: any exception escaping it, ``KeyboardInterrupt``
    included, first returns the engine to its state before the call (see
    :meth:`workbench.engine.scheduler.Scheduler._transaction`), then propagates. When ``idle(scheduler)`` says the
    call has nothing to do, it returns ``[]`` at once (no savepoint)."""
    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if idle is not None and idle(self):
                return []
            with self._transaction(prompt_cache):
                return method(self, *args, **kwargs)
        return call
    return wrap
