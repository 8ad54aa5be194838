"""Prefill of a joining group: the prompts (all but their last token) run into fresh
batch caches, one chunk of ``prefill_step_size`` tokens at a time, so the scheduler can
interleave the chunks with decode steps of the running rows (chunked prefill).

Knows: mlx-lm's ``prepare(lengths=, right_padding=)`` / ``finalize()`` protocol and
``merge``. Must not know: requests, events, scheduling policy.

Two modes, chosen per group:

- **batched** (mirrors mlx-lm's ``PromptProcessingBatch.prompt``): prompts are
  right-padded to the group's longest one, the cache is told the right padding, the chunk
  runs through the model, and ``finalize()`` rolls each row so the padding ends up on the
  left (where ``BatchKVCache`` expects it). Example, prompts ``[5, 6, 7]`` and ``[9]``::

      model input (right-padded)    cache after finalize (left-padded)
      [5, 6, 7]                     [5, 6, 7]   left_padding 0
      [9, 0, 0]                     [., ., 9]   left_padding 2

- **per row**: each prompt runs alone, unpadded, in chunks; the rows' caches are merged
  (``merge``, left-padding the shorter) when all are done.

The mode is :func:`~workbench.engine.kv.allocation.prefill_mode`: batched when the group
needs no padding or its padded prompt fits one chunk of at least 2 columns; batched in
chunks (``chunked_padding``, a GPU default) only when every layer is a plain
``BatchKVCache``; otherwise per row, as mlx-lm's right-padding protocol is not safe across
chunks for rings and SSM states (``docs/architecture.md``, "Prefill mode per device").

Axis letters: ``B`` rows of the group, ``L`` padded prompt length, ``C`` chunk length.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from ..runtime.device import on_gpu
from .kv import caches as kv
from .kv.allocation import prefill_mode
from .kv.cache_internals import clone_caches


def chunked_padding_default() -> bool:
    """Whether padded groups run batched in chunks by default: on a GPU (see the module
    docstring)."""
    return on_gpu()


class PrefillGroup:
    """A group of joining rows being prefilled together.

    Args:
        model: an mlx-lm model.
        prompts: ``B`` token-id lists to run into the cache (may be empty).
        prefill_step_size: chunk length ``C`` in tokens, ``>= 1``.
        max_kv_size: passed to mlx-lm's ``make_prompt_cache`` (rotating caches keep no
            sink tokens, like the batch's: :func:`workbench.engine.kv.caches.single_cache`).
        caches: optional per-row single-sequence caches already holding a cached prefix
            (from the prompt cache); ``prompts`` are then the uncached tails.
        chunked_padding: let a right-padded group longer than a chunk run batched in
            chunks where the caches allow it (see the module docstring); ``None``: on a
            GPU only.
        fixed_chunks: every row runs alone (per row, also a group of one) in chunks of
            exactly ``prefill_step_size`` tokens from its first uncached token, whatever
            ``run_chunk(tokens)`` asks: the chunks it runs alone (the batch-invariant mode,
            :mod:`workbench.engine.levers.invariant`).

    Attributes:
        caches: the group's per-layer batch caches once :attr:`done` (joined to the
            running batch by the scheduler).
        per_row: True when the group runs row by row (see the module docstring).
        chunked_padding: True when a right-padded batched group runs in several chunks.
        position: prompt columns processed so far (batched), or prompt tokens summed over
            rows (per row); see :attr:`rows_done_tokens` for each row.
        length: ``L``, the longest prompt (tokens).
    """

    def __init__(
        self,
        model: Any,
        prompts: Sequence[Sequence[int]],
        prefill_step_size: int,
        max_kv_size: int | None = None,
        caches: list[list[Any]] | None = None,
        chunked_padding: bool | None = None,
        fixed_chunks: bool = False,
    ):
        self.model = model
        self.prompts = [list(p) for p in prompts]
        self.lengths = [len(p) for p in prompts]
        self.length = max(self.lengths, default=0)
        self.right_padding = [self.length - n for n in self.lengths]
        self.step_size = prefill_step_size
        padded = max(self.right_padding, default=0) > 0
        mode = prefill_mode(
            self.lengths, prefill_step_size, self.chunks_padding(model, max_kv_size, chunked_padding)
        )
        self.chunked_padding, self.per_row = mode == "chunked", mode == "per row"
        self.fixed_chunks = bool(fixed_chunks)
        if self.fixed_chunks:  # every row alone, also a group of one: the chunks it runs alone
            self.chunked_padding, self.per_row = False, True
        self.position = 0
        self._row, self._row_pos = 0, 0
        if self.per_row:
            self._solo = caches or [kv.single_cache(model, max_kv_size) for _ in prompts]
            self.caches: list[Any] = []
        else:
            self.caches = (
                kv.merge_rows(caches) if caches else kv.new_batch_cache(model, len(prompts), max_kv_size)
            )
            if padded:
                for c in self.caches:
                    c.prepare(lengths=self.lengths, right_padding=self.right_padding)
            self._padded = padded
            self._tokens = mx.array(
                [p + [0] * (self.length - len(p)) for p in self.prompts], dtype=mx.uint32
            )  # [B, L]
        self._done = False
        if self.length == 0:
            self._finish()

    @classmethod
    def chunks_padding(
        cls, model: Any, max_kv_size: int | None = None, chunked_padding: bool | None = None
    ) -> bool:
        """Whether this group class runs right-padded groups longer than a chunk batched in
        chunks for ``model``: ``chunked_padding`` asked (``None``: on a GPU) and the caches
        pad safely. The ``chunked_padding`` of :func:`~workbench.engine.kv.allocation.prefill_mode`."""
        asked = chunked_padding_default() if chunked_padding is None else bool(chunked_padding)
        return asked and cls._pads_safely(model, max_kv_size)

    @staticmethod
    def _pads_safely(model: Any, max_kv_size: int | None) -> bool:
        """True when right-padded prompts may run in several chunks: every layer's batch
        cache is exactly mlx-lm's ``BatchKVCache`` (see the module docstring)."""
        return all(type(c) is kv.BatchKVCache for c in kv.new_batch_cache(model, 1, max_kv_size))

    @property
    def rows_done_tokens(self) -> list[int]:
        """Per row, its prompt tokens already in the cache."""
        if not self.per_row:
            return [min(self.position, n) for n in self.lengths]
        return [
            n if b < self._row else (self._row_pos if b == self._row else 0)
            for b, n in enumerate(self.lengths)
        ]

    @property
    def kv_bytes(self) -> int:
        """Bytes the group's caches hold now (per-row caches before they are merged)."""
        held = self._solo if self.per_row and not self._done else [self.caches]
        return int(sum(c.nbytes for layers in held for c in layers))

    @property
    def done(self) -> bool:
        """True when every prompt token is in :attr:`caches` (padding moved left)."""
        return self._done

    def clone(self, share_appended: bool = False) -> "PrefillGroup":
        """An independent copy (for checkpoints): caches cloned sharing their buffers
        (:func:`workbench.engine.kv.cache_internals.clone_caches`), prompts shared."""
        out = copy.copy(self)
        out.caches = clone_caches(self.caches, share_appended)
        if self.per_row:
            out._solo = [clone_caches(c, share_appended) for c in self._solo]
        return out

    def next_chunk(self) -> tuple[int, int, int]:
        """The shape of the next chunk: ``(rows, start, remaining)`` — rows it runs
        (``B`` batched, 1 per row), tokens its rows already hold, tokens left to run in
        it. A padded batched group without :attr:`chunked_padding` runs in one chunk, so its
        ``remaining`` is the whole prompt; ``(0, 0, 0)`` once :attr:`done`."""
        if self._done:
            return 0, 0, 0
        if not self.per_row:
            return len(self.prompts), self.position, self.length - self.position
        row, pos = self._row, self._row_pos
        while pos >= self.lengths[row]:
            row, pos = row + 1, 0
        return 1, pos, self.lengths[row] - pos

    def run_chunk(self, tokens: int | None = None) -> list[int]:
        """Run the next chunk (``[B, C]`` batched, ``[1, C]`` per row), evaluated before
        returning.

        Args:
            tokens: chunk length ``C`` (default ``prefill_step_size``); a padded batched
                group runs its whole prompt in one chunk unless :attr:`chunked_padding`.

        Returns:
            Real (non-pad) tokens per row in this chunk.

        Raises:
            RuntimeError: if the group is already :attr:`done`.
        """
        if self._done:
            raise RuntimeError("prefill group is done; nothing left to run")
        size = self.step_size if tokens is None or self.fixed_chunks else max(1, int(tokens))
        return self._run_row_chunk(size) if self.per_row else self._run_batch_chunk(size)

    def _run_batch_chunk(self, size: int) -> list[int]:
        start = self.position
        if self._padded and not self.chunked_padding:
            size = self.length  # right padding is only safe within one chunk for these caches
        tokens = self._tokens[:, start : start + size]  # [B, C]
        self.model(tokens, cache=self.caches)
        mx.eval([c.state for c in self.caches])
        C = tokens.shape[1]
        self.position += C
        real = [max(0, min(C, n - start)) for n in self.lengths]
        if self.position >= self.length:
            self._finish()
        return real

    def _run_row_chunk(self, size: int) -> list[int]:
        while self._row_pos >= self.lengths[self._row]:
            self._row, self._row_pos = self._row + 1, 0
        b, start = self._row, self._row_pos
        chunk = self.prompts[b][start : start + size]
        self.model(mx.array([chunk], dtype=mx.uint32), cache=self._solo[b])  # [1, C]
        mx.eval([c.state for c in self._solo[b]])
        self._row_pos += len(chunk)
        self.position += len(chunk)
        if self.position >= sum(self.lengths):
            self._finish()
        real = [0] * len(self.prompts)
        real[b] = len(chunk)
        return real

    def _finish(self) -> None:
        if self.per_row:
            self.caches = kv.merge_rows(self._solo)
        elif self._padded:
            for c in self.caches:
                c.finalize()
            mx.eval([c.state for c in self.caches])
        self._done = True
