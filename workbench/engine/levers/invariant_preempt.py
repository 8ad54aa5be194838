"""Preemption in the batch-invariant mode: a preempted row resumes by replaying exactly the
forwards that made its cache, so its bits are those of its run alone.

Knows: :class:`workbench.engine.prefill.PrefillGroup` (subclassed: per-row fixed chunks),
:func:`workbench.engine.levers.invariant.invariant_forward` (the mode's one-token forward),
mlx-lm's ``merge`` / ``extract`` of batch caches. Must not know: requests, the queue, events,
the ledger.

Recompute preemption (vLLM's default; the workbench's ``preempt``) prefills a resumed row's
prompt plus its generated tokens as one prompt. In the mode that would break the row's bits:
its generated tokens entered the cache through one-token decode forwards (row-blocked
projections, per-row attention), which are other sums than prefill chunks over the same
tokens. So a resumed row's tail runs in two parts, the forwards its run alone ran::

    inputs[:-1] = prompt[:-1] | prompt[-1], tokens[0], ..., tokens[-2]
                  ─ chunks of exactly C ─   ─ one token per forward (the mode's decode step) ─

then, as for any row, the join forward feeds ``tokens[-1]`` and samples the next token. The
replayed forwards run on a one-row batch cache inside the mode's hooks, as a decode step runs
that row alone; only the caches are evaluated (the logits are never computed). Keeping the
row's KV instead (a swap) would keep its bits too, but on unified memory it frees nothing,
which is what a KV budget preempts for.

Example, ``C = 4``, prompt of 6 tokens, 3 generated when preempted: the tail ``[p0..p4, p5,
g0, g1]`` runs as the chunk ``p0..p3``, the chunk ``p4``, then the one-token forwards ``p5``,
``g0``, ``g1``; the join forward feeds ``g2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from ..kv import caches as kv
from ..prefill import PrefillGroup
from .invariant import Invariance, invariant_forward
from .quantized_kv import merge_rows, quantize_batch
from .quantized_prefill import QuantizedPrefillGroup


class _Replays:
    """The replay of a row's last ``replay[b]`` tail tokens, one per forward (mixed into a
    prefill group class; see :class:`ReplayPrefillGroup`)."""

    def _set_replay(
        self,
        prompts: Sequence[Sequence[int]],
        replay: Sequence[int],
        held: Sequence[int],
        invariance: Invariance,
    ) -> None:
        bad = [(r, len(p)) for r, p in zip(replay, prompts) if not 0 <= r <= len(p)]
        if bad or len(replay) != len(prompts):
            raise ValueError(f"replay: per row 0..its tail's tokens, got {list(replay)} for tails {bad}")
        self.replay, self.held, self.invariance = list(replay), list(held), invariance

    def _one_row(self, solo: list[Any]) -> list[Any]:
        """Row ``solo``'s single-sequence caches as one-row batch caches (no padding)."""
        return kv.merge_rows([solo])

    def _settle(self, caches: list[Any]) -> list[Any]:
        """The one-row caches after a replayed forward (a quantized group quantizes them)."""
        return caches

    def _replay_forwards(self, b: int, start: int, size: int) -> int:
        """Row ``b``'s tail tokens ``[start, start + size)`` (all in its replayed part), one
        per forward as the mode's decode step runs them, into ``_solo[b]``; returns how many ran."""
        tokens = self.prompts[b][start : start + size]
        caches = self._one_row(self._solo[b])  # the decode step's cache, this row alone
        for i, t in enumerate(tokens):
            with invariant_forward(self.model, self.invariance, [self.held[b] + start + i]):
                self.model(mx.array([[t]], dtype=mx.uint32), cache=caches)  # [1, 1]; logits unused
            caches = self._settle(caches)
            mx.eval([c.state for c in caches])
        self._solo[b] = [c.extract(0) for c in caches]
        return len(tokens)

    def _run_row_chunk(self, size: int) -> list[int]:
        while self._row_pos >= self.lengths[self._row]:
            self._row, self._row_pos = self._row + 1, 0
        b, start = self._row, self._row_pos
        chunked = self.lengths[b] - self.replay[b]
        if start < chunked:  # the prompt's chunks, the last one ending where the replay starts
            return super()._run_row_chunk(min(size, chunked - start))
        n = self._replay_forwards(b, start, size)
        self._row_pos, self.position = self._row_pos + n, self.position + n
        if self.position >= sum(self.lengths):  # every row's tail in its cache
            self._finish()
        return [n if r == b else 0 for r in range(len(self.prompts))]


class ReplayPrefillGroup(_Replays, PrefillGroup):
    """The mode's float-cache prefill group where the batched one
    (:class:`~.invariant_prefill.BatchedReplayPrefillGroup`) does not serve: adapters, rings
    or recurrent state (:func:`~.invariant_prefill.serves`). :class:`PrefillGroup` with
    ``fixed_chunks``: each row's tail in chunks of exactly ``prefill_step_size``, except its
    last ``replay[b]`` tokens (a resumed row's, see the module docstring), which run one per
    forward as the mode's decode step runs them.

    Args:
        model, prompts, prefill_step_size, max_kv_size, caches: as :class:`PrefillGroup`.
        replay: ``[B]`` per row, how many of its tail's last tokens run one per forward
            (``0``: a fresh row; a resumed row: its generated tokens, ``len(tokens)``).
        held: ``[B]`` per row, tokens its cache holds before its tail (a prompt-cache hit).
        invariance: the mode's row blocks (:class:`Invariance`).

    Raises:
        ValueError: a ``replay`` count below 0 or above its row's tail.
    """

    def __init__(
        self,
        model: Any,
        prompts: Sequence[Sequence[int]],
        prefill_step_size: int,
        max_kv_size: int | None,
        caches: list[list[Any]] | None,
        replay: Sequence[int],
        held: Sequence[int],
        invariance: Invariance,
    ):
        self._set_replay(prompts, replay, held, invariance)
        PrefillGroup.__init__(self, model, prompts, prefill_step_size, max_kv_size, caches, fixed_chunks=True)


class QuantizedReplayPrefillGroup(_Replays, QuantizedPrefillGroup):
    """:class:`ReplayPrefillGroup` for a quantized KV cache (``kv_bits``): the prompt's chunks
    as :class:`QuantizedPrefillGroup` runs them (the first on float keys, each quantized
    after), the replayed tokens on the row's quantized batch cache, quantized after each
    forward as the decode step's cache is (a one-token prompt's first forward on float keys,
    as its join forward is).

    Args:
        recipe, prompts, prefill_step_size, first_tokens: as :class:`QuantizedPrefillGroup`.
        replay, held, invariance: as :class:`ReplayPrefillGroup`.
    """

    def __init__(
        self,
        recipe: kv.CacheRecipe,
        prompts: Sequence[Sequence[int]],
        prefill_step_size: int,
        first_tokens: Sequence[int],
        replay: Sequence[int],
        held: Sequence[int],
        invariance: Invariance,
    ):
        self._set_replay(prompts, replay, held, invariance)
        QuantizedPrefillGroup.__init__(
            self, recipe, prompts, prefill_step_size, None, first_tokens, fixed_chunks=True
        )

    def _one_row(self, solo: list[Any]) -> list[Any]:
        return merge_rows([solo], self.quant)

    def _settle(self, caches: list[Any]) -> list[Any]:
        return quantize_batch(caches, self.quant)
