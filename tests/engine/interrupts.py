"""Injecting KeyboardInterrupt into the engine at chosen points, for the interrupt tests
(``tests/engine/test_interrupts.py``) and the stateful fuzzer (``tests/verify/test_fuzz.py``).

An :class:`Injector` counts passes through its points while armed and raises
KeyboardInterrupt at the ``k``-th. Points: a decoder layer's entry and exit
(:func:`wrapped_layers`), before and after ``mx.eval`` / ``mx.async_eval``
(:func:`patched_eval`), every executed line of ``workbench/`` (:class:`LineTracer`), and
whatever callback calls :meth:`Injector.point` (``on_token``, processors, samplers, the
clock). :func:`engine_state` is what an interrupted call must leave unchanged.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
from pathlib import Path

import mlx.core as mx

import workbench as wb
import workbench.engine.checkpoint as checkpoint_module
import workbench.engine.scheduler as scheduler_module
from workbench.observe.recorder import Recorder


class Injector:
    """Counts passes through its points while armed and raises KeyboardInterrupt at the
    ``k``-th."""

    def __init__(self):
        self.k, self.count, self.fired = None, 0, 0

    def arm(self, k: int) -> None:
        self.k, self.count = k, 0

    def disarm(self) -> None:
        self.k = None

    def point(self) -> None:
        if self.k is None:
            return
        self.count += 1
        if self.count == self.k:
            self.k = None
            self.fired += 1
            raise KeyboardInterrupt(f"injected at point {self.count}")


class LayerWrapper:
    """``model.layers[i]`` stand-in: a point on entry and on exit of each call."""

    def __init__(self, layer, injector: Injector):
        self._layer, self._injector = layer, injector

    def __call__(self, *args, **kwargs):
        self._injector.point()
        out = self._layer(*args, **kwargs)
        self._injector.point()
        return out

    def __getattr__(self, name):
        return getattr(self._layer, name)


def layer_list(model) -> list:
    """The list the forward iterates (``model.layers`` may be a copy of it: a pipeline
    model's ``pipeline_layers`` slice)."""
    target, module = list(model.layers), model
    while True:
        own = vars(module).get("layers", None) if not isinstance(module, dict) else module.get("layers")
        if isinstance(own, list) and own == target:
            return own
        inner = next((module[k] for k in ("model", "backbone", "language_model") if k in module), None)
        if inner is None:
            raise AssertionError(f"no layer list found in {type(model).__name__}")
        module = inner


@contextlib.contextmanager
def wrapped_layers(model, injector: Injector):
    layers = layer_list(model)
    originals = list(layers)
    layers[:] = [LayerWrapper(layer, injector) for layer in originals]
    try:
        yield
    finally:
        layers[:] = originals


@contextlib.contextmanager
def patched_eval(injector: Injector):
    originals = mx.eval, mx.async_eval

    def around(real):
        def call(*args, **kwargs):
            injector.point()
            out = real(*args, **kwargs)
            injector.point()
            return out

        return call

    mx.eval, mx.async_eval = around(originals[0]), around(originals[1])
    try:
        yield
    finally:
        mx.eval, mx.async_eval = originals


ENGINE_DIR = str(Path(wb.__file__).parent)
# A rollback itself is not interrupted by the tracer (nothing can protect Python code from an
# exception raised at its every line; a real SIGINT there is held until it ends): the
# rollback methods and what they call, and _transaction from its ``except`` on.
_ROLLBACK_CODES = {
    checkpoint_module.EngineState.rollback.__code__,
    Recorder.rollback.__code__,
    inspect.unwrap(scheduler_module.sigint_deferred).__code__,
}
_TX_CODE = inspect.unwrap(scheduler_module.Scheduler._transaction).__code__
_TX_EXCEPT_LINE = _TX_CODE.co_firstlineno + next(
    i for i, line in enumerate(inspect.getsourcelines(_TX_CODE)[0]) if "except BaseException" in line
)


class LineTracer:
    """Every executed line of ``workbench/`` code is a point (``sys.settrace``)."""

    def __init__(self, injector: Injector):
        self.injector = injector
        self.paused = False  # inside a rollback

    def _local(self, frame, event, arg):
        if (
            event == "line"
            and not self.paused
            and not (frame.f_code is _TX_CODE and frame.f_lineno >= _TX_EXCEPT_LINE)
        ):
            self.injector.point()
        return self._local

    def _rollback(self, frame, event, arg):
        if event == "return":
            self.paused = False
        return self._rollback

    def _global(self, frame, event, arg):
        code = frame.f_code
        if self.paused:
            return None
        if code in _ROLLBACK_CODES:
            self.paused = True
            return self._rollback
        return self._local if code.co_filename.startswith(ENGINE_DIR) else None

    @contextlib.contextmanager
    def tracing(self):
        self.paused = False
        sys.settrace(self._global)
        try:
            yield
        finally:
            sys.settrace(None)


# What an event says apart from its clock time (equal runs give equal facts), in this order.
FACTS = (
    "kind",
    "uid",
    "step",
    "row",
    "token",
    "n_tokens",
    "n_cached",
    "finish_reason",
    "join_mode",
    "message",
)
# FACTS with the token's log-prob after the token (tests/engine/test_checkpoint.py)
FACTS_WITH_LOGPROB = (*FACTS[:5], "logprob", *FACTS[5:])


def facts_of(events, fields: tuple[str, ...] = FACTS) -> list[tuple]:
    """Each event as the tuple of its ``fields`` (a NaN, e.g. no log-prob, as None), for equality."""
    return [tuple(_plain(getattr(e, name)) for name in fields) for e in events]


def _plain(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def engine_state(sched):
    """What must not change when a call is interrupted."""
    return (
        sched.snapshot().text(),
        {u: s.copy() for u, s in sched.requests.items()},
        sched.queue,
        sched.step_index,
        sched.idle,
        facts_of(sched.events),
    )
