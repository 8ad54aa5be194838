"""The engine's whole mutable state in one object, and checkpoints of it.

Knows: every piece of state a scheduler changes (request states, queue, prefilling group,
batch, prompt cache, seed generator, counters) and how to copy each cheaply. Must not
know: how the scheduler changes them.

Engine calls are transactions: :func:`transactional` is the decorator the scheduler's
public calls wear (savepoint, rollback on any exception), :func:`sigint_deferred` holds a
second SIGINT while a rollback runs (Python's ``signal`` module).

A checkpoint copies no tensor (new handles on the same immutable MLX buffers,
:func:`workbench.engine.kv.cache_internals.clone_caches`); while it lives, the batch's
first write into each shared buffer copies it once (``docs/benchmarks.md``, "checkpoint").
"""

from __future__ import annotations

import contextlib
import copy
import functools
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..observe.recorder import Recorder
from . import checkpoint_io
from .batch import Batch
from .integrity import check_state
from .kv.promptcache import PromptCache
from .runner import Prefilling
from .shared_prompts import HeldPrompt
from .state import RequestState


@dataclass
class EngineState:
    """Everything a scheduler's calls change.

    Attributes:
        requests: uid -> :class:`RequestState`, every request ever submitted (the one map).
        queue: waiting request states (QUEUED or PREEMPTED), arrival (uid) order.
        prefilling: the group being prefilled, or ``None``.
        batch: the running batch (:class:`Batch`).
        prompt_cache: the prompt cache, or ``None``.
        rng: draws the seed of requests submitted without one.
        step_index: decode steps completed. next_uid: the uid ``submit`` gives next.
        joins: rows joined so far (the next row's ``join_order``).
        shared_prompts: sample group -> its prefilled prompt, held for the samples still
            queued (:mod:`workbench.engine.shared_prompts`); never written, shared by copies.
    """

    batch: Batch
    rng: np.random.Generator
    prompt_cache: PromptCache | None = None
    requests: dict[int, RequestState] = field(default_factory=dict)
    queue: list[RequestState] = field(default_factory=list)
    prefilling: Prefilling | None = None
    step_index: int = 0
    next_uid: int = 0
    joins: int = 0
    shared_prompts: dict[int, HeldPrompt] = field(default_factory=dict)

    @property
    def live(self) -> list[RequestState]:
        """The request states an engine call can change: queued, prefilling, in the batch."""
        return self.queue + (self.prefilling.states if self.prefilling else []) + self.batch.rows

    def clone(self) -> "EngineState":
        """An independent copy sharing only immutable data (requests, samplers, MLX
        buffers). Requests that left the batch for good are shared too: nothing changes
        them again."""
        requests = dict(self.requests)
        requests.update({s.uid: s.copy() for s in self.live})

        def state_of(s: RequestState) -> RequestState:
            return requests[s.uid]

        return EngineState(
            batch=self.batch.clone(state_of),
            rng=copy.deepcopy(self.rng),
            prompt_cache=None if self.prompt_cache is None else self.prompt_cache.clone(),
            requests=requests,
            queue=[state_of(s) for s in self.queue],
            prefilling=None if self.prefilling is None else self.prefilling.clone(state_of),
            step_index=self.step_index,
            next_uid=self.next_uid,
            joins=self.joins,
            shared_prompts=dict(self.shared_prompts),
        )

    def savepoint(self, prompt_cache: bool = False) -> "Savepoint":
        """What one engine call may change, noted before it, for :meth:`rollback`: each
        live request's mutable fields (a :meth:`RequestState.memo`), the queue, the
        prefilling group and the batch (append-only cache buffers shared, see
        ``clone_cache(share_appended=True)``, so the call still updates them in place),
        the seed generator's state, the counters, and the prompt cache when
        ``prompt_cache``. Costs O(live requests), not O(session)."""
        same = lambda s: s  # noqa: E731  the request states stay the same objects; their memos undo them
        return Savepoint(
            memos=[(s, s.memo()) for s in self.live],
            queue=list(self.queue),
            prefilling=None if self.prefilling is None else self.prefilling.clone(same, share_appended=True),
            batch=self.batch.clone(same, share_appended=True),
            rng_state=self.rng.bit_generator.state,
            prompt_cache=self.prompt_cache.clone()
            if prompt_cache and self.prompt_cache is not None
            else self.prompt_cache,
            counters=(self.step_index, self.next_uid, self.joins),
            shared_prompts=dict(self.shared_prompts),
        )

    def rollback(self, savepoint: "Savepoint") -> None:
        """Return to ``savepoint`` (from :meth:`savepoint`, used once): requests submitted
        since are forgotten, the live requests' fields restored, everything else swapped
        back."""
        for uid in range(savepoint.counters[1], self.next_uid):
            self.requests.pop(uid, None)
        for state, memo in savepoint.memos:
            state.undo(memo)
        self.queue, self.prefilling, self.batch = savepoint.queue, savepoint.prefilling, savepoint.batch
        self.rng.bit_generator.state = savepoint.rng_state
        self.prompt_cache = savepoint.prompt_cache
        self.step_index, self.next_uid, self.joins = savepoint.counters
        self.shared_prompts = savepoint.shared_prompts


@dataclass(frozen=True)
class Savepoint:
    """An engine call's undo record (:meth:`EngineState.savepoint`)."""

    memos: list[tuple[RequestState, tuple]]
    queue: list[RequestState]
    prefilling: Prefilling | None
    batch: Batch
    rng_state: dict
    prompt_cache: PromptCache | None
    counters: tuple[int, int, int]
    shared_prompts: dict[int, HeldPrompt]


