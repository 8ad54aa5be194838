"""Prefill of a joining group: the prompts (all but their last token) run into fresh
batch caches, one chunk of ``prefill_step_size`` tokens at a time, so the scheduler can
interleave the chunks with decode steps of the running rows (chunked prefill).

Knows: mlx-lm's ``prepare(lengths=, right_padding=)`` / ``finalize()`` protocol. Must
not know: requests, events, scheduling policy.

Mirrors mlx-lm's ``PromptProcessingBatch.prompt``: prompts are right-padded to the
group's longest one, the cache is told the right padding, chunks run through the model,
and ``finalize()`` rolls each row so the padding ends up on the left (where
``BatchKVCache`` expects it). Example, prompts ``[5, 6, 7]`` and ``[9]``::

    model input (right-padded)    cache after finalize (left-padded)
    [5, 6, 7]                     [5, 6, 7]   left_padding 0
    [9, 0, 0]                     [., ., 9]   left_padding 2

Axis letters: ``B`` rows of the group, ``L`` padded prompt length, ``C`` chunk length.
"""

from __future__ import annotations

from typing import Any, Sequence

import mlx.core as mx

from . import caches as kv


class PrefillGroup:
    """A group of joining rows being prefilled together.

    Args:
        model: an mlx-lm model.
        prompts: ``B`` token-id lists to run into the cache (may be empty).
        prefill_step_size: chunk length ``C`` in tokens, ``>= 1``.
        max_kv_size: passed to :func:`workbench.caches.new_batch_cache`.
        caches: optional per-row single-sequence caches already holding a cached prefix
            (from the prompt cache); ``prompts`` are then the uncached tails. Merged
            left-padded, then right-padded tails run and ``finalize`` moves all padding left.

    Attributes:
        caches: the group's per-layer batch caches (joined to the running batch when
            :attr:`done`).
        position: prompt columns processed so far (tokens).
        length: ``L``, the longest prompt (tokens).
    """

    def __init__(self, model: Any, prompts: Sequence[Sequence[int]], prefill_step_size: int,
                 max_kv_size: int | None = None, caches: list[list[Any]] | None = None):
        self.model = model
        self.caches = kv.merge_rows(caches) if caches else kv.new_batch_cache(model, len(prompts), max_kv_size)
        self.lengths = [len(p) for p in prompts]
        self.length = max(self.lengths, default=0)
        self.right_padding = [self.length - n for n in self.lengths]
        self.step_size = prefill_step_size
        self.position = 0
        self._tokens = mx.array([list(p) + [0] * (self.length - len(p)) for p in prompts],
                                dtype=mx.uint32)  # [B, L]
        self._padded = max(self.right_padding, default=0) > 0
        if self._padded:
            for c in self.caches:
                c.prepare(lengths=self.lengths, right_padding=self.right_padding)
        if self.length == 0:
            self._finish()

    @property
    def done(self) -> bool:
        """True when every prompt column is in the cache and padding moved left."""
        return self.position >= self.length and not self._padded

    def run_chunk(self) -> list[int]:
        """Run the next chunk ``[B, C]`` through the model (evaluated before returning).

        Returns:
            Real (non-pad) tokens per row in this chunk.

        Raises:
            RuntimeError: if the group is already :attr:`done`.
        """
        if self.done:
            raise RuntimeError("prefill group is done; nothing left to run")
        start = self.position
        chunk = self._tokens[:, start : start + self.step_size]  # [B, C]
        self.model(chunk, cache=self.caches)
        mx.eval([c.state for c in self.caches])
        self.position += chunk.shape[1]
        real = [max(0, min(chunk.shape[1], n - start)) for n in self.lengths]
        if self.position >= self.length:
            self._finish()
        return real

    def _finish(self) -> None:
        if self._padded:
            for c in self.caches:
                c.finalize()
            mx.eval([c.state for c in self.caches])
            self._padded = False
        self.position = self.length
