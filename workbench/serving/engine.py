"""The engine thread: the one thread that calls the served Scheduler.

Knows: the scheduler's public calls (``submit_n``, ``admit``, ``step``, ``filter``,
``abort``, ``requests``), a thread-safe inbox of commands, and per-request outboxes on the
server's event loop. Must not know: HTTP, JSON, OpenAI's shapes.

One loop, one thread::

    HTTP handlers ──Submit / Abort──▶ inbox (queue.Queue) ──▶ engine thread
                                                               │ submit_n / abort
                                                               │ admit(); step(); filter()
    handler's outbox (asyncio.Queue) ◀──Piece / Done── publish ┘ (loop.call_soon_threadsafe)
    a reader (the Panel) ──Between(fn)──▶ inbox ──▶ fn(sched) between two engine calls ──▶ its Future

Every engine call stays one of the scheduler's transactions: the thread makes whole calls
only, and nothing else touches the scheduler while it is served. A handler learns its uids
(or the refusal: the ``ValueError`` of ``submit``, naming the field and its limit) through a
``concurrent.futures.Future``; its rows' text and tokens then arrive as :class:`Piece` s and
one :class:`Done` per row, in order, as ``Scheduler.stream(uid, logprobs=True)`` hands them out.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ..engine.request import Request, validate
from ..engine.scheduler import Scheduler
from .translate import BadField, Prepared, field_of

if TYPE_CHECKING:  # prometheus-client is the serve extra's: imported where a server starts
    from .metrics import EngineMetrics

_COMPILE_LOCK = threading.Lock()
_SERVING = 0  # engine threads started and not stopped: MLX's compile stays off while any serves


class Busy(Exception):
    """The queue holds ``max_queued`` requests already: HTTP 429 with this message."""


@dataclass(frozen=True)
class Piece:
    """New output of row ``index`` (its place among the request's ``n`` samples): the text
    that settled and the tokens read since the last piece, with their log-probs and top-k
    ``((id, log-prob), ...)`` per token."""

    index: int
    text: str
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple


@dataclass(frozen=True)
class Done:
    """Row ``index`` finished: ``finish_reason`` (``stop``, ``length``, ``error``, ``abort``),
    ``message`` (the error text), prompt and generated token counts."""

    index: int
    finish_reason: str
    message: str
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Submit:
    """A command: queue ``prepared.n`` samples; ``uids`` resolves to their uids or to the
    refusal; pieces go to ``outbox`` on ``loop``."""

    prepared: Prepared
    loop: asyncio.AbstractEventLoop
    outbox: asyncio.Queue
    uids: Future = field(default_factory=Future)


@dataclass
class Between:
    """A command: run ``fn(sched)`` on the engine thread between two engine calls (never
    during one); ``result`` resolves to its return value or its exception."""

    fn: Any
    result: Future = field(default_factory=Future)
    claimed: threading.Lock = field(default_factory=threading.Lock)  # it runs once, on one thread


@dataclass
class _Row:
    index: int
    submit: Submit
    sent_chars: int = 0
    sent_tokens: int = 0


class EngineThread:
    """Owns ``sched`` while it runs: a daemon thread looping ``commands; admit(); step();
    filter(); publish`` until :meth:`stop`.

    Args:
        sched: the served :class:`Scheduler` (do not call it from other threads meanwhile).
        metrics: where each call's events go (:class:`EngineMetrics`).
        max_queued: most requests waiting in the queue; a submit beyond it is refused
            (:class:`Busy`, HTTP 429).
        idle_wait_s: how long an idle engine blocks on its inbox before checking for
            :meth:`stop`.
    """

    def __init__(self, sched: Scheduler, metrics: EngineMetrics, max_queued: int, idle_wait_s: float = 0.05):
        self.sched, self.metrics, self.max_queued, self.idle_wait_s = sched, metrics, max_queued, idle_wait_s
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.rows: dict[int, _Row] = {}
        self.fault = ""  # the last exception an engine call raised (the engine was left as before it)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-engine", daemon=True)

    def start(self) -> None:
        """Turn MLX's ``compile`` off (process-wide) and start the thread: with MLX 0.32.4 a
        compiled function (mlx-lm compiles some activations) run on a second thread can abort
        the interpreter at exit ("terminate called without an active exception");
        docs/serve.md."""
        global _SERVING
        with _COMPILE_LOCK:
            _SERVING += 1
            mx.disable_compile()
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort every live row, end the thread and wait for it (at most ``timeout_s``), then,
        once no engine thread serves any more, turn ``compile`` back on (unless
        ``MLX_DISABLE_COMPILE`` is set). Idempotent."""
        global _SERVING
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout_s)
        with _COMPILE_LOCK:
            _SERVING -= 1
            if not _SERVING and not os.environ.get("MLX_DISABLE_COMPILE"):
                mx.enable_compile()

    def submit(self, command: Submit) -> None:
        """Hand a :class:`Submit` to the engine (any thread)."""
        self.inbox.put(command)

    def between(self, fn: Any) -> Future:
        """Run ``fn(sched)`` on the engine thread between two of its engine calls (after a
        step's ``filter`` and publish, before the next ``admit``) and return a
        ``concurrent.futures.Future`` of its result: how another thread reads the served
        scheduler safely (a Panel's snapshot copy) or, rarely, changes it (a restore while
        idle). Once the thread has stopped (or before it starts), ``fn`` runs at once on the
        caller's thread. Any thread."""
        command = Between(fn)
        if self._thread.is_alive() and not self._stop.is_set():
            self.inbox.put(command)
            if self._thread.is_alive():
                return command.result
        self._run_between(
            command
        )  # the loop has ended (it drains its inbox's Between commands on its way out)
        return command.result

    @property
    def alive(self) -> bool:
        """Whether the engine thread runs (the scheduler is then its own, not the caller's)."""
        return self._thread.is_alive()

    def _run_between(self, command: Between) -> None:
        if not command.claimed.acquire(blocking=False):
            return
        try:
            command.result.set_result(command.fn(self.sched))
        except BaseException as exc:  # handed to the caller, whose Future raises it
            command.result.set_exception(exc)

    def abort(self, uids: list[int]) -> None:
        """Abort ``uids`` (a client went away); their rows finish ``abort`` and their KV is
        freed by the engine's next ``filter()``. Any thread."""
        self.inbox.put(("abort", uids))

    def _loop(self) -> None:
        sched = self.sched
        while not self._stop.is_set():
            self._commands(block=sched.idle)
            if not sched.idle:
                self._call(self._iterate)
            self._publish()
        for uid in list(self.rows):
            self._call(lambda u=uid: sched.abort(u))
        self._call(sched.filter)
        self._publish()
        list(
            sched.history
        )  # snapshots are built on first read from this thread's MLX arrays: build them here
        while True:  # readers that asked while it stopped: the scheduler is theirs again
            try:
                command = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, Between):
                self._run_between(command)

    def _iterate(self) -> None:
        self.sched.admit()
        if self.sched.batch.rows:
            self.sched.step()
        self.sched.filter()

    def _call(self, call: Any) -> None:
        """Run one engine call; an exception (the engine is then as before the call) ends every
        live row with reason ``error`` naming it, so no client waits on an engine that cannot go on."""
        try:
            call()
        except Exception as exc:  # the transaction rolled back; nothing else would end these rows
            self.fault = f"{type(exc).__name__}: {exc}"
            for uid, row in list(self.rows.items()):
                state = self.sched.requests[uid]
                self._send(
                    row, Done(row.index, "error", self.fault, len(state.valid.prompt_ids), len(state.tokens))
                )
                del self.rows[uid]
                try:
                    self.sched.abort(uid)
                except Exception:  # noqa: S110 - the row is already ended for its client
                    pass
        finally:
            self.metrics.observe(self.sched)

    def _commands(self, block: bool) -> None:
        try:
            command = self.inbox.get(timeout=self.idle_wait_s) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(command, Submit):
                self._submit(command)
            elif isinstance(command, Between):
                self._run_between(command)
            else:
                for uid in command[1]:
                    if uid in self.rows:
                        self._call(lambda u=uid: self.sched.abort(u))
            try:
                command = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _submit(self, command: Submit) -> None:
        prepared = command.prepared
        try:
            cfg = self.sched.config
            if prepared.request.priority and cfg.policy == "fcfs" and cfg.kv_budget_bytes is None:
                raise BadField(
                    "priority",
                    "priority changes nothing on this server (policy 'fcfs' and no kv_budget_bytes: "
                    "no preemption); serve with policy='priority' or leave priority out",
                )
            if prepared.n > self.max_queued:  # no retry could ever take it: not a 429
                raise BadField(
                    "n",
                    f"n is {prepared.n} but this server queues at most {self.max_queued} requests "
                    "(max_queued): ask for at most that many samples",
                )
            if len(self.sched.queue) + prepared.n > self.max_queued:
                raise Busy(
                    f"the queue holds {len(self.sched.queue)} requests and max_queued is {self.max_queued}; "
                    "retry later"
                )
            uids = self.sched.submit_n(self._capped(prepared), prepared.n)
        except Exception as exc:  # the refusal goes to the handler: BadField, ImportError, Busy
            named = isinstance(exc, BadField) or not isinstance(exc, ValueError)
            command.uids.set_exception(exc if named else BadField(self._blame(str(exc), prepared), str(exc)))
            return
        finally:
            self.metrics.observe(self.sched)
        if prepared.min_tokens is not None:
            prepared.min_tokens.bind(len(self.sched.request_of(uids[0]).prompt_ids))
        for i, uid in enumerate(uids):
            self.rows[uid] = _Row(i, command)
        command.uids.set_result(uids)

    def _blame(self, message: str, prepared: Prepared) -> str:
        """The body's field that ``submit`` refused with ``message`` (:meth:`Prepared.field`
        of the field the message starts with). A refusal of the prompt or of the request as a
        whole (prompt + ``max_tokens`` over the model's context or the KV budget) blames
        ``max_tokens`` when the same request with ``max_tokens`` 1 would be taken, else the
        prompt; ``top_p / top_k need temperature > 0`` blames the one that was set."""
        name, request = field_of(message) or "body", prepared.request
        if name in ("prompt", "request"):
            name = "prompt" if self._refused(replace(request, max_tokens=1)) else "max_tokens"
        elif name == "top_p" and message.startswith("top_p / top_k") and request.top_p == 1:
            name = "top_k"
        return prepared.field(name)

    def _refused(self, request: Request) -> bool:
        """Whether ``submit`` would refuse ``request`` (validated and checked against the KV
        budget; nothing is queued)."""
        sched = self.sched
        try:
            valid = validate(
                request, sched.tokenizer, sched.vocab_size, sched.context_tokens, sched.context_field
            )
        except ValueError:
            return True
        return bool(sched.ledger.refusal(len(valid.prompt_ids), request.max_tokens))

    def _capped(self, prepared: Prepared) -> Request:
        """The request, its default ``max_tokens`` capped at the context the prompt leaves
        (tokenizing the prompt once more; a bad prompt is left to ``submit``'s refusal)."""
        sched, request = self.sched, prepared.request
        if not prepared.default_max_tokens or sched.context_tokens is None:
            return request
        try:
            valid = validate(replace(request, max_tokens=1), sched.tokenizer, sched.vocab_size)
        except ValueError:  # refused whatever max_tokens is: submit raises the same error
            return replace(request, max_tokens=1)
        room = sched.context_tokens - len(valid.prompt_ids)
        return replace(request, max_tokens=max(1, min(request.max_tokens, room)))

    def _publish(self) -> None:
        """Hand each live row's new text and tokens to its outbox; a finished row's
        :class:`Done` follows its last piece."""
        tokenizer = self.sched.tokenizer
        for uid, row in list(self.rows.items()):
            state = self.sched.requests[uid]
            ready = state.text(tokenizer).ready
            text, t0, t1 = ready[row.sent_chars :], row.sent_tokens, len(state.tokens)
            if text or t1 > t0:
                piece = Piece(
                    row.index,
                    text,
                    tuple(state.tokens[t0:t1]),
                    tuple(state.logprobs[t0:t1]),
                    tuple(state.top_logprobs[t0:t1]),
                )
                self._send(row, piece)
                row.sent_chars, row.sent_tokens = len(ready), t1
            if state.finished:
                reason = state.finish_reason or "abort"
                self._send(row, Done(row.index, reason, state.message, len(state.valid.prompt_ids), t1))
                del self.rows[uid]

    @staticmethod
    def _send(row: _Row, item: Piece | Done) -> None:
        try:
            row.submit.loop.call_soon_threadsafe(row.submit.outbox.put_nowait, item)
        except RuntimeError:  # the server's loop is closed: nobody is listening any more
            pass
