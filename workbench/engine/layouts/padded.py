"""The padded layout: mlx-lm's left-padded batch caches, the oracle's twin.

Knows: the running :class:`~workbench.engine.batch.Batch`, the prefilling group
(:class:`~workbench.engine.runner.Prefilling`), the :class:`~workbench.engine.runner.ModelRunner`
and the levers it runs (pacing, speculation). Must not know: the queue's order, admission's
policy, how a read token ends a row (the scheduler reads it).

One request's path: the scheduler :meth:`~PaddedLayout.start` s its group (a prefill
group, maybe sharing a prompt cache entry) -> :meth:`~PaddedLayout.admit` runs prefill
chunks of ``prefill_step_size`` tokens (one per call with ``interleave_prefill``; with
pacing, as many as fit the time budget) and *joins* the group: one ``[n, 1]`` forward
computes each joiner's first-token distribution, then each joiner takes a free slot or
joins by mlx-lm's ``extend`` -> :meth:`~PaddedLayout.step` reads each row's pending token
and feeds it (one ``[B, 1]`` forward, launched before the read with ``pipeline``), or with
speculation verifies each row's drafts in one ``[B, 1 + K]`` forward.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from typing import Any

from ...observe.events import Event
from ...observe.recorder import Recorder
from .. import shared_prompts
from ..batch import Batch
from ..config import SchedulerConfig
from ..forward import row_context
from ..kv import caches as kv
from ..kv.ledger import KVLedger
from ..kv.promptcache import PromptCache
from ..levers import fastpath
from ..levers.pacing import Pacer, pacing_from
from ..probe import probe
from ..runner import ModelRunner, Prefilling
from ..state import RequestState, Status
from .layout import Layout, Read, reads_of, speculation_of


class PaddedLayout(Layout):
    """The padded layout of one scheduler (see the module docstring).

    Args:
        model: the mlx-lm model. config: the scheduler's settings (after the serial lane).
        recipe: the :class:`~workbench.engine.kv.caches.CacheRecipe`. adapters: the LoRA bank
        or ``None``. invariance: the batch-invariant mode's row blocks or ``None``. quant:
        the KV quantization or ``None``. prompt_cache: the user's mlx-lm ``LRUPromptCache``,
        its size, or ``None``. vocab_size: the model's output rows.

    Raises:
        ValueError: what :func:`workbench.engine.levers.speculative.configure`,
            :meth:`~workbench.engine.levers.fastpath.FastDecode.of` and
            :func:`~workbench.engine.levers.pacing.pacing_from` raise.
    """

    def __init__(
        self,
        model: Any,
        config: SchedulerConfig,
        recipe: kv.CacheRecipe,
        adapters: Any,
        invariance: Any,
        quant: Any,
        prompt_cache: Any,
        vocab_size: int,
    ):
        cfg = self.config = config
        self.model, self.invariance, self._user_cache, self._quant = model, invariance, prompt_cache, quant
        self.speculation = speculation_of(model, cfg, vocab_size)
        fast = fastpath.FastDecode.of(False if invariance else cfg.fast_decode, adapters)
        self.runner = ModelRunner(recipe, cfg, adapters, fast, invariance)
        self.pacing = pacing_from(cfg.pacing)
        self.pacer = None if self.pacing is None else Pacer(self.pacing, cfg.prefill_step_size)
        self.ledger = KVLedger(
            recipe.profile(),
            cfg,
            self.pacing is None and prompt_cache is None and quant is None,
            chunked_padding=self.runner.chunks_padding(),
        )

    @staticmethod
    def check(model: Any, config: SchedulerConfig, prompt_cache: Any, adapters: Any) -> None:
        """Refuse a ``prompt_cache`` that is neither ``None``, an mlx-lm ``LRUPromptCache``
        nor its ``max_size`` (an int >= 0 entries) before it fails the first ``admit()``.

        Raises:
            ValueError: naming ``prompt_cache``, what it got and what it takes."""
        from mlx_lm.models.cache import LRUPromptCache

        size = isinstance(prompt_cache, int) and not isinstance(prompt_cache, bool) and prompt_cache >= 0
        if prompt_cache is not None and not size and not isinstance(prompt_cache, LRUPromptCache):
            raise ValueError(
                "prompt_cache must be an mlx-lm LRUPromptCache, its max_size (an int >= 0 entries) or "
                f"None, got {type(prompt_cache).__name__} {prompt_cache!r:.80}"
            )

    @staticmethod
    def serial_reason(model: Any, config: SchedulerConfig) -> str:
        """Why the model cannot batch rows of different lengths
        (:func:`workbench.engine.probe.probe`), probed when ``max_batch > 1``."""
        return probe(model, config.max_kv_size) if config.max_batch > 1 else ""

    def new_batch(self) -> Batch:
        """An empty :class:`Batch` (free slots kept with ``reuse_slots``)."""
        return Batch(self.config.reuse_slots)

    def prompt_cache(self) -> PromptCache | None:
        """The engine's view of the user's mlx-lm prompt cache, keyed by all that shapes a
        cache (model, window, KV quantization, adapters, fast paths, the invariant mode)."""
        if self._user_cache is None:
            return None
        return PromptCache(
            self.model,
            self._user_cache,
            self.config.max_kv_size,
            self.config.prefill_step_size if self.invariance else None,
            kv_quant=self._quant,
            adapters=self.runner.adapters,
            fast_decode=self.runner.fast_decode,
        )

    def start(self, st: Any, chosen: Sequence[RequestState]) -> None:
        """Start prefilling ``chosen`` as one group (from prompt cache entries and held
        prompts where they match)."""
        st.prefilling = self.runner.start_prefill(chosen, st.prompt_cache, st.shared_prompts)
        st.shared_prompts = shared_prompts.prune(st.shared_prompts, st.queue)  # what no sample waits for

    def admit(self, st: Any, recorder: Recorder) -> Iterator[int | None]:
        """Prefill chunks and joins: fixed chunks of ``prefill_step_size`` (one per call with
        ``interleave_prefill``, else until the queue is prefilled or the batch is full), or
        with pacing as many as fit this iteration's time budget (at least one)."""
        if self.pacer is None:
            yield from self._admit_fixed(st, recorder)
        else:
            yield from self._admit_paced(st, recorder)

    def _admit_fixed(self, st: Any, recorder: Recorder) -> Iterator[int | None]:
        chunks = 0
        while True:
            if st.prefilling is None:
                yield None  # the scheduler starts the next group, if admission chooses one
                if st.prefilling is None:
                    return
            group = st.prefilling
            if group.prefill.done:
                self._join(st, group, recorder)
                continue
            if self.config.interleave_prefill and chunks >= 1:
                return
            self._run_chunk(st, group, recorder)
            chunks += 1

    def _admit_paced(self, st: Any, recorder: Recorder) -> Iterator[int | None]:
        pacer, clock = self.pacer, recorder.clock
        now_s, rows = clock(), len(st.batch.rows)
        width = max((r.context_tokens for r in st.batch.rows), default=0)  # the widest context (tokens)
        pacer.begin_iteration(now_s, st.step_index, rows, width)
        budget_s, ran = pacer.prefill_budget_s(rows, width), False
        while True:
            if st.prefilling is None:
                yield self._group_limit(budget_s, ran)
                if st.prefilling is None:
                    return
            group = st.prefilling
            if group.prefill.done:
                join_s = pacer.decode_s(len(group.states), width)
                if ran and join_s > budget_s:
                    return
                self._join(st, group, recorder)
                budget_s, ran = budget_s - join_s, True
                continue
            b, pos, remaining = group.prefill.next_chunk()
            k = pacer.chunk_tokens(budget_s, b, pos, remaining, first=not ran)
            if k == 0:
                return
            t0 = clock()
            real = self._run_chunk(st, group, recorder, k)
            elapsed = clock() - t0
            pacer.observe_prefill(b, max(real), pos, elapsed)
            budget_s, ran = budget_s - elapsed, True

    def _group_limit(self, budget_s: float, ran: bool) -> int | None:
        """Most padded prefill tokens (rows x longest input) a new group may bring, so
        that it fits what is left of the budget; ``0`` when not even a first chunk fits
        (start no group now), ``None`` for no limit."""
        if budget_s == float("inf"):
            return None
        return self.pacer.chunk_tokens(budget_s, 1, 0, self.config.prefill_step_size, first=not ran)

    def _run_chunk(
        self, st: Any, group: Prefilling, recorder: Recorder, tokens: int | None = None
    ) -> list[int]:
        """One prefill chunk of ``group`` (``tokens`` long, default ``prefill_step_size``)
        and its ``prefill`` events (a batched group's member with no real token in the
        chunk still rides in its forward: ``n_tokens=0``); returns the real tokens per member."""
        real = self.runner.run_chunk(group, tokens)
        batched = not group.prefill.per_row
        for s, k in zip(group.prefilled, real):  # one prefill row per distinct prompt of a submit_n group
            if k or batched:
                recorder.log("prefill", s.uid, st.step_index, n_tokens=k)
        return real

    def _join(self, st: Any, group: Prefilling, recorder: Recorder) -> None:
        """The join forward (each member's last input token), then the members enter the
        batch (free slots or ``extend``); one ``join`` event each, with its mode."""
        self.runner.hold_prompts(group, st.queue, st.shared_prompts, self.ledger.room_bytes(st))
        group.expand()  # a submit_n group's prefilled row copied into each sample's row
        for s in group.states:
            s.fed = len(s.tokens)  # a resumed row's generated tokens are in its cache again
            s.join_order, st.joins = st.joins, st.joins + 1
            if not s.finished:  # aborted while prefilling: joins finished, evicted at filter
                s.status = Status.RUNNING
        contexts = [row_context(s, None, b) for b, s in enumerate(group.states)]
        pending = self.runner.join_forward(group, contexts)
        placed = st.batch.place(group.prefill.caches, group.states, pending)
        kv.settle(st.batch.caches)  # the group's caches are freed now, not at the next forward
        st.prefilling = None
        for s, (row, mode) in zip(group.states, placed):
            recorder.log(
                "join", s.uid, st.step_index, row=row, n_tokens=len(s.valid.prompt_ids), join_mode=mode
            )

    def step(self, st: Any, recorder: Recorder) -> Generator[Read | Event, None, bool]:
        """Read one token per unfinished row and feed it (``[B, 1]``); with ``pipeline``
        the next forward is launched from this step's unread tokens before they are read."""
        batch = st.batch
        batch.compact()
        if self.speculation is not None:
            yield from self._step_speculative(st, recorder)
            return True
        current = batch.pending
        contexts = [row_context(r, current, b) for b, r in enumerate(batch.rows)]
        if self.config.pipeline:  # launch step n+1 from step n's unread tokens, then read step n
            batch.pending = self.runner.decode(batch, current.tokens, contexts, True)
        toks, lps, finite = current.read()
        tops = current.read_top()
        if not self.config.pipeline:
            batch.pending = self.runner.decode(batch, current.tokens, contexts, False)
        for row in batch.rows:
            row.fed += 1
        yield from reads_of(batch.rows, toks, lps, finite, tops, current.errors)
        return True

    def _step_speculative(self, st: Any, recorder: Recorder) -> Iterator[Read | Event]:
        """``step()`` with speculation (:mod:`workbench.engine.levers.speculative`): read
        each row's pending token, then one verify forward of it and the row's drafts; the
        drafts each row accepted are its next tokens (a ``draft`` event per drafting row,
        before their token events), up to where it finishes. Not pipelined: drafting reads the tokens."""
        batch = st.batch
        current = batch.pending
        toks, lps, finite = current.read()
        yield from reads_of(batch.rows, toks, lps, finite, current.read_top(), current.errors)
        contexts = [row_context(r, None, b) for b, r in enumerate(batch.rows)]
        verified = self.runner.speculate(batch, self.speculation, toks, contexts)
        for b, row in enumerate(batch.rows):
            row.fed += 1 + verified.accepted[b]
            if verified.drafted[b]:
                n, accepted = verified.drafted[b], verified.accepted[b]
                yield recorder.log("draft", row.uid, st.step_index, row=b, n_tokens=n, n_accepted=accepted)
            for token, logprob in zip(verified.tokens[b], verified.logprobs[b]):
                if not row.finished:
                    yield Read(row, b, token, logprob, "")
        batch.pending = verified.pending

    def store(self, st: Any, b: int) -> None:
        """Store running row ``b``'s cache in the prompt cache (``ModelRunner.store``)."""
        self.runner.store(st.prompt_cache, st.batch, b)
