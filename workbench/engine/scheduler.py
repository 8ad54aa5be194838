"""The step-at-a-time continuous-batching scheduler.

Knows: the queue, the joining (prefilling) group, the running rows, the admission
policy, the event log. Uses: :mod:`workbench.engine.kv.caches` for mlx-lm's batch caches,
:mod:`workbench.engine.prefill`, :mod:`workbench.engine.decode`. Must not know: views, Jupyter.

Life of a request (mlx-lm's names in brackets, vLLM's in braces)::

    submit ─▶ queue ─admit()─▶ prefilling group ─admit()…─▶ running rows ─step()─▶ tokens ─filter()─▶ evicted
             [insert] {add_request}     (chunked prefill)        [next] {schedule}       [remove] {update_from_output}

- ``admit()`` forms a prefilling group from the queue (:mod:`workbench.engine.admission`),
  runs prefill chunks of ``prefill_step_size`` tokens (one per call with
  ``interleave_prefill``), and when the group's prompts are cached *joins* it: one
  ``[n, 1]`` forward computes each joiner's first-token distribution (as mlx-lm's
  ``GenerationBatch``), then each joiner takes a free slot or joins by ``extend``.
- ``step()`` reads one token per running row and feeds it: one ``[B, 1]`` forward,
  launched before the read with ``pipeline`` (mlx-lm's ``GenerationBatch._step``). So a
  joiner's first token is computed in ``admit()`` and read, and timed, in the next
  ``step()``: TTFT runs from ``submit`` to that ``token`` event.
- ``filter()`` evicts finished rows; with ``reuse_slots`` their cache rows stay free
  slots for the next join, and free slots nobody fills are dropped with ``filter`` before
  any forward runs over them.

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
from functools import partial
from types import MappingProxyType
from typing import Any

import mlx.core as mx
import numpy as np

from ..observe.events import Event
from ..observe.recorder import Recorder
from ..observe.report import Report, build_report
from ..observe.snapshot import Snapshot
from . import shared_prompts
from .admission import Admission, Decision, policy_from
from .batch import Batch
from .capture import capture
from .checkpoint import Checkpoint, EngineState, check_owner, sigint_deferred, transactional
from .checkpoint_io import identity_of
from .config import SchedulerConfig
from .decode import Pending, sample_pending
from .integrity import Integrity, check_state
from .kv import caches as kv
from .kv.ledger import KVLedger, measured_memory
from .kv.promptcache import PromptCache
from .levers import constrained, fastpath, invariant, lora, quantized_kv, speculative
from .levers.pacing import Pacer, pacing_from
from .levers.packed_pacing import PackedPacer
from .packed import families as packed_families
from .packed.batch import PackedBatch
from .packed.ledger import PageLedger
from .probe import probe
from .request import Request, ValidRequest, context_limit, validate
from .runner import ModelRunner, Prefilling
from .sampling import RowSampler
from .siblings import check_samples
from .state import RequestState, Status
from .text import visible_text
from .view import RequestView, StreamChunk

_IDS = itertools.count()


def vocab_size(model: Any, tokenizer: Any) -> int:
    """Rows of the model's output (``model.args.vocab_size``, mlx-lm's config field),
    else the tokenizer's vocabulary size."""
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

    ``Scheduler(model, tokenizer, config=None, *, clock=time.perf_counter,
    prompt_cache=None, adapters=None, **settings)``: ``model`` an mlx-lm model
    (``mlx_lm.load``) whose every layer's cache batches, ``tokenizer`` its
    ``TokenizerWrapper``; the settings (:class:`SchedulerConfig`, ``help(wb.SchedulerConfig)``)
    as a config, as keywords, or both (keywords win: ``dataclasses.replace``), held in
    :attr:`config`; ``clock`` ``() -> seconds`` (inject a fake one for deterministic
    metrics); ``prompt_cache`` an mlx-lm ``LRUPromptCache`` or its ``max_size`` (with
    ``layout="packed"`` an int: prefix caching, at most that many unreferenced pages kept); ``adapters``
    LoRA adapters ``{name: folder}`` (:mod:`workbench.engine.levers.lora`).

    Every call that changes the engine (``submit``, ``admit``, ``step``, ``filter``,
    ``abort``, ``preempt``; ``run`` loops over them) is a transaction: an exception escaping
    it, ``KeyboardInterrupt`` included, leaves the engine as before the call. A model that
    cannot batch rows of different lengths (:func:`workbench.engine.probe.probe`) runs in a
    serial lane: ``config.max_batch`` is 1 and :attr:`serial_reason` says why.

    Raises:
        ValueError: a setting outside its limits (naming it); ``max_kv_size`` on a model with
            its own ``make_cache``; a cache type that cannot batch (naming the layer);
            ``kv_bits`` / ``kv_group_size`` / ``fast_decode`` / ``pacing`` / ``adapters`` not
            valid for the model, or ``kv_bits`` or ``adapters`` with ``prompt_cache``.
        TypeError: an unknown setting.
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
        self.model, self.tokenizer, self._asked = model, tokenizer, asked
        kv.check_batchable(model, asked.max_kv_size)
        quant = quantized_kv.configure(
            model, asked.kv_bits, asked.kv_group_size, asked.max_kv_size, prompt_cache
        )
        self.adapters = lora.configure(model, adapters, prompt_cache)
        self._extras = dict(
            clock=clock, prompt_cache=prompt_cache, adapters=self.adapters
        )  # forks share the bank
        self.recipe = kv.CacheRecipe(model, asked.max_kv_size, quant)
        self.packed = asked.layout == "packed"
        if self.packed:
            packed_families.check_model(model)
            packed_families.check_settings(asked, prompt_cache, adapters)
        self.serial_reason = (
            probe(model, asked.max_kv_size) if asked.max_batch > 1 and not self.packed else ""
        )
        cfg = self.config = replace(asked, max_batch=1, prompt_concurrency=1) if self.serial_reason else asked
        self.vocab_size = vocab_size(model, tokenizer)
        self.context_tokens, self.context_field = context_limit(model)
        self.id = f"scheduler-{next(_IDS)}"
        self.admission = Admission(policy_from(cfg.policy), cfg)
        self.batch_invariant = invariant.configure(
            model, cfg.batch_invariant, cfg.max_kv_size, quant, cfg.kv_budget_bytes
        )
        self.speculation = self._speculation(quant)
        fast = fastpath.FastDecode.of(False if self.batch_invariant else cfg.fast_decode, self.adapters)
        self.runner = ModelRunner(self.recipe, cfg, self.adapters, fast, self.batch_invariant)
        self.recorder = Recorder(clock, cfg.history_size)
        self.pacing = pacing_from(cfg.pacing)
        self.pacer = self._pacer()
        self.ledger = KVLedger(
            self.recipe.profile(),
            cfg,
            self.pacing is None and prompt_cache is None and quant is None,
            chunked_padding=self.runner.chunks_padding(),
        )
        cache = None if prompt_cache is None or self.packed else self._prompt_cache(prompt_cache, quant)
        self.state = EngineState(Batch(cfg.reuse_slots), np.random.default_rng(cfg.seed), prompt_cache=cache)
        if self.packed:
            self._use_pages()
        self._in_call = False

    def _pacer(self) -> Pacer | None:
        """The pacing's running estimates: a :class:`PackedPacer` (per-forward token caps)
        in the packed layout, a :class:`Pacer` (prefill chunks per ``admit()``) in the
        padded one; ``None`` with pacing off."""
        if self.pacing is None:
            return None
        if self.packed:
            return PackedPacer(self.pacing, self.config.token_budget)
        return Pacer(self.pacing, self.config.prefill_step_size)

    def _speculation(self, quant: Any) -> Any:
        """The speculation settings checked against the model and the other levers
        (:func:`workbench.engine.levers.speculative.configure`); ``None``: off."""
        cfg = self.config
        return speculative.configure(
            self.model,
            cfg.speculative,
            cfg.num_draft_tokens,
            batch_invariant=cfg.batch_invariant,
            kv_quant=quant,
            adapters=self.adapters,
            vocab_size=self.vocab_size,
            prefill_step_size=cfg.prefill_step_size,
            max_kv_size=cfg.max_kv_size,
        )

    def _prompt_cache(self, prompt_cache: Any, quant: Any) -> PromptCache:
        """The engine's view of the user's mlx-lm prompt cache, keyed by all that shapes a
        cache (model, window, KV quantization, adapters, fast paths, the invariant mode)."""
        aligned = self.config.prefill_step_size if self.batch_invariant else None
        return PromptCache(
            self.model,
            prompt_cache,
            self._asked.max_kv_size,
            aligned,
            kv_quant=quant,
            adapters=self.adapters,
            fast_decode=self.runner.fast_decode,
        )

    def _use_pages(self) -> None:
        """The packed layout's batch and books (:mod:`workbench.engine.packed`): pages of
        ``page_size`` positions, ``page_size * full_token_bytes`` bytes each; an int
        ``prompt_cache`` turns on prefix caching (at most that many unreferenced pages kept)."""
        cfg = self.config
        page_bytes = cfg.page_size * self.ledger.base.full_token_bytes
        max_pages = None if cfg.kv_budget_bytes is None else cfg.kv_budget_bytes // page_bytes
        self.ledger = PageLedger(cfg.page_size, page_bytes, cfg)
        self.state.batch = PackedBatch(
            cfg.page_size,
            page_bytes,
            len(self.model.model.layers),
            max_pages,
            self._extras["prompt_cache"],
            decode_kernel=False if cfg.fast_decode is False else None,  # fast_decode=False: MLX ops only
        )

    @contextlib.contextmanager
    def _transaction(self, prompt_cache: bool = False):
        """Run the body as one transaction: on any exception (``BaseException``) the state
        and the books return to their values before it. Nested calls (``admit`` calling
        ``preempt``) join the outer transaction."""
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
        """Most bytes the batch and prefilling caches may hold from now on, as mlx-lm will
        allocate them (:meth:`workbench.engine.kv.ledger.KVLedger.projected_bytes`): what
        admission keeps within ``kv_budget_bytes``."""
        return self.ledger.projected_bytes(self.state)

    @property
    def idle(self) -> bool:
        """True when nothing is queued, prefilling or in the batch."""
        return self._nothing_to("run")

    def _nothing_to(self, call: str) -> bool:
        """Whether ``call`` has nothing to do: ``"run"`` (:attr:`idle`), ``"admit"`` (no queue,
        no prefilling group, no free slot to drop) or ``"filter"`` (no finished row)."""
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
        """Queue ``n`` samples of ``request``: sample ``i`` is ``request`` with seed
        ``seed + i`` (``seed`` the request's own, else one drawn from the scheduler's
        seed), so it draws exactly the tokens ``Request(seed=seed + i)`` draws alone. Samples
        admitted together share one prefill: the prompt runs once and its cache row is
        copied into every sample's row (:mod:`workbench.engine.siblings`); samples admitted
        later start from a copy of that prefilled row, held while they wait
        (:mod:`workbench.engine.shared_prompts`). Returns their
        uids, consecutive; each is an ordinary request afterwards (``abort``, ``preempt``,
        ``tokens`` one by one). Like vLLM's ``SamplingParams(n=...)``.

        Raises:
            ValueError: ``n`` not an int in ``[1, MAX_SAMPLES]`` (1024), or what
                :meth:`submit` raises for the request (nothing is queued then).
        """
        check_samples(n)
        if isinstance(request, dict):
            request = Request.from_dict(request)
        if not isinstance(request, Request):
            raise ValueError(f"request must be a workbench.Request, got {type(request).__name__}")
        seed = request.seed if request.seed is not None else int(self.state.rng.integers(2**31))
        uids = [self.submit(replace(request, seed=seed + i)) for i in range(n)]
        for uid in uids:
            self.state.requests[uid].sample_group = uids[0]
        return uids

    # -- the engine calls -------------------------------------------------------------
    @transactional(prompt_cache=True, idle="admit")
    def admit(self) -> list[Event]:
        """Admission and prefill. Returns the events of this call (``admit``, ``prefill``,
        ``join``, and ``preempt`` for rows preempted to make room).

        Forms a prefilling group from the queue when none is in progress
        (:class:`Admission`), runs its prefill chunks (at most one per call with
        ``interleave_prefill``), and joins it to the running batch once its prompts are
        cached. After a join it forms and starts the next group in the same call if the
        chunk budget allows.
        """
        start = len(self.events)
        if self.packed:
            self._start_group()  # joiners enter the batch; their prefill runs in step()
        elif self.pacer is None:
            self._admit_fixed()
        else:
            self._admit_paced()
        dropped = self.state.batch.compact()  # free slots no joiner took
        if len(self.events) > start or dropped:
            self._record()
        if self.pacer is not None:
            self.pacer.end_iteration(self.clock())
        return self.events[start:]

    def _admit_fixed(self) -> None:
        """Chunks of ``prefill_step_size``: one per call with ``interleave_prefill``, else
        until the queue is prefilled (or the batch is full)."""
        chunks = 0
        while self.state.prefilling is not None or self._start_group():
            group = self.state.prefilling
            if group.prefill.done:
                self._join(group)
                continue
            if self.config.interleave_prefill and chunks >= 1:
                break
            self._run_chunk(group)
            chunks += 1

    def _admit_paced(self) -> None:
        """Prefill chunks, joins and new groups while they fit this iteration's time
        budget (:class:`~workbench.engine.levers.pacing.Pacer`); at least one chunk."""
        st, pacer = self.state, self.pacer
        now_s, rows = self.clock(), len(st.batch.rows)
        width = max((r.context_tokens for r in st.batch.rows), default=0)  # the widest context (tokens)
        pacer.begin_iteration(now_s, st.step_index, rows, width)
        budget_s, ran = pacer.prefill_budget_s(rows, width), False
        while st.prefilling is not None or self._start_group(self._group_limit(budget_s, ran)):
            group = st.prefilling
            if group.prefill.done:
                join_s = pacer.decode_s(len(group.states), width)
                if ran and join_s > budget_s:
                    break
                self._join(group)
                budget_s, ran = budget_s - join_s, True
                continue
            b, pos, remaining = group.prefill.next_chunk()
            k = pacer.chunk_tokens(budget_s, b, pos, remaining, first=not ran)
            if k == 0:
                break
            t0 = self.clock()
            real = self._run_chunk(group, k)
            elapsed = self.clock() - t0
            pacer.observe_prefill(b, max(real), pos, elapsed)
            budget_s, ran = budget_s - elapsed, True

    def _group_limit(self, budget_s: float, ran: bool) -> int | None:
        """Most padded prefill tokens (rows x longest input) a new group may bring, so
        that it fits what is left of the budget; ``0`` when not even a first chunk fits
        (start no group now), ``None`` for no limit."""
        if budget_s == float("inf"):
            return None
        return self.pacer.chunk_tokens(budget_s, 1, 0, self.config.prefill_step_size, first=not ran)

    def _run_chunk(self, group: Prefilling, tokens: int | None = None) -> list[int]:
        """One prefill chunk of ``group`` (``tokens`` long, default ``prefill_step_size``)
        and its ``prefill`` events (a batched group's member with no real token in the
        chunk still rides in its forward: ``n_tokens=0``); returns the real tokens per member."""
        real = self.runner.run_chunk(group, tokens)
        batched = not group.prefill.per_row
        for s, k in zip(group.prefilled, real):  # one prefill row per distinct prompt of a submit_n group
            if k or batched:
                self._log("prefill", s.uid, n_tokens=k)
        return real

    def _start_group(self, prefill_limit: int | None = None) -> bool:
        """Apply admission's decision: preempt, then start prefilling the chosen requests
        (with ``prefill_limit``, only the first ones whose padded prefill tokens fit it,
        at least one; none when it is ``0``). Returns False when nobody was chosen."""
        st = self.state
        if prefill_limit == 0:
            return False
        decision = self._decide()
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
        if self.packed:
            st.batch.add(chosen)
        else:
            st.prefilling = self.runner.start_prefill(chosen, st.prompt_cache, st.shared_prompts)
            st.shared_prompts = shared_prompts.prune(st.shared_prompts, st.queue)  # what no sample waits for
        for s in chosen:
            self._log("admit", s.uid, n_tokens=len(s.inputs), n_cached=s.cached_tokens)
        return True

    def _decide(self) -> Decision:
        """Admission's decision on the batch as allocated now. What may yield does so before
        a request waits: on an idle engine, prompt-cache entries that keep the first request
        out are dropped; then the prompts held for queued ``submit_n`` samples
        (:mod:`workbench.engine.shared_prompts`) when admission without them admits someone."""
        st = self.state
        decide = lambda **held: self.admission.decide(  # noqa: E731
            st.queue, st.batch.rows, self.ledger.plan(st, **held), self.clock()
        )
        decision = decide()
        if (
            not decision.admit
            and not st.batch.rows
            and st.prompt_cache is not None
            and st.prompt_cache.nbytes
        ):
            st.prompt_cache.trim_to(0)
            decision = decide()
        if not decision.admit and st.shared_prompts:
            unheld = decide(held_prompts=False)
            if unheld.admit:
                st.shared_prompts, decision = {}, unheld
        return decision

    def _join(self, group: Prefilling) -> None:
        """The join forward (each member's last input token), then the members enter the
        batch (free slots or ``extend``); one ``join`` event each, with its mode."""
        st = self.state
        self.runner.hold_prompts(group, st.queue, st.shared_prompts, self.ledger.room_bytes(st))
        group.expand()  # a submit_n group's prefilled row copied into each sample's row
        for s in group.states:
            s.fed = len(s.tokens)  # a resumed row's generated tokens are in its cache again
            s.join_order, st.joins = st.joins, st.joins + 1
            if not s.finished:  # aborted while prefilling: joins finished, evicted at filter
                s.status = Status.RUNNING
        contexts = [self._context(s, None, b) for b, s in enumerate(group.states)]
        pending = self.runner.join_forward(group, contexts)
        placed = st.batch.place(group.prefill.caches, group.states, pending)
        kv.settle(st.batch.caches)  # the group's caches are freed now, not at the next forward
        st.prefilling = None
        for s, (row, mode) in zip(group.states, placed):
            self._log("join", s.uid, row=row, n_tokens=len(s.valid.prompt_ids), join_mode=mode)

    @transactional()
    def step(self) -> list[Event]:
        """One decode step: read one token per unfinished row, feed it (``[B, 1]``).

        Returns the token events, then any finish events. With no running rows it is a
        no-op that returns ``[]`` and does not advance ``step_index`` (warning, with a
        ``UserWarning`` naming ``admit()``, when requests wait in the queue and none is
        prefilling); so it is under a KV budget when every row has finished (feeding them
        would only grow the caches past what admission projected; ``filter()`` evicts them).
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
        if self.packed:
            return self._step_packed()
        batch.compact()
        if self.speculation is not None:
            return self._step_speculative()
        current = batch.pending
        contexts = [self._context(r, current, b) for b, r in enumerate(batch.rows)]
        if self.config.pipeline:  # launch step n+1 from step n's unread tokens, then read step n
            batch.pending = self.runner.decode(batch, current.tokens, contexts, True)
        toks, lps, finite = current.read()
        tops = current.read_top()
        if not self.config.pipeline:
            batch.pending = self.runner.decode(batch, current.tokens, contexts, False)
        for row in batch.rows:
            row.fed += 1
        out, finished = self._read_pending(current, toks, lps, finite, tops)
        return self._end_step(out, finished)

    def _read_pending(
        self, current: Pending, toks: list[int], lps: list[float], finite: list[bool], tops: dict[int, tuple]
    ) -> tuple[list[Event], list[Event]]:
        """Read each unfinished row's token of ``current`` with its top-k log-probs ``tops``
        (:meth:`_read_token`). Returns the token events and the finish events."""
        out, finished = [], []
        for b, row in enumerate(self.state.batch.rows):
            if not row.finished:
                message = current.errors.get(b) or ("" if finite[b] else "non-finite logits (NaN or inf)")
                self._read_token(row, b, toks[b], lps[b], message, out, finished, tops.get(b, ()))
        return out, finished

    def _end_step(self, out: list[Event], finished: list[Event]) -> list[Event]:
        """Count the step, clear MLX's cache every ``clear_cache_every`` steps, record."""
        st = self.state
        st.step_index += 1
        if st.step_index % self.config.clear_cache_every == 0:
            mx.clear_cache()
        self._record()
        return out + finished

    def _step_packed(self) -> list[Event]:
        """One packed forward's tokens: every running row's next token, then prefill chunks
        of joining rows up to ``config.token_budget``; a joining row whose chunk ends its
        inputs joins (``join`` event, mode ``"packed"``) with its first token. With
        ``pipeline``, the next forward is built from this one's unread tokens and started
        as soon as they are read, before the events (:meth:`_launch_packed`)."""
        st, batch, cfg = self.state, self.state.batch, self.config
        current = batch.launched
        if current is None:
            current = self._launch_packed()
            if current is None:
                return []
            mx.async_eval(*current.outputs)
        nxt = self._launch_packed(current) if cfg.pipeline and current.uids else None
        read = current.pending.read() if current.pending is not None else mx.eval(*current.outputs)
        if self.pacer is not None:  # the forward's measured time; the next one's starts now
            read_s = self.clock()
            self.pacer.observe(current.paced, read_s)
            if nxt is not None:
                nxt.paced = self.pacer.started(nxt.paced, read_s)
        if nxt is not None:
            mx.async_eval(*nxt.outputs)  # after the read: the pools are written in place then
        batch.launched = nxt
        out, finished = self._read_packed(current, read)
        batch.after_read(nxt)
        batch.last_chunks, batch.last_paced = current.chunks, current.paced
        for row, held in zip(batch.rows, batch.held):
            row.fed = max(0, held - len(row.valid.prompt_ids))
        st.step_index += 1
        if st.step_index % cfg.clear_cache_every == 0:
            mx.clear_cache()
        self._record()
        return out + finished

    def _launch_packed(self, after: Any = None) -> Any:
        """Build the next packed forward and its sampling (lazy: not started), or ``None``
        when nothing is planned. ``after``: a launched forward whose tokens are unread; the
        next one counts them as known and feeds them, and is built only when it carries
        decode tokens alone (a joiner admitted meanwhile waits one forward)."""
        batch, cfg = self.state.batch, self.config
        unread = {} if after is None else {u: i for i, u in enumerate(after.uids)}
        chunks = batch.plan(cfg.token_budget, cfg.packed_schedule, unread)
        if not chunks or (after is not None and any(c.kind != "decode" for c in chunks)):
            return None
        paced = None
        if self.pacer is not None:  # prefill tokens capped to the time budget
            plan = partial(batch.plan, schedule=cfg.packed_schedule, unread=unread)
            paced = self.pacer.choose(plan, chunks, self.clock())
            chunks = paced.chunks

        def sample(logits: mx.array, sampled: list[int]) -> Pending:
            rows = [batch.rows[b] for b in sampled]
            contexts = [
                self._context(r, after.pending if r.uid in unread else None, unread.get(r.uid, 0))
                for r in rows
            ]
            index = [len(r.tokens) + (r.uid in unread) for r in rows]
            return sample_pending(logits, [r.sampler for r in rows], contexts, index, asynchronous=None)

        launched = batch.launch(self.model, chunks, sample, after)
        launched.paced = paced
        return launched

    def _read_packed(self, current: Any, read: tuple | None) -> tuple[list[Event], list[Event]]:
        """The events of a read packed forward: ``prefill`` per prefill chunk, then per
        sampling row (``join`` for a joiner) its token, or its error. Rows that left the
        batch or finished since it was launched are skipped."""
        st, batch = self.state, self.state.batch
        for c in current.chunks:
            if c.kind != "decode":
                self._log("prefill", c.uid, n_tokens=c.n_tokens)
        out, finished = [], []
        if read is None:
            return out, finished
        toks, lps, finite = read
        tops = current.pending.read_top()
        rows = {r.uid: b for b, r in enumerate(batch.rows)}
        for i, uid in enumerate(current.uids):
            b = rows.get(uid)
            if b is None or batch.rows[b].finished:
                continue
            row = batch.rows[b]
            if row.status is Status.PREFILLING:
                row.status, row.join_order, st.joins = Status.RUNNING, st.joins, st.joins + 1
                self._log("join", row.uid, row=b, n_tokens=len(row.valid.prompt_ids), join_mode="packed")
            message = current.pending.errors.get(i) or ("" if finite[i] else "non-finite logits (NaN or inf)")
            self._read_token(row, b, toks[i], lps[i], message, out, finished, tops.get(i, ()))
        return out, finished

    def _step_speculative(self) -> list[Event]:
        """``step()`` with speculation (:mod:`workbench.engine.levers.speculative`): read
        each row's pending token, then one verify forward of it and the row's drafts; the
        drafts each row accepted are its next tokens (a ``draft`` event per drafting row,
        before their token events), up to where it finishes. Not pipelined: drafting reads the tokens."""
        batch = self.state.batch
        current = batch.pending
        toks, lps, finite = current.read()
        out, finished = self._read_pending(current, toks, lps, finite, current.read_top())
        contexts = [self._context(r, None, b) for b, r in enumerate(batch.rows)]
        verified = self.runner.speculate(batch, self.speculation, toks, contexts)
        for b, row in enumerate(batch.rows):
            row.fed += 1 + verified.accepted[b]
            if verified.drafted[b]:
                out.append(
                    self._log(
                        "draft", row.uid, row=b, n_tokens=verified.drafted[b], n_accepted=verified.accepted[b]
                    )
                )
            for token, logprob in zip(verified.tokens[b], verified.logprobs[b]):
                if not row.finished:
                    self._read_token(row, b, token, logprob, "", out, finished)
        batch.pending = verified.pending
        return self._end_step(out, finished)

    def _read_token(
        self,
        row: RequestState,
        b: int,
        token: int,
        logprob: float,
        message: str,
        out: list[Event],
        finished: list[Event],
        top: tuple = (),
    ) -> None:
        """Record row ``b``'s token and its ``top`` log-probs (unless ``message`` says its
        step failed), call its ``on_token``, and finish it on an error (its grammar refusing
        the token included), a stop id, a stop string, a complete grammar or ``max_tokens``."""
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

    @staticmethod
    def _context(row: RequestState, pending: Pending | None, b: int) -> Callable[[], mx.array]:
        """The row's own tokens ``[T]`` (prompt, read tokens, and the unread one in
        ``pending``) for its logits processors: built only when asked."""

        def build() -> mx.array:
            known = mx.array(list(row.valid.prompt_ids) + row.tokens, dtype=mx.uint32)
            return known if pending is None else mx.concatenate([known, pending.tokens[b : b + 1]])

        return build

    @staticmethod
    def _call_on_token(row: RequestState, token: int) -> str:
        """Run the request's ``on_token`` callback; its exception becomes the row's error."""
        callback = row.valid.request.on_token
        if callback is None:
            return ""
        try:
            callback(row.uid, token)
        except Exception as exc:  # contained: only this row ends
            return f"on_token raised {type(exc).__name__}: {exc}"
        return ""

    @transactional(prompt_cache=True, idle="filter")
    def filter(self) -> list[Event]:
        """Evict finished rows (mlx-lm's ``filter``; with ``reuse_slots`` their cache rows
        stay as free slots). Returns the evict events (old rows). With a prompt cache, a
        row finished by ``stop`` or ``length`` is stored there first."""
        st, batch = self.state, self.state.batch
        gone = [b for b, r in enumerate(batch.rows) if r.finished]
        if not gone:
            return []
        if st.prompt_cache is not None:
            for b in gone:
                if batch.rows[b].finish_reason in ("stop", "length"):
                    self.runner.store(st.prompt_cache, batch, b)
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
        """End ``uid`` with finish reason ``abort``, wherever it is.

        A queued (or preempted) request leaves the queue; a prefilling one finishes and
        its row is evicted by the first ``filter()`` after its group joins; a running row
        finishes and is evicted by the next ``filter()``. Aborting a finished uid is a
        documented no-op (returns ``[]``).

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

    @transactional()
    def preempt(self, uid: int) -> list[Event]:
        """Preempt running row ``uid``: drop its cache row now and re-queue it (original
        arrival order) to resume from its prompt plus the tokens generated so far; its
        greedy output equals an uninterrupted run. Returns the ``preempt`` event.

        Raises:
            KeyError: unknown uid. ValueError: ``uid`` is not a running, unfinished row, or
                its prompt and tokens so far would not fit ``kv_budget_bytes`` alone (it
                could never resume: with a prompt cache or pacing the projection grows with
                the input).
        """
        s, budget = self._state_of(uid), self.config.kv_budget_bytes
        final = len(s.valid.prompt_ids) + s.valid.request.max_tokens
        need = self.ledger.alone_bytes(s.n_inputs, final - s.n_inputs) if budget is not None else 0
        if budget is not None and need > budget and s.status is Status.RUNNING:
            raise ValueError(
                f"preempt: uid {uid} could never resume: its prompt and {len(s.tokens)} tokens project "
                f"{need:,} KV bytes alone but kv_budget_bytes is {budget:,}"
            )
        return self._preempt(uid)

    def _preempt(self, uid: int, reuse_slots: bool | None = None) -> list[Event]:
        s, st = self._state_of(uid), self.state
        if self.batch_invariant is not None:
            raise ValueError(
                "preempt: a batch_invariant scheduler cannot preempt (recompute would prefill "
                "decoded tokens: other sums than the decode steps that made them)"
            )
        if s.status is not Status.RUNNING and not (self.packed and s.status is Status.PREFILLING):
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
        """Drive ``admit(); step(); filter()`` until idle and return the :class:`Report`.

        Args:
            arrivals: ``(step, request)`` pairs submitted once ``step_index`` reaches
                ``step`` (or at once when the engine would otherwise be idle).
            max_steps: stop after this many decode steps (``None``: until idle).

        Raises:
            RuntimeError: admission is wedged (:meth:`_iterate`), instead of looping for ever.
        """
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
        """The whole engine state now (queue, request states, batch caches, prefilling
        group, prompt cache, seed generator, step index, events, history), for
        :meth:`restore`. Copies no tensor (new handles on the same MLX buffers)."""
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
        """The model, tokenizer and settings a checkpoint on disk records and loading
        compares (:func:`workbench.engine.checkpoint_io.identity_of`), computed once."""
        if "_identity_cache" not in self.__dict__:
            self._identity_cache = identity_of(self)
        return self._identity_cache

    def restore(self, checkpoint: Checkpoint) -> None:
        """Return to ``checkpoint`` exactly; it stays valid for another restore.
        Continuing gives the same tokens and events (times aside) as after it was taken.

        Raises:
            ValueError: for a checkpoint of another scheduler or model (nothing changes).
        """
        check_owner(checkpoint, self.id, self.model)
        self.state, self.recorder = checkpoint.state.clone(), checkpoint.recorder.clone()
        if (
            self.config.history_checkpoints and not self.recorder.stale
        ):  # taken with the latest snapshot: keep it there
            self.recorder.keep_checkpoint(checkpoint, self.config.history_checkpoints)

    def history_checkpoint(self, index: int) -> Checkpoint | None:
        """Deprecated: ``history.checkpoint(index)``."""
        return self.history.checkpoint(index)

    def fork(self, **changes: Any) -> "Scheduler":
        """An independent scheduler in this one's state, sharing the model weights (never
        a copy): a what-if branch. ``changes`` replace decision settings of the fork only
        (:meth:`SchedulerConfig.fork_fields`, and ``clock``), e.g. ``policy="priority"``.

        A fork that keeps checkpoints (``history_checkpoints``) keeps one of the state it
        starts from, with the inherited latest snapshot when that snapshot shows this state
        (else with the snapshot it records on its first ``snapshot(record=True)``), so
        :meth:`restore` can return to where it forked. The original's checkpoints stay in
        the fork's history (``workbench.verify.layers.localize`` reads them); ``restore``
        takes only the fork's own.

        Raises:
            ValueError: for a setting a fork may not change, or an invalid value.
        """
        allowed = [*SchedulerConfig.fork_fields(), "clock"]
        unknown = sorted(set(changes) - set(allowed))
        if unknown:
            raise ValueError(f"fork: cannot change {unknown}; a fork may change {allowed}")
        other = self.fresh(**changes)
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
        """Check the engine's integrity: every request in the place its status says, no
        uid lost, each layer's cache offsets and widths equal to the scheduler's token
        counts, each row's text equal to what its tokens decode to
        (:mod:`workbench.engine.integrity`), and an idle engine with a queue admission
        would admit none of (a wedge). Returns an :class:`Integrity` report
        (``.ok``, ``.problems``; ``print`` it). Raises nothing; changes nothing."""
        st = self.state
        idle = st.queue and st.prefilling is None and not st.batch.rows  # admit() must take someone
        plan = self.ledger.plan(st, held_prompts=False, prompt_cache=False) if idle else None
        return check_state(st, self.tokenizer, self.admission.wedge(st.queue, plan) if idle else "")

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
        """A frozen :class:`RequestView` of ``uid`` now: status, prompt ids, tokens,
        log-probs, finish reason, error, text. The readers below are its thin aliases.

        Raises:
            KeyError: for an unknown uid. ValueError: for a uid that is not an int.
        """
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
        """``request(uid).top_logprobs``, as a list: per generated token the request's
        ``top_logprobs`` best ``(token id, log-prob)`` pairs, best first (``()`` per token
        when it asked none). E.g. ``[((42, -0.11), (7, -2.6)), ...]`` for ``top_logprobs=2``.
        Raises: KeyError for an unknown uid."""
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
        until it finishes (other rows advance too). Pieces never end in half a multi-byte
        character nor in a tail that may become a stop string; joined, they equal
        :meth:`text` (what the row already had comes first). Mirrors mlx-lm's
        ``stream_generate`` text segments.

        With ``logprobs=True`` it yields :class:`~workbench.engine.view.StreamChunk` s
        instead: each new text piece with the tokens read since the previous chunk, their
        log-probs and top-k log-probs (a chunk whenever either grows; joined, the texts are
        :meth:`text` and the tokens :meth:`tokens`).

        Raises: KeyError for an unknown uid; whatever an engine call raises (the engine
        is then as before that call)."""
        for _, piece in self._stream([self._state_of(uid).uid], logprobs):
            yield piece

    def stream_all(
        self, logprobs: bool = False
    ) -> Iterator[tuple[int, str]] | Iterator[tuple[int, StreamChunk]]:
        """``(uid, piece)`` for every row, like :meth:`stream` (``logprobs``: pieces are
        :class:`~workbench.engine.view.StreamChunk` s), driving the engine until idle
        (requests submitted meanwhile are included); each uid's pieces join to its text."""
        return self._stream(None, logprobs)

    def _stream(self, uids: list[int] | None, chunks: bool = False) -> Iterator[tuple[int, Any]]:
        sent: dict[int, int] = {}  # characters handed out per uid
        read: dict[int, int] = {}  # tokens handed out per uid (chunks)
        done: set[int] = set()  # uids finished and fully handed out: never read again

        def pieces() -> Iterator[tuple[int, Any]]:
            for u in uids if uids is not None else list(self.state.requests):
                state = self.state.requests[u]
                if u in done:
                    continue
                ready = state.text(self.tokenizer).ready
                text, t0, t1 = ready[sent.get(u, 0) :], read.get(u, 0), len(state.tokens)
                sent[u], read[u] = len(ready), t1
                if chunks and (text or t1 > t0):
                    yield u, StreamChunk.of(state, text, t0, t1)
                elif text and not chunks:
                    yield u, text
                if state.finished:
                    done.add(u)

        yield from pieces()
        while not (self.idle if uids is None else all(self.state.requests[u].finished for u in uids)):
            self._iterate()
            yield from pieces()

    def finished_greedy_uids(self) -> list[int]:
        """Deprecated: ``workbench.verify.oracle.checkable_uids(sched)``."""
        return [
            u
            for u, s in self.state.requests.items()
            if s.valid.request.greedy and s.finish_reason in ("stop", "length")
        ]

    # -- observing --------------------------------------------------------------------
    def snapshot(self, record: bool = False) -> Snapshot:
        """Frozen numpy view of the batch as the next ``step()`` will see it. Waits for an
        in-flight forward when the batch's arrays are still being computed.

        Pure by default: it changes nothing (the engine records :attr:`history` itself).
        With ``record=True`` it is also appended to :attr:`history`, unless nothing happened
        (no event) since the last one there: for views that show the engine after calls
        that do not change the batch (e.g. ``submit``)."""
        if not record or not self.history.maxlen:
            return self._capture()()
        if self.recorder.stale:
            self._record()
        return self.history[-1]

    def record(self) -> Snapshot:
        """Deprecated: ``snapshot(record=True)``."""
        return self.snapshot(record=True)

    def report(self) -> Report:
        """The :class:`Report` of everything so far (events and per-request metrics), built
        when first read: calling it costs the same however long the session."""

        def text(tokens: list[int], uid: int) -> str:  # from the report's own token events
            state = self.state.requests.get(uid)  # absent after a restore to before its submit
            if state is None:
                return self.tokenizer.decode(tokens)
            done = len(tokens) == len(state.tokens) and state.finished  # else the report ends mid-row
            return visible_text(
                self.tokenizer,
                tokens,
                state.finish_reason if done else None,
                state.valid.stop_ids,
                state.valid.stop,
            )  # finalized: all its tokens shown

        return build_report(self.events, text)

    def _capture(self) -> Callable[[], Snapshot]:
        st = self.state
        return capture(
            st.batch,
            st.step_index,
            queue=self.queue,
            kv_budget_bytes=self.config.kv_budget_bytes,
            serial_reason=self.serial_reason,
            kv_projected_bytes=self.kv_projected_bytes,
            prefilling=tuple(st.prefilling.progress()) if st.prefilling else (),
            **({"packed": st.batch.state(self.config.token_budget)} if self.packed else {}),
            **lora.snapshot_fields(self.adapters),
            **self._memory_fields(),
        )

    def _memory_fields(self) -> dict[str, int]:
        """The snapshot's byte readings beside ``kv_bytes``: the prefilling group's and the
        prompt cache's bytes, and MLX's measured active and peak memory."""
        held = self.ledger.held(self.state)
        active, peak = measured_memory()
        return dict(
            prefill_kv_bytes=held.prefill_bytes,
            prompt_cache_bytes=held.prompt_cache_bytes,
            shared_prompt_bytes=held.shared_prompt_bytes,
            active_memory_bytes=active,
            peak_memory_bytes=peak,
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


def _signature() -> inspect.Signature:
    """``Scheduler``'s signature with every setting of :class:`SchedulerConfig` spelled
    out (keyword-only), so Jupyter's Shift-Tab and ``help`` list them."""
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