@dataclass(frozen=True, repr=False)
class Checkpoint:
    """A scheduler's whole state at one moment (``Scheduler.checkpoint()``); give it to
    ``Scheduler.restore`` of the same scheduler to return there, any number of times.

    ``cp.save(path)`` writes it to a file and ``Checkpoint.load(path, sched)`` reads it back
    (every field checked) for ``sched.restore`` in another process
    (:mod:`workbench.engine.checkpoint_io`).

    Attributes:
        scheduler_id: the scheduler that took it. model_id: ``id()`` of its model.
        step: its decode step index. n_events: events logged before it.
        identity: ``() -> dict``, the model, tokenizer and settings of the scheduler that
            took it (:func:`workbench.engine.checkpoint_io.identity_of`), for :meth:`save`.
    """

    scheduler_id: str
    model_id: int
    step: int
    n_events: int
    state: EngineState
    recorder: Recorder
    identity: Callable[[], dict] | None = field(default=None, compare=False)

    def save(self, path: str | Path) -> Path:
        """Write this checkpoint to ``path`` (one ``.safetensors`` file: the batch caches
        through mlx-lm's ``save_prompt_cache``, the rest as JSON metadata with a format
        version; ``.safetensors`` is appended to a name without it). Returns the path
        written, which :meth:`load` accepts. Example:
        ``Checkpoint.load(sched.checkpoint().save("run1/batch"), other)`` (the file is
        ``run1/batch.safetensors``).

        Raises:
            ValueError: a running request with a callable field (naming the uid and the
                field), a quantized KV cache or the packed layout, or a ``path`` that is a
                folder (:func:`workbench.engine.checkpoint_io.save`).
        """
        return checkpoint_io.save(self, path)

    @classmethod
    def load(cls, path: str | Path, sched: Any) -> "Checkpoint":
        """The checkpoint saved at ``path`` (what :meth:`save` returned, or the path given
        to it), owned by ``sched`` (a scheduler with the same model, tokenizer and settings,
        in any process): ``sched.restore(Checkpoint.load(path, sched))`` continues with the
        tokens the saving run would have produced. ``sched`` is not changed by loading,
        refused or not.

        Every field of the file is checked before anything is built
        (:mod:`workbench.engine.checkpoint_fields`), then the state as a whole
        (:func:`workbench.engine.integrity.check_state`).

        Raises:
            FileNotFoundError: no file there. ValueError: not a workbench checkpoint (or a
                damaged one), another format version, a model / tokenizer / setting that
                differs (each named), or a field out of range or inconsistent with the
                model, the batch or another field (named: ``checkpoint field <where>:
                <what>``) (:func:`workbench.engine.checkpoint_io.read`).
        """
        parts = checkpoint_io.read(path, sched)
        state = EngineState(
            parts.batch,
            np.random.default_rng(),
            prompt_cache=sched.state.prompt_cache,
            requests=parts.requests,
            queue=parts.queue,
            **parts.counters,
        )
        state.rng.bit_generator.state = parts.rng_state
        integrity = check_state(state, sched.tokenizer)
        if not integrity.ok:
            raise ValueError(f"checkpoint {path} is inconsistent: " + "; ".join(integrity.problems))
        recorder = Recorder(sched.clock, sched.config.history_size)
        recorder.events = parts.events
        return cls(
            sched.id,
            id(sched.model),
            state.step_index,
            len(recorder.events),
            state,
            recorder,
            sched._identity,
        )

    def __repr__(self) -> str:
        s = self.state
        return (
            f"Checkpoint(step {self.step}, {len(s.batch)} row(s), {len(s.queue)} queued, "
            f"{len(s.requests)} request(s), {self.n_events} events, scheduler {self.scheduler_id})"
        )


def check_owner(checkpoint: Any, scheduler_id: str, model: Any) -> None:
    """Refuse a checkpoint this scheduler did not take.

    Raises:
        ValueError: naming what differs (not a :class:`Checkpoint`, another model, or
            another scheduler).
    """
    if not isinstance(checkpoint, Checkpoint):
        raise ValueError(
            f"checkpoint must be a workbench Checkpoint (from Scheduler.checkpoint()), "
            f"got {type(checkpoint).__name__}"
        )
    if checkpoint.model_id != id(model):
        raise ValueError(
            f"checkpoint was taken with another model ({checkpoint.model_id:#x}, this scheduler's "
            f"is {id(model):#x}); its caches do not fit this model. Nothing was changed."
        )
    if checkpoint.scheduler_id != scheduler_id:
        raise ValueError(
            f"checkpoint belongs to scheduler {checkpoint.scheduler_id}, not this one ({scheduler_id}); "
            "restore it into the scheduler that took it, or continue from it with that "
            "scheduler's fork(). Nothing was changed."
        )


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


def transactional(prompt_cache: bool = False, idle: str | None = None) -> Callable:
    """Decorate a public engine call: any exception escaping it, ``KeyboardInterrupt``
    included, first returns the engine to its state before the call (see
    :meth:`workbench.engine.scheduler.Scheduler._transaction`), then propagates. When
    ``scheduler._nothing_to(idle)`` (e.g. ``idle="admit"``), it returns ``[]`` at once (no savepoint)."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if idle is not None and self._nothing_to(idle):
                return []
            with self._transaction(prompt_cache):
                return method(self, *args, **kwargs)

        return call

    return wrap
