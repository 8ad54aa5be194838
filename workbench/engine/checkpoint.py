"""The engine's whole mutable state in one object, and checkpoints of it.

Engine calls are transactions: :func:`transactional` is the decorator the scheduler's
public calls wear (savepoint, rollback on any exception). A checkpoint copies no tensor (new
handles on the same immutable MLX buffers); while it lives, the batch's first write into each
shared buffer copies it once (``docs/benchmarks.md``, "checkpoint"). Notes:
``docs/lab/engine-notes.md``, "checkpoint.py".
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
        shared_prompts: sample group -> its prefilled prompt (:mod:`workbench.engine.shared_prompts`).
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
        """An independent copy sharing only immutable data (and finished requests)."""
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
        """What one engine call may change, noted for :meth:`rollback`; O(live requests)."""
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
        """Return to ``savepoint`` (used once); requests submitted since are forgotten."""
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
    """A scheduler's whole state at one moment (``Scheduler.checkpoint()``), for
    ``Scheduler.restore`` any number of times; :meth:`save` / :meth:`load` across processes.

    Attributes:
        scheduler_id: the scheduler that took it. model_id: ``id()`` of its model.
        step: its decode step index. n_events: events logged before it.
        identity: ``() -> dict``, the model, tokenizer and settings, for :meth:`save`.
    """

    scheduler_id: str
    model_id: int
    step: int
    n_events: int
    state: EngineState
    recorder: Recorder
    identity: Callable[[], dict] | None = field(default=None, compare=False)

    def save(self, path: str | Path) -> Path:
        """Write this checkpoint to one ``.safetensors`` file (mlx-lm's ``save_prompt_cache``
        plus JSON metadata); returns the path written. Example:
        ``Checkpoint.load(sched.checkpoint().save("run1/batch"), other)``.

        Raises:
            ValueError: a running request's callable field (naming uid and field), a
                quantized KV cache, the packed layout, or a folder ``path``.
        """
        return checkpoint_io.save(self, path)

    @classmethod
    def load(cls, path: str | Path, sched: Any) -> "Checkpoint":
        """The checkpoint saved at ``path``, owned by ``sched`` (same model, tokenizer and
        settings, any process; not changed by loading): ``sched.restore(...)`` continues with
        the tokens the saving run would have produced. Every field is checked first.

        Raises:
            FileNotFoundError: no file there. ValueError: a folder ``path`` (naming it, as
                :meth:`save` does), not a (sound) workbench checkpoint, another format version,
                a differing model / tokenizer / setting, or a field out of range
                (``checkpoint field <where>: <what>``).
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
        ValueError: naming what differs (not a :class:`Checkpoint`, model, scheduler).
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


def check_fork_rows(state: EngineState, max_batch: int) -> None:
    """Refuse a fork whose ``max_batch`` is below the rows it would start with: the batch's
    rows (running, or finished until ``filter()`` evicts them) plus a prefilling group's (they
    join next). A fork starts in ``state`` and sheds no row by itself, so it would decode above
    its limit. mlx-lm: none (its ``BatchGenerator`` has no fork).

    Raises:
        ValueError: naming ``max_batch``, the rows held (of each kind) and how to make room.
    """
    rows = state.batch.rows
    prefilling = len(state.prefilling.states) if state.prefilling is not None else 0
    held, finished = len(rows) + prefilling, sum(s.finished for s in rows)
    if held > max_batch:
        raise ValueError(
            f"fork: max_batch={max_batch} is below the {held} rows this scheduler holds ({len(rows) - finished} "
            f"in the batch unfinished, {finished} finished until filter(), {prefilling} prefilling); a fork "
            f"starts in this state and sheds no row: fork with max_batch >= {held}, or preempt(), abort() and "
            "filter() rows first"
        )


@contextlib.contextmanager
def sigint_deferred():
    """Hold SIGINT while the body runs and deliver it after (main thread only)."""
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


def transactional(prompt_cache: bool = False, idle: str | None = None, guarded: bool = False) -> Callable:
    """Decorate a public engine call: any exception escaping it (``KeyboardInterrupt`` too)
    first rolls the engine back to before the call; ``idle``: return ``[]`` at once when
    ``scheduler._nothing_to(idle)``; ``guarded``: first refuse a call from inside a request's
    ``on_token`` (``scheduler._refuse_inside_on_token``), idle or not."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if guarded:
                self._refuse_inside_on_token(method.__name__)
            if idle is not None and self._nothing_to(idle):
                return []
            with self._transaction(prompt_cache):
                return method(self, *args, **kwargs)

        return call

    return wrap
