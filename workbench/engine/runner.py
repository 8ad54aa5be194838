"""Running the model: prefill groups (chunked), the join forward and the decode forward.

Knows: the model, :mod:`workbench.engine.prefill`, :mod:`workbench.engine.forward`, the
prompt cache. Must not know: the queue, admission, events. Notes:
``docs/lab/engine-notes.md``, "runner.py".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from . import shared_prompts
from .batch import Batch
from .forward import DECODE, JOIN, PREFILL, VERIFY, Forward, ForwardLevers, Pending, launch
from .kv.caches import CacheRecipe, repeat_rows
from .kv.promptcache import PromptCache
from .levers import invariant_prefill, speculative
from .levers.fastpath import FastDecode
from .levers.invariant import Invariance
from .levers.invariant_preempt import QuantizedReplayPrefillGroup, ReplayPrefillGroup
from .levers.lora import AdapterBank
from .levers.quantized_prefill import (
    QuantizedPrefillGroup,
    first_forward_tokens,
)
from .levers.quantized_prefill import (
    join_forward as quantized_join_forward,
)
from .prefill import PrefillGroup
from .shared_prompts import HeldPrompt
from .siblings import shared_rows
from .state import RequestState


@dataclass
class Prefilling:
    """A group of admitted requests being prefilled together.

    Attributes:
        states: their request states (status PREFILLING, or FINISHED if aborted meanwhile).
        prefill: the chunked prefill of all but each input's last token, one prefill row
            per distinct input of a ``submit_n`` group (:mod:`workbench.engine.siblings`).
        last_tokens: each member's last input token, fed by the join forward.
        rows: each member's prefill row (``None``: member ``b`` is row ``b``); members of
            one row get copies of it when the group joins (:meth:`expand`).
    """

    states: list[RequestState]
    prefill: PrefillGroup
    last_tokens: list[int]
    rows: list[int] | None = None

    @property
    def prefilled(self) -> list[RequestState]:
        """The member whose prompt each prefill row runs (the first member of that row)."""
        if self.rows is None:
            return self.states
        return [self.states[self.rows.index(r)] for r in range(max(self.rows) + 1)]

    def progress(self) -> list[tuple[int, int, int]]:
        """``(uid, prefilled tokens, tokens to prefill)`` per member (a copied member: its row's)."""
        g = self.prefill
        rows = self.rows or range(len(self.states))
        return [(s.uid, g.rows_done_tokens[r], g.lengths[r]) for s, r in zip(self.states, rows)]

    def expand(self) -> None:
        """Once :attr:`prefill` is done: copy each prefill row to the members sharing it."""
        if self.rows is not None:
            repeat_rows(self.prefill.caches, self.rows)
            self.rows = None

    def clone(
        self, state_of: Callable[[RequestState], RequestState], share_appended: bool = False
    ) -> "Prefilling":
        """An independent copy (see :meth:`PrefillGroup.clone`)."""
        return Prefilling(
            [state_of(s) for s in self.states],
            self.prefill.clone(share_appended),
            list(self.last_tokens),
            None if self.rows is None else list(self.rows),
        )


@dataclass(frozen=True)
class ModelRunner:
    """Runs the model for the scheduler.

    Args:
        recipe: how the caches are made (:class:`~workbench.engine.kv.caches.CacheRecipe`).
        config: the scheduler's settings (``prefill_step_size``, ``pipeline``).
        adapters: the loaded LoRA adapters, each row run with its own.
        fast_decode: which decode fast paths apply (:mod:`workbench.engine.levers.fastpath`).
        invariant: the batch-invariant mode (:mod:`workbench.engine.levers.invariant`), or ``None``.
    """

    recipe: CacheRecipe
    config: Any  # a workbench.engine.config.SchedulerConfig
    adapters: AdapterBank | None = None
    fast_decode: FastDecode = FastDecode(False, False)
    invariant: Invariance | None = None

    model = property(lambda self: self.recipe.model, doc="The mlx-lm model (``recipe.model``).")

    def chunks_padding(self) -> bool:
        """Whether prefill groups run right-padded prompts batched in chunks (never quantized)."""
        group = PrefillGroup if self.recipe.kv_quant is None else QuantizedPrefillGroup
        return group.chunks_padding(self.recipe.model, self.recipe.max_kv_size)

    def start_prefill(
        self,
        states: Sequence[RequestState],
        prompt_cache: PromptCache | None,
        shared: Mapping[int, HeldPrompt] | None = None,
    ) -> Prefilling:
        """A prefill group for ``states``, each from its longest prompt-cache hit or a held
        ``shared`` prompt, ``submit_n`` members sharing a row; sets ``cached_tokens``. Runs nothing."""
        rows_of = shared_rows(states) if self.recipe.kv_quant is None else list(range(len(states)))
        firsts = sorted(set(rows_of))
        rows = None if len(firsts) == len(states) else [firsts.index(b) for b in rows_of]
        prefilled = [states[b] for b in firsts]
        inputs = [s.inputs for s in prefilled]
        caches = None
        tails = [inp[:-1] for inp in inputs]
        starts = [shared_prompts.take(shared, s) if shared else None for s in prefilled]
        if prompt_cache is not None or any(c is not None for c in starts):
            fetched = [
                (c, []) if c is not None else self._fetch(prompt_cache, t, s)
                for c, t, s in zip(starts, tails, prefilled)
            ]
            caches, tails = [c for c, _ in fetched], [rest for _, rest in fetched]
        for s, b in zip(states, rows_of):
            r = firsts.index(b)
            s.cached_tokens = len(inputs[r]) - 1 - len(tails[r])
        group = self._prefill_group(prefilled, tails, caches)
        return Prefilling(list(states), group, [s.inputs[-1] for s in states], rows)

    def _fetch(
        self, prompt_cache: PromptCache | None, tokens: list[int], state: RequestState
    ) -> tuple[list[Any], list[int]]:
        """``(single-sequence caches, tokens left to prefill)`` from the prompt cache's longest
        hit for ``tokens``, or fresh caches (:meth:`PromptCache.fetch`)."""
        if prompt_cache is None:
            return self.recipe.single(), list(tokens)
        adapter = state.valid.request.adapter
        replay = len(state.tokens) if self.invariant is not None else 0
        head, tail = list(tokens[: len(tokens) - replay]), list(tokens[len(tokens) - replay :])
        if self.recipe.kv_quant is None:
            cache, rest = prompt_cache.fetch(head, adapter)
        else:
            first = first_forward_tokens([state], self.config.prefill_step_size)[0]
            following = tail[0] if tail else state.inputs[-1]
            cache, rest = prompt_cache.fetch(head, adapter, following, first)
        return cache, rest + tail

    def hold_prompts(
        self, group: Prefilling, queue: Sequence[RequestState], shared: dict, room_bytes: int | None
    ) -> None:
        """Before ``group``'s join forward: hold its prefilled rows for queued ``submit_n`` samples."""
        if self.recipe.kv_quant is None:
            shared_prompts.hold(shared, group.prefilled, group.prefill.caches, queue, room_bytes)

    def _prefill_group(
        self, states: Sequence[RequestState], tails: list[list[int]], caches: list[Any] | None
    ) -> PrefillGroup:
        """The prefill group running ``tails`` (of ``states``) from ``caches`` (cached
        prefixes, or ``None``)."""
        recipe, step = self.recipe, self.config.prefill_step_size
        if self.invariant is not None:  # fixed chunks; resumed rows replay their decode steps
            held = [len(s.inputs) - 1 - len(t) for s, t in zip(states, tails)]
            replay = [len(s.tokens) for s in states]
            if recipe.kv_quant is not None:
                first = first_forward_tokens(states, step)
                return QuantizedReplayPrefillGroup(recipe, tails, step, first, replay, held, self.invariant)
            batched = self.adapters is None and invariant_prefill.serves(recipe.model, recipe.max_kv_size)
            group = invariant_prefill.BatchedReplayPrefillGroup if batched else ReplayPrefillGroup
            return group(recipe.model, tails, step, recipe.max_kv_size, caches, replay, held, self.invariant)
        if recipe.kv_quant is None:
            return PrefillGroup(recipe.model, tails, step, recipe.max_kv_size, caches)
        return QuantizedPrefillGroup(recipe, tails, step, caches, first_forward_tokens(states, step))

    def join_forward(self, group: Prefilling, contexts: Sequence[Callable[[], mx.array]]) -> Pending:
        """Feed each member's last input token ``[n, 1]``; the :class:`Pending` first tokens."""
        last = mx.array(group.last_tokens, dtype=mx.uint32)
        held = [len(s.inputs) - 1 for s in group.states]
        with self.levers.applied(Forward.of_rows(JOIN, group.states, held)):
            return self._join_forward(group, last, contexts, held)

    def _join_forward(
        self,
        group: Prefilling,
        last: mx.array,
        contexts: Sequence[Callable[[], mx.array]],
        held: Sequence[int],
    ) -> Pending:
        args = (
            last,
            [s.sampler for s in group.states],
            contexts,
            [len(s.tokens) for s in group.states],
            self.config.pipeline,
        )
        if (
            self.recipe.kv_quant is not None
        ):  # quantizes the caches after; a fresh row's first forward in float
            return quantized_join_forward(
                self.model,
                group.prefill,
                self.recipe.kv_quant,
                *args,
                select=lambda rows: self._rows_forward(group, rows, held),
            )
        return launch(self.model, group.prefill.caches, *args)

    @contextlib.contextmanager
    def _rows_forward(self, group: Prefilling, rows: Sequence[int], held: Sequence[int]) -> Iterator[None]:
        """Around a forward of some of ``group``'s rows alone: their adapters, and the
        batch-invariant mode's hooks over their ``held`` tokens."""
        states = [group.states[b] for b in rows]
        with self.levers.applied(Forward.of_rows(JOIN, states, [held[b] for b in rows])):
            yield

    def decode(
        self,
        batch: Batch,
        tokens: mx.array,
        contexts: Sequence[Callable[[], mx.array]],
        asynchronous: bool,
        index: Sequence[int] | None = None,
    ) -> Pending:
        """Feed ``tokens`` ``[B]`` (maybe unread) and sample each row's next token on the fast
        paths that apply (recorded in ``batch.fast_path``); ``index``: per row the token index."""
        index = [len(r.tokens) + 1 for r in batch.rows] if index is None else index
        held = [r.context_tokens for r in batch.rows]
        with self.levers.applied(Forward.of_rows(DECODE, batch.rows, held), batch.caches) as path:
            batch.fast_path = path or "none"
            return launch(
                self.model,
                batch.caches,
                tokens,
                [r.sampler for r in batch.rows],
                contexts,
                index,
                asynchronous,
            )

    def speculate(
        self,
        batch: Batch,
        spec: speculative.Speculation,
        tokens: list[int],
        contexts: Sequence[Callable[[], mx.array]],
    ) -> speculative.Verified:
        """A speculative decode step (:mod:`workbench.engine.levers.speculative`): drafts, one
        verify forward ``[B, 1 + K]``; an ordinary ``[B, 1]`` step when no row drafts."""
        drafts = speculative.propose(spec, batch)
        index = [len(r.tokens) for r in batch.rows]
        if not any(drafts):
            pending = self.decode(batch, mx.array(tokens, dtype=mx.uint32), contexts, False, index)
            return speculative.Verified.without_drafts(pending)
        batch.fast_path = "verify"
        held = [r.context_tokens for r in batch.rows]
        width = 1 + max(map(len, drafts))  # each row's adapter over all 1 + K positions
        described = Forward.of_rows(VERIFY, batch.rows, held, width, verifies=[len(d) for d in drafts])
        with self.levers.applied(described):
            verified = speculative.verify(
                self.model, batch.caches, tokens, drafts, [r.sampler for r in batch.rows], contexts, index
            )
        speculative.settle(spec, batch, verified)
        return verified

    def run_chunk(self, group: Prefilling, *args: Any) -> list[int]:
        """The group's next prefill chunk (``PrefillGroup.run_chunk(*args)``), with the
        adapters of the rows it runs (``PrefillGroup.next_rows``): all of them (``[B, C]``),
        one (``[1, C]`` per row), or the mode's rows with a chunk left."""
        prefill = group.prefill
        rows = prefill.next_rows()
        states = [group.prefilled[b] for b in rows]
        so_far = prefill.rows_done_tokens
        held = [s.cached_tokens + so_far[b] for s, b in zip(states, rows)]
        left = [prefill.lengths[b] - so_far[b] for b in rows]
        with self.levers.applied(Forward.of_rows(PREFILL, states, held, left, samples=False)):
            return prefill.run_chunk(*args)

    @property
    def levers(self) -> ForwardLevers:
        """Every lever this runner's forwards take (:meth:`ForwardLevers.applied`)."""
        return ForwardLevers(
            self.model, self.adapters, self.invariant, self._quantized_attention, self.fast_decode
        )

    @property
    def _quantized_attention(self) -> str | None:
        """The quantized cache's attention path (``None``: a float cache)."""
        return None if self.recipe.kv_quant is None else self.recipe.kv_quant.attention

    def store(self, prompt_cache: PromptCache, batch: Batch, b: int) -> None:
        """Store row ``b``'s cache in the prompt cache under its prompt + generated tokens."""
        row = batch.rows[b]
        quantized = self.recipe.kv_quant is not None
        prompt_cache.store(
            list(row.valid.prompt_ids) + row.tokens,
            batch.extract(b),
            row.fed - len(row.tokens),
            prefilled_tokens=len(row.valid.prompt_ids) - 1,
            adapter=row.valid.request.adapter,
            first_forward=first_forward_tokens([row], self.config.prefill_step_size)[0]
            if quantized
            else None,
        )
