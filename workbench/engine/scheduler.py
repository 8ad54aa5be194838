"""The step-at-a-time continuous-batching scheduler.

Owns the life of requests (queue, statuses, admission, reading tokens, events, transactions,
checkpoints); a layout (:mod:`workbench.engine.layouts`, chosen once) owns the batch and forward.

Life of a request (mlx-lm's names in brackets, vLLM's in braces)::

    submit ─▶ queue ─admit()─▶ prefilling group ─admit()…─▶ running rows ─step()─▶ tokens ─filter()─▶ evicted
             [insert] {add_request}     (chunked prefill)        [next] {schedule}       [remove] {update_from_output}

- ``admit()`` forms groups from the queue (:mod:`workbench.engine.admission`) and hands
  them to the layout, which prefills and joins them (padded: chunks of
  ``prefill_step_size``, then one ``[n, 1]`` join forward as mlx-lm's ``GenerationBatch``;
  packed: the rows enter the batch and prefill inside ``step()``'s forwards).
- ``step()`` has the layout run one forward (padded ``[B, 1]``, launched before the read
  with ``pipeline``; packed ``[1, T]``) and reads the tokens it yields. A joiner's first
  token is read, and timed, in a ``step()``: TTFT runs from ``submit`` to that ``token``.
- ``filter()`` evicts finished rows (padded, with ``reuse_slots``: their cache rows stay
  free slots for the next join).

Invariant between calls: every running row's latest token is in the cache, and the
distribution of its next token is pending. So a snapshot's masks are those of the next
forward, the one the next ``step()`` launches.

Axis letters: ``B`` rows, ``V`` vocabulary.
"""

from __future__ import annotations

import bisect
import contextlib
import inspect
import itertools
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import fields, replace
from types import MappingProxyType
from typing import Any

import mlx.core as mx
import numpy as np

from ..observe.events import Event
from ..observe.recorder import Recorder
from ..observe.report import Report, build_report
from ..observe.snapshot import Snapshot
from . import call_checks, shared_prompts
from .admission import Admission, policy_from
from .capture import engine_capture
from .checkpoint import Checkpoint, EngineState, check_fork_rows, check_owner, sigint_deferred, transactional
from .checkpoint_io import identity_of
from .config import SchedulerConfig
from .integrity import Integrity, check_state
from .kv import caches as kv
from .layouts.layout import Read
from .layouts.packed import PackedLayout
from .layouts.padded import PaddedLayout
from .levers import constrained, invariant, lora, quantized_kv
from .request import Request, ValidRequest, check_seed, context_limit, validate
from .sampling import RowSampler
from .siblings import check_samples
from .state import RequestState, Status
from .text import report_text
from .view import RequestView, StreamChunk, stream_pieces

_IDS = itertools.count()


def vocab_size(model: Any, tokenizer: Any) -> int:
    """Rows of the model's output (``model.args.vocab_size``), else the tokenizer's size."""
    size = getattr(getattr(model, "args", None), "vocab_size", None)
    return int(size if size is not None else len(tokenizer.get_vocab()))


def config_of(
    config: SchedulerConfig | Mapping[str, Any] | None, settings: Mapping[str, Any]
) -> SchedulerConfig:
    """The :class:`SchedulerConfig` that ``Scheduler(config, **settings)`` means: ``config``
    (a config, a mapping of settings, or ``None``: the defaults) with ``settings`` replaced.

    Raises:
        TypeError: an unknown setting, or a ``config`` of another type.
        ValueError: a setting outside its limits (from :class:`SchedulerConfig`).
    """
    unknown = sorted(set(settings) - set(SchedulerConfig.names()))
    if unknown:
        raise TypeError(
            f"Scheduler() got unknown setting(s) {unknown}; the settings are {list(SchedulerConfig.names())}"
        )
    if config is None:
        return SchedulerConfig(**settings)
    if isinstance(config, Mapping):
        return config_of(None, {**config, **settings})
    if not isinstance(config, SchedulerConfig):
        raise TypeError(
            f"config must be a SchedulerConfig, a mapping of settings or None, got {type(config).__name__}"
        )
    return replace(config, **settings) if settings else config


