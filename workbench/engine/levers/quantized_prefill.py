"""Prefill and join of a quantized batch: each row's first forward on float keys, every
later one on quantized keys, as mlx-lm's ``generate_step(kv_bits=, quantized_kv_start=0)``
quantizes a single sequence (the rule: :mod:`workbench.engine.levers.quantized_kv`; notes:
``docs/lab/engine-notes.md``, "levers/quantized_prefill.py").

Axis letters: ``B`` / ``n`` rows of a group, ``f`` its fresh rows (no prompt token in the
cache before the join forward), ``C`` chunk length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from ..forward import Pending, launch
from ..kv import cache_internals as internals
from ..kv import caches as kv
from ..prefill import PrefillGroup
from .quantized_kv import KVQuant, is_quantized, merge_rows, quantize_batch


class QuantizedPrefillGroup(PrefillGroup):
    """A :class:`~workbench.engine.prefill.PrefillGroup` whose caches are quantized after every
    chunk (``generate_step(..., kv_bits, quantized_kv_start=0)``); each row's first chunk is
    exactly ``first_tokens[b]`` tokens on float keys, later chunks run as asked.

    Args:
        recipe: the model, its ``max_kv_size`` and ``recipe.kv_quant``.
        first_tokens: per row, tokens of its first forward (default ``min(prefill_step_size, tail)``).
        caches: per row a prompt-cache hit's quantized prefix, fresh float caches, or ``None``.
        The others as :class:`PrefillGroup`.

    Attributes:
        prefix_tokens: per row, the tokens its ``caches`` held at the start (0: fresh).
    """

    def __init__(
        self,
        recipe: kv.CacheRecipe,
        prompts: Sequence[Sequence[int]],
        prefill_step_size: int,
        caches: list[list[Any]] | None = None,
        first_tokens: Sequence[int] | None = None,
        fixed_chunks: bool = False,
    ):
        self.quant: KVQuant = recipe.kv_quant
        tails = [len(p) for p in prompts]
        self.prefix_tokens = [prefix_tokens(c) for c in caches] if caches else [0] * len(tails)
        first = list(first_tokens) if first_tokens is not None else [prefill_step_size] * len(tails)
        first = [prefill_step_size if held else f for f, held in zip(first, self.prefix_tokens)]
        self.first_tokens = [min(f, n) for f, n in zip(first, tails)]
        hits = any(self.prefix_tokens)
        super().__init__(
            recipe.model,
            prompts,
            prefill_step_size,
            recipe.max_kv_size,
            None if hits else caches,
            fixed_chunks=fixed_chunks,
        )
        if hits or (not self.per_row and not self._shared_first_chunk(tails)):  # run the rows one by one
            self.per_row, self.caches = True, []
            self._solo = list(caches) if hits else [recipe.single() for _ in prompts]
            if self.length == 0:  # every row a whole-prefix hit: nothing to run
                self._finish()

    @staticmethod
    def _pads_safely(model: Any, max_kv_size: int | None) -> bool:
        """Never: a padded group runs in one chunk."""
        return False

    def _shared_first_chunk(self, tails: list[int]) -> bool:
        """True when one batched first chunk is every row's first forward."""
        ran = [f for f, n in zip(self.first_tokens, tails) if n]
        return ran == [n for n in tails if n] if self._padded else len(set(ran)) <= 1

    def run_chunk(self, tokens: int | None = None) -> list[int]:
        """:meth:`PrefillGroup.run_chunk`, first chunks sized, then rows that ran quantized."""
        done = self.rows_done_tokens
        if self.per_row:
            b = next(b for b, n in enumerate(self.lengths) if done[b] < n)
            tokens = self.first_tokens[b] if done[b] == 0 else tokens
        elif self.position == 0:
            tokens = max(self.first_tokens)
        real = super().run_chunk(tokens)
        if not self.per_row:
            self.caches = quantize_batch(self.caches, self.quant)
            mx.eval([c.state for c in self.caches])
        elif not self.done:
            self._quantize_rows()
        return real

    def _quantize_rows(self) -> None:
        """Quantize each per-row cache whose row has run at least one token."""
        for b, n in enumerate(self.rows_done_tokens):
            if n:
                self._solo[b] = quantize_batch(self._solo[b], self.quant)
                mx.eval([c.state for c in self._solo[b]])

    def _finish(self) -> None:
        if not self.per_row:
            super()._finish()
            return
        self._quantize_rows()
        self.caches = merge_rows(self._solo, self.quant)
        self._done = True


def prefix_tokens(caches: Sequence[Any]) -> int:
    """Tokens a row's single-sequence caches hold (0 for fresh caches)."""
    return next((int(c.offset) for c in caches if isinstance(getattr(c, "offset", None), int)), 0)


def fresh_rows(group: PrefillGroup) -> list[int]:
    """Rows of a done group whose first forward is the join forward."""
    held = getattr(group, "prefix_tokens", None) or [0] * len(group.lengths)
    return [b for b, (n, h) in enumerate(zip(group.lengths, held)) if n == 0 and h == 0]


def join_forward(
    model: Any,
    group: PrefillGroup,
    quant: KVQuant,
    last: mx.array,
    samplers: Sequence[Any],
    contexts: Sequence[Any],
    token_index: Sequence[int],
    asynchronous: bool,
    select: Callable[[list[int]], contextlib.AbstractContextManager[Any]] = lambda rows: (
        contextlib.nullcontext()
    ),
) -> Pending:
    """The join forward (``[n, 1]``) of a quantized group, then its caches quantized; fresh rows
    of a quantized group rerun ``[f, 1]`` on float caches (``select(rows)`` around it).
    Returns the :class:`Pending` of all ``n`` rows.
    """
    fresh = fresh_rows(group) if any(is_quantized(c) for c in group.caches) else []
    pending = launch(model, group.caches, last, samplers, contexts, token_index, asynchronous)
    group.caches = quantize_batch(group.caches, quant)
    if not fresh:
        return pending
    solo = kv.new_batch_cache(model, len(fresh))
    with select(fresh):
        first = launch(
            model,
            solo,
            last[mx.array(fresh)],
            [samplers[b] for b in fresh],
            [contexts[b] for b in fresh],
            [token_index[b] for b in fresh],
            asynchronous,
        )
    internals.fill_slots(
        group.caches, fresh, quantize_batch(solo, quant), list(range(len(fresh))), [1] * len(fresh)
    )
    n = len(samplers)
    return Pending.concat(pending, first).take([n + fresh.index(b) if b in fresh else b for b in range(n)])


def first_forward_tokens(states: Sequence[Any], prefill_step_size: int) -> list[int]:
    """Per request state, its reference's first forward: ``max(1, min(prefill_step_size, prompt - 1))``."""
    return [max(1, min(prefill_step_size, len(s.valid.prompt_ids) - 1)) for s in states]