class Scheduler:
    """A continuous-batching engine over an mlx-lm model, driven one call at a time.

    ``Scheduler(model, tokenizer, config=None, *, clock=time.perf_counter, prompt_cache=None,
    adapters=None, **settings)``: the settings (``help(wb.SchedulerConfig)``) as a config,
    keywords, or both (keywords win), held in :attr:`config`; ``clock`` ``() -> seconds``;
    ``prompt_cache`` an mlx-lm ``LRUPromptCache`` or its ``max_size`` (``layout="packed"``: the
    most unreferenced pages kept); ``adapters`` LoRA adapters ``{name: folder}``. Every call
    that changes the engine is a transaction: an exception escaping it, ``KeyboardInterrupt``
    included, leaves the engine as before. A model that cannot batch rows of different lengths
    runs in a serial lane (``max_batch`` 1; :attr:`serial_reason` says why).

    Raises:
        ValueError: a setting outside its limits or not valid for the model, layout or the
            other settings, naming it. TypeError: an unknown setting.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: SchedulerConfig | Mapping[str, Any] | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        prompt_cache: Any = None,
        adapters: Mapping[str, str] | lora.AdapterBank | None = None,
        **settings: Any,
    ):
        asked = config_of(config, settings)
        asked.refuse_unhonoured(adapters=adapters is not None)
        self.model, self.tokenizer, self._asked = model, tokenizer, asked
        kv.check_batchable(model, asked.max_kv_size)
        quant = quantized_kv.configure(model, asked.kv_bits, asked.kv_group_size, asked.max_kv_size)
        self.adapters = lora.configure(model, adapters)
        self._extras = dict(
            clock=clock, prompt_cache=prompt_cache, adapters=self.adapters
        )  # forks share the bank
        self.recipe = kv.CacheRecipe(model, asked.max_kv_size, quant)
        self.packed = asked.layout == "packed"
        Layout = PackedLayout if self.packed else PaddedLayout  # the one choice of layout
        Layout.check(model, asked, prompt_cache, adapters)
        self.serial_reason = Layout.serial_reason(model, asked)
        cfg = self.config = replace(asked, max_batch=1, prompt_concurrency=1) if self.serial_reason else asked
        self.vocab_size = vocab_size(model, tokenizer)
        self.context_tokens, self.context_field = context_limit(model)
        self.id = f"scheduler-{next(_IDS)}"
        self.admission = Admission(policy_from(cfg.policy), cfg)
        self.batch_invariant = invariant.configure(
            model, cfg.batch_invariant, cfg.max_kv_size, quant, cfg.kv_budget_bytes
        )
        self.recorder = Recorder(clock, cfg.history_size)
        self.layout = Layout(
            model, cfg, self.recipe, self.adapters, self.batch_invariant, quant, prompt_cache, self.vocab_size
        )
        self.ledger, self.pacer, self.pacing = self.layout.ledger, self.layout.pacer, self.layout.pacing
        self.speculation = self.layout.speculation
        rng = np.random.default_rng(cfg.seed)
        self.state = EngineState(self.layout.new_batch(), rng, prompt_cache=self.layout.prompt_cache())
        self._in_call = False
        self._in_on_token: int | None = None  # the uid whose on_token runs now (inside step())

    runner = property(lambda self: self.layout.runner, doc="The padded layout's :class:`ModelRunner`.")

    @contextlib.contextmanager
    def _transaction(self, prompt_cache: bool = False):
        """Run the body as one transaction (rolled back on any ``BaseException``; nested calls join)."""
        if self._in_call:
            yield
            return
        savepoint, mark = self.state.savepoint(prompt_cache), self.recorder.mark()
        try:  # set inside the try: an interrupt landing right after it still clears it
            self._in_call = True
            yield
        except BaseException:
            with sigint_deferred():  # a second Ctrl-C must not cut the rollback short
                self.state.rollback(savepoint)
                self.recorder.rollback(mark)
            raise
        finally:
            self._in_call = False

    def _refuse_inside_on_token(self, call: str) -> None:
        """:func:`~workbench.engine.call_checks.refuse_inside_on_token` for this scheduler."""
        call_checks.refuse_inside_on_token(self._in_on_token, call)

    # -- read-only views of the state ---------------------------------------------------
    clock = property(lambda self: self.recorder.clock, doc="The injected clock ``() -> seconds``.")
    events = property(lambda self: self.recorder.events, doc="Every :class:`Event` so far (do not mutate).")
    history = property(lambda self: self.recorder.history, doc="The latest snapshots (:class:`History`).")
    step_index = property(lambda self: self.state.step_index, doc="Decode steps completed.")
    prompt_cache = property(
        lambda self: self.state.prompt_cache, doc="The :class:`PromptCache`, or ``None``."
    )
    batch = property(
        lambda self: self.state.batch, doc="The running :class:`Batch` (read it; do not mutate)."
    )

    @property
    def requests(self) -> Mapping[int, RequestState]:
        """uid -> :class:`RequestState` of every submitted request (a read-only mapping)."""
        return MappingProxyType(self.state.requests)

    @property
    def queue(self) -> tuple[int, ...]:
        """Uids waiting for admission (queued or preempted), in arrival order."""
        return tuple(s.uid for s in self.state.queue)

    @property
    def batch_cache(self) -> list[Any] | None:
        """The running batch's per-layer mlx-lm caches, row ``b`` = running row ``b``
        (``None`` when no row runs; free slots left out by a lazy view); do not mutate."""
        return self.state.batch.view

    @property
    def kv_projected_bytes(self) -> int:
        """Most bytes the batch and prefilling caches may hold from now on (what admission keeps
        within ``kv_budget_bytes``)."""
        return self.ledger.projected_bytes(self.state)

    @property
    def idle(self) -> bool:
        """True when nothing is queued, prefilling or in the batch."""
        return self._nothing_to("run")

    def _nothing_to(self, call: str) -> bool:
        """Whether ``call`` (``"run"``, ``"admit"``, ``"filter"``) has nothing to do."""
        st = self.state
        if call == "filter":
            return not any(r.finished for r in st.batch.rows)
        held = st.batch.free if call == "admit" else st.batch.rows
        return not st.queue and st.prefilling is None and not held

    # -- requests ---------------------------------------------------------------------
    @transactional()
    def submit(self, request: Request | dict) -> int:
        """Validate ``request`` and queue it. Returns its uid (an int, unique per scheduler).

        Raises:
            ValueError: naming the bad field and its allowed range (an ``adapter`` not
                loaded by this scheduler included); nothing changes.
        """
        if isinstance(request, dict):
            request = Request.from_dict(request)
        valid = validate(request, self.tokenizer, self.vocab_size, self.context_tokens, self.context_field)
        lora.check_request(self.adapters, valid.request.adapter)
        constraint = constrained.constraint_of(valid.request, self.tokenizer, self.vocab_size)
        need = self.ledger.alone_bytes(len(valid.prompt_ids), valid.request.max_tokens)
        refusal = self.ledger.refusal(len(valid.prompt_ids), valid.request.max_tokens)
        if refusal:
            raise ValueError(refusal)
        st = self.state
        drawn = int(st.rng.integers(2**31))  # drawn for every request: seeds do not depend on others' fields
        seed = valid.request.seed if valid.request.seed is not None else drawn
        uid = st.next_uid
        grammar = constrained.row_grammar(constraint, self.tokenizer, self.vocab_size, len(valid.prompt_ids))
        sampler = RowSampler(valid.request, seed, self.vocab_size, grammar)
        state = RequestState(uid, valid, seed, sampler, need, self.clock())
        st.next_uid += 1
        st.requests[uid] = state
        st.queue.append(state)
        self._log("submit", uid, n_tokens=len(valid.prompt_ids))
        return uid

    @transactional()
    def submit_n(self, request: Request | dict, n: int) -> list[int]:
        """Queue ``n`` samples of ``request`` (vLLM's ``n``), sample ``i`` drawing what
        ``Request(seed=seed + i)`` draws alone, sharing one prefill; returns their consecutive uids.

        Raises:
            ValueError: ``n`` not an int in ``[1, 1024]``, or what :meth:`submit` raises.
        """
        n = check_samples(n)
        if isinstance(request, dict):
            request = Request.from_dict(request)
        if not isinstance(request, Request):
            raise ValueError(f"request must be a workbench.Request, got {type(request).__name__}")
        check_seed(request.seed)  # before seed + i (submit validates the rest)
        seed = request.seed if request.seed is not None else int(self.state.rng.integers(2**31))
        uids = [self.submit(replace(request, seed=seed + i)) for i in range(n)]
        for uid in uids:
            self.state.requests[uid].sample_group = uids[0]
        return uids

    # -- the engine calls -------------------------------------------------------------
    @transactional(prompt_cache=True, idle="admit", guarded=True)
    def admit(self) -> list[Event]:
        """Admission and prefill: the layout prefills and joins groups the admission
        chose (:mod:`workbench.engine.layouts`). Returns this call's events (``admit``,
        ``prefill``, ``join``, and ``preempt`` for rows preempted to make room).

        Raises:
            RuntimeError: called from a request's ``on_token`` during ``step()``.
        """
        start = len(self.events)
        for limit in self.layout.admit(self.state, self.recorder):  # the layout asks for a group
            self._start_group(limit)
        dropped = self.state.batch.compact()  # free slots no joiner took
        if len(self.events) > start or dropped:
            self._record()
        self.layout.end_iteration(self.clock)
        return self.events[start:]

    def _start_group(self, prefill_limit: int | None = None) -> bool:
        """Apply admission's decision (within ``prefill_limit`` padded tokens); False if none chosen."""
        st = self.state
        if prefill_limit == 0:
            return False
        decision = self.admission.decide_now(st, self.ledger, self.clock)
        for uid in decision.preempt:  # compacted, not left as free slots: this call may still fill
            self._preempt(uid, reuse_slots=False)  # a free slot in place, which a rollback could not undo
        if not decision.admit:
            return False
        chosen = [st.requests[u] for u in decision.admit]
        if prefill_limit is not None:  # rows x longest input, the padded group's chunk
            n = 1
            while n < len(chosen) and (n + 1) * max(len(c.inputs) for c in chosen[: n + 1]) <= prefill_limit:
                n += 1
            chosen = chosen[:n]
        taken = {c.uid for c in chosen}
        st.queue = [s for s in st.queue if s.uid not in taken]
        for s in chosen:
            s.status = Status.PREFILLING
        self.ledger.make_room(st, chosen)  # the prompt cache yields the bytes the group will take
        self.layout.start(st, chosen)
        for s in chosen:
            self._log("admit", s.uid, n_tokens=len(s.inputs), n_cached=s.cached_tokens)
        return True

    @transactional(guarded=True)
    def step(self) -> list[Event]:
        """One decode forward: read one token per unfinished row and feed it. Returns the
        token events, then any finish events. With no running row (or, under a KV budget, only
        finished ones) a no-op returning ``[]``, warning when requests wait unadmitted.

        Raises:
            RuntimeError: called from a request's ``on_token`` during ``step()``.
        """
        st, batch = self.state, self.state.batch
        if not batch.rows and st.queue and st.prefilling is None:
            warnings.warn(
                f"step(): no row is running and {len(st.queue)} request(s) wait in the queue; call "
                "admit() first to prefill them and join them to the batch (run() drives "
                "admit(); step(); filter())",
                UserWarning,
                stacklevel=3,
            )
        if not batch.rows or (
            self.config.kv_budget_bytes is not None and all(r.finished for r in batch.rows)
        ):
            return []
        out, finished = [], []
        steps = self.layout.step(st, self.recorder)
        while True:  # the layout yields each token it read (and the events the step returns)
            try:
                item = next(steps)
            except StopIteration as done:
                ran = done.value
                break
            if isinstance(item, Event):
                out.append(item)
            else:
                self._read_token(item, out, finished)
        return self._end_step(out, finished) if ran else out + finished

    def _end_step(self, out: list[Event], finished: list[Event]) -> list[Event]:
        """Count the step, clear MLX's cache every ``clear_cache_every`` steps, record."""
        st = self.state
        st.step_index += 1
        if st.step_index % self.config.clear_cache_every == 0:
            mx.clear_cache()
        self._record()
        return out + finished

    def _read_token(self, read: Read, out: list[Event], finished: list[Event]) -> None:
        """Record row ``b``'s token, call its ``on_token``, and finish it where it ends."""
        row, b, token, logprob, message, top = read
        if not message:
            row.tokens.append(token)
            row.logprobs.append(logprob)
            row.top_logprobs.append(top)
            out.append(self._log("token", row.uid, row=b, token=token, logprob=logprob, top_logprobs=top))
            message = self._call_on_token(row, token)
        message, complete = (
            (message, False) if message else constrained.after_token(row.sampler.constraint, row.tokens)
        )
        if message:
            row.finish("error", message)
        elif token in row.valid.stop_ids:
            row.finish("stop")
        elif row.valid.stop and row.text(self.tokenizer).stop_at is not None:  # a stop string in its text
            row.finish("stop")
        elif complete:  # its grammar admits nothing more
            row.finish("stop")
        elif len(row.tokens) >= row.valid.request.max_tokens:
            row.finish("length")
        if row.finished:
            finished.append(
                self._log("finish", row.uid, row=b, finish_reason=row.finish_reason, message=row.message)
            )

    def _call_on_token(self, row: RequestState, token: int) -> str:
        """Run the request's ``on_token`` callback; its exception becomes the row's error
        (the engine's state-changing calls are refused inside it: :meth:`_refuse_inside_on_token`)."""
        callback = row.valid.request.on_token
        if callback is None:
            return ""
        self._in_on_token = row.uid
        try:
            callback(row.uid, token)
        except Exception as exc:  # contained: only this row ends
            return f"on_token raised {type(exc).__name__}: {exc}"
        finally:
            self._in_on_token = None
        return ""

    @transactional(prompt_cache=True, idle="filter", guarded=True)
    def filter(self) -> list[Event]:
        """Evict finished rows (mlx-lm's ``filter``; with ``reuse_slots`` their cache rows
        stay as free slots). Returns the evict events (old rows). With a prompt cache, a
        row finished by ``stop`` or ``length`` is stored there first.

        Raises:
            RuntimeError: called from a request's ``on_token`` during ``step()``."""
        st, batch = self.state, self.state.batch
        gone = [b for b, r in enumerate(batch.rows) if r.finished]
        if not gone:
            return []
        if st.prompt_cache is not None:
            for b in gone:
                if batch.rows[b].finish_reason in ("stop", "length"):
                    self.layout.store(st, b)
        events = []
        for b in gone:
            batch.rows[b].evicted = True
            events.append(self._log("evict", batch.rows[b].uid, row=b))
        batch.filter([b for b, r in enumerate(batch.rows) if not r.finished])
        self.ledger.make_room(st)  # entries just stored share the budget with the live rows
        self._record()
        return events

    @transactional()
    def abort(self, uid: int) -> list[Event]:
        """End ``uid`` with finish reason ``abort`` wherever it is (queued: it leaves the
        queue; prefilling or running: evicted by a later ``filter()``); a finished uid: ``[]``.

        Raises:
            KeyError: for a uid that was never submitted.
        """
        s = self._state_of(uid)
        if s.finished:
            return []
        if s.waiting:
            self.state.queue.remove(s)
            s.evicted = True
            self.state.shared_prompts = shared_prompts.prune(self.state.shared_prompts, self.state.queue)
        s.finish("abort")
        return [self._log("finish", uid, finish_reason="abort")]

    @transactional(guarded=True)
    def preempt(self, uid: int) -> list[Event]:
        """Drop running row ``uid``'s cache row and re-queue it (arrival order) to resume
        from its prompt plus its tokens; greedy output equals an uninterrupted run. Returns the
        ``preempt`` event.

        Raises:
            KeyError: unknown uid. ValueError: ``uid`` is not a running, unfinished row, or
                its prompt and tokens so far would not fit ``kv_budget_bytes`` alone.
            RuntimeError: called from a request's ``on_token`` during ``step()``.
        """
        s = self._state_of(uid)
        left = len(s.valid.prompt_ids) + s.valid.request.max_tokens - s.n_inputs
        why = self.ledger.refusal(s.n_inputs, left) if s.status is Status.RUNNING else ""
        if why:
            raise ValueError(f"preempt: uid {uid} could never resume with {len(s.tokens)} tokens: {why}")
        return self._preempt(uid)

    def _preempt(self, uid: int, reuse_slots: bool | None = None) -> list[Event]:
        s, st = self._state_of(uid), self.state
        if not self.layout.preemptable(s.status):
            raise ValueError(
                f"uid {uid} is {s.status.value}, not a running, unfinished row; only those can be preempted"
            )
        b = next(i for i, r in enumerate(st.batch.rows) if r is s)
        st.batch.filter([i for i in range(len(st.batch)) if i != b], reuse_slots)
        s.status = Status.PREEMPTED
        st.queue.insert(bisect.bisect([q.uid for q in st.queue], uid), s)  # uids grow with arrival
        event = self._log("preempt", uid, row=b, n_tokens=len(s.tokens))
        self._record()
        return [event]

    def run(self, arrivals: Iterable[tuple[int, Request]] = (), max_steps: int | None = None) -> Report:
        """Drive ``admit(); step(); filter()`` until idle (or ``max_steps`` decode steps),
        submitting ``arrivals`` ``(step, request)`` at their step; returns the :class:`Report`.

        Raises:
            RuntimeError: admission is wedged, or called from a request's ``on_token``.
            ValueError: ``max_steps`` not a whole number >= 0, or an arrival not a
                ``(step, Request)`` pair with a whole-number step >= 0."""
        self._refuse_inside_on_token("run")
        arrivals = call_checks.run_arguments(arrivals, max_steps)
        pending = deque(sorted(arrivals, key=lambda a: a[0]))
        start = self.step_index
        while max_steps is None or self.step_index - start < max_steps:
            while pending and (pending[0][0] <= self.step_index or self.idle):
                self.submit(pending.popleft()[1])
            if self.idle:
                break
            self._iterate()
        return self.report()

    def _iterate(self) -> None:
        """One ``admit(); step(); filter()``; ``step()`` only when a row runs (else it is a no-op).

        Raises:
            RuntimeError: ``admit()`` left a queue on an idle engine (admission is wedged:
                every later iteration would repeat it, never returning).
        """
        self.admit()
        st = self.state
        if st.batch.rows:
            self.step()
        elif st.queue and st.prefilling is None:
            why = "; ".join(self.check().problems) or f"{len(st.queue)} request(s) wait"
            raise RuntimeError(f"run(): admit() admitted nothing on an idle engine: {why}")
        self.filter()

    # -- checkpoint, restore, fork ----------------------------------------------------
    def checkpoint(self) -> Checkpoint:
        """The whole engine state now, for :meth:`restore`; copies no tensor."""
        return Checkpoint(
            self.id,
            id(self.model),
            self.step_index,
            len(self.events),
            self.state.clone(),
            self.recorder.clone(),
            self._identity,
        )

    def _identity(self) -> dict:
        """What a checkpoint on disk records: ``identity_of``, computed once (weights changed later go unseen)."""
        if "_identity_cache" not in self.__dict__:
            self._identity_cache = identity_of(
                self, lora.base_parameters(self.model), lora.weights_digest(self.adapters)
            )
        return self._identity_cache

    def restore(self, checkpoint: Checkpoint) -> None:
        """Return to ``checkpoint`` exactly (it stays valid): continuing gives the same
        tokens and events (times aside).

        Raises:
            ValueError: another scheduler's or model's checkpoint.
            RuntimeError: called from a request's ``on_token`` during ``step()``."""
        self._refuse_inside_on_token("restore")
        check_owner(checkpoint, self.id, self.model)
        self.state, self.recorder = checkpoint.state.clone(), checkpoint.recorder.clone()
        if (
            self.config.history_checkpoints and not self.recorder.stale
        ):  # taken with the latest snapshot: keep it there
            self.recorder.keep_checkpoint(checkpoint, self.config.history_checkpoints)

    def fork(self, **changes: Any) -> "Scheduler":
        """An independent scheduler in this one's state, sharing the model weights: a
        what-if branch. ``changes`` replace the fork's decision settings
        (:meth:`SchedulerConfig.fork_fields`, and ``clock``). With ``history_checkpoints`` it keeps a
        checkpoint of the state it starts from, so :meth:`restore` can return to where it forked.

        Raises:
            ValueError: a setting a fork may not change, an invalid value, or a ``max_batch``
                below the rows this scheduler holds (batch and prefilling; nothing is preempted).
        """
        allowed = [*SchedulerConfig.fork_fields(), "clock"]
        unknown = sorted(set(changes) - set(allowed))
        if unknown:
            raise ValueError(f"fork: cannot change {unknown}; a fork may change {allowed}")
        other = self.fresh(**changes)
        check_fork_rows(self.state, other.config.max_batch)
        other.state = self.state.clone()
        other.recorder = self.recorder.clone(other.clock, other.history.maxlen)
        if other.config.history_checkpoints and not other.recorder.stale:
            other.recorder.keep_checkpoint(other.checkpoint(), other.config.history_checkpoints)
        return other

    def fresh(self, **changes: Any) -> "Scheduler":
        """A new, empty scheduler with this one's model, tokenizer and settings (``changes``
        replace some: settings, ``clock``, ``prompt_cache``, ``adapters``; a prompt cache
        object is shared, an int size makes a new one)."""
        return Scheduler(self.model, self.tokenizer, self._asked, **{**self._extras, **changes})

    def check(self) -> Integrity:
        """The engine's :class:`Integrity` (``.ok``, ``.problems``); raises and changes nothing."""
        return check_state(self.state, self.tokenizer, self.admission.wedge(self.state, self.ledger))

    # -- reading a request ------------------------------------------------------------
    def _state_of(self, uid: int) -> RequestState:
        if not isinstance(uid, (int, np.integer)) or isinstance(uid, (bool, np.bool_)):
            raise ValueError(f"uid must be an int (from submit), got {type(uid).__name__} {uid!r}")
        try:
            return self.state.requests[uid]
        except (KeyError, TypeError):
            n = self.state.next_uid
            known = f"submitted uids are 0..{n - 1}" if n else "nothing was submitted yet"
            raise KeyError(f"uid {uid!r} is unknown ({known})") from None

    def request(self, uid: int) -> RequestView:
        """A frozen :class:`RequestView` of ``uid`` now (the readers below are its aliases).
        Raises: KeyError for an unknown uid, ValueError for a uid that is not an int."""
        return RequestView.of(self._state_of(uid), self.tokenizer)

    def status(self, uid: int) -> Status:
        """``request(uid).status``."""
        return self._state_of(uid).status

    def request_of(self, uid: int) -> ValidRequest:
        """The validated request (prompt ids, stop ids) behind ``uid``. Raises: KeyError."""
        return self._state_of(uid).valid

    def tokens(self, uid: int) -> list[int]:
        """``request(uid).tokens``, as a list."""
        return list(self._state_of(uid).tokens)

    def logprobs(self, uid: int) -> list[float]:
        """``request(uid).logprobs``, as a list."""
        return list(self._state_of(uid).logprobs)

    def top_logprobs(self, uid: int) -> list[tuple[tuple[int, float], ...]]:
        """``request(uid).top_logprobs``, as a list, e.g. ``[((42, -0.11), (7, -2.6)), ...]``
        for ``top_logprobs=2``. Raises: KeyError for an unknown uid."""
        return list(self._state_of(uid).top_logprobs)

    def finish_reason(self, uid: int) -> str | None:
        """``request(uid).finish_reason``."""
        return self._state_of(uid).finish_reason

    def error(self, uid: int) -> str:
        """``request(uid).error``."""
        return self._state_of(uid).message

    def text(self, uid: int) -> str:
        """``request(uid).text``: for a finished row without stop strings,
        ``tokenizer.decode`` of its tokens."""
        return self._state_of(uid).text(self.tokenizer).text

    def stream(self, uid: int, logprobs: bool = False) -> Iterator[str] | Iterator[StreamChunk]:
        """Text pieces of ``uid`` as they settle, driving ``admit(); step(); filter()``
        until it finishes; never half a character or a tail that may become a stop string; joined,
        :meth:`text` (mlx-lm's ``stream_generate`` segments). ``logprobs=True``: each piece as a
        :class:`~workbench.engine.view.StreamChunk` with its tokens and log-probs.

        Raises: KeyError for an unknown uid; whatever an engine call raises.
        """
        for _, piece in self._stream([self._state_of(uid).uid], logprobs):
            yield piece

    def stream_all(
        self, logprobs: bool = False
    ) -> Iterator[tuple[int, str]] | Iterator[tuple[int, StreamChunk]]:
        """``(uid, piece)`` for every row, like :meth:`stream`, driving the engine until idle."""
        return self._stream(None, logprobs)

    def _stream(self, uids: list[int] | None, chunks: bool = False) -> Iterator[tuple[int, Any]]:
        return stream_pieces(
            lambda: self.state.requests, self.tokenizer, uids, chunks, self._iterate, lambda: self.idle
        )

    # -- observing --------------------------------------------------------------------
    def snapshot(self, record: bool = False) -> Snapshot:
        """Frozen numpy view of the batch as the next ``step()`` will see it (waits for a
        forward in flight). Pure by default; ``record=True`` also appends it to :attr:`history`
        unless no event happened since the last one there.
        """
        if not record or not self.history.maxlen:
            return self._capture()()
        if self.recorder.stale:
            self._record()
        return self.history[-1]

    def report(self) -> Report:
        """The :class:`Report` of everything so far (events and per-request metrics), built
        when first read: calling it costs the same however long the session."""

        return build_report(self.events, report_text(lambda: self.state.requests, self.tokenizer))

    def _capture(self) -> Callable[[], Snapshot]:
        st = self.state
        fields = dict(
            queue=self.queue, serial_reason=self.serial_reason, **lora.snapshot_fields(self.adapters)
        )
        return engine_capture(
            st, self.ledger, self.config.kv_budget_bytes, self.layout.snapshot_fields(st), fields
        )

    def _record(self) -> None:
        self.recorder.record(self._capture())
        if self.config.history_checkpoints and self.history.maxlen:
            self.recorder.keep_checkpoint(self.checkpoint(), self.config.history_checkpoints)

    def _log(self, kind: str, uid: int, **fields: Any) -> Event:
        return self.recorder.log(kind, uid, self.state.step_index, **fields)


def _deprecated_alias(name: str, read: Callable[[Scheduler], Any]) -> property:
    return property(
        read, doc=f"Deprecated: read ``sched.config.{name}`` (``sched.recipe.{name}`` for ``kv_quant``)."
    )


for _name in ("max_batch", "prefill_step_size", "max_kv_size", "kv_budget_bytes", "history_checkpoints"):
    setattr(Scheduler, _name, _deprecated_alias(_name, lambda self, _n=_name: getattr(self.config, _n)))
Scheduler.kv_quant = _deprecated_alias("kv_quant", lambda self: self.recipe.kv_quant)


def _history_checkpoint(self: Scheduler, index: int) -> Checkpoint | None:
    """Deprecated: ``history.checkpoint(index)``."""
    return self.history.checkpoint(index)


def _record_snapshot(self: Scheduler) -> Snapshot:
    """Deprecated: ``snapshot(record=True)``."""
    return self.snapshot(record=True)


def _finished_greedy_uids(self: Scheduler) -> list[int]:
    """Deprecated: ``workbench.verify.oracle.checkable_uids(sched)``."""
    return [
        u
        for u, s in self.state.requests.items()
        if s.valid.request.greedy and s.finish_reason in ("stop", "length")
    ]


for _name, _method in (
    ("history_checkpoint", _history_checkpoint),
    ("record", _record_snapshot),
    ("finished_greedy_uids", _finished_greedy_uids),
):  # deprecated methods, kept out of the class body
    _method.__name__, _method.__qualname__ = _name, f"Scheduler.{_name}"
    setattr(Scheduler, _name, _method)


def _signature() -> inspect.Signature:
    """``Scheduler``'s signature with every :class:`SchedulerConfig` setting keyword-only (for ``help``)."""
    P = inspect.Parameter
    own = list(inspect.signature(Scheduler.__init__).parameters.values())[1:]  # without self
    settings = [
        P(f.name, P.KEYWORD_ONLY, default=f.default, annotation=f.type) for f in fields(SchedulerConfig)
    ]
    return inspect.Signature(
        [p for p in own if p.kind is not P.VAR_KEYWORD][:3]
        + settings
        + [p for p in own if p.kind is P.KEYWORD_ONLY]
    )


Scheduler.__signature__ = _signature()
