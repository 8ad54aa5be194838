"""Prefill of a joining group: the prompts (all but their last token) run into fresh
batch caches, one chunk of ``prefill_step_size`` tokens at a time, so the scheduler can
interleave the chunks with decode steps of the running rows (chunked prefill).

Two modes, chosen per group by :func:`~workbench.engine.kv.allocation.prefill_mode`:

- **batched** (mirrors mlx-lm's ``PromptProcessingBatch.prompt``): prompts right-padded to
  the longest, the cache told the right padding (``prepare``), and ``finalize()`` rolls each
  row so the padding ends up on the left. Example, prompts ``[5, 6, 7]`` and ``[9]``::

      model input (right-padded)    cache after finalize (left-padded)
      [5, 6, 7]                     [5, 6, 7]   left_padding 0
      [9, 0, 0]                     [., ., 9]   left_padding 2

- **per row**: each prompt runs alone, unpadded, in chunks; the caches are then merged (``merge``).

A padded group longer than a chunk runs batched in chunks (``chunked_padding``, a GPU
default) only when every layer is a plain ``BatchKVCache`` (``docs/architecture.md``,
"Prefill mode per device"; notes: ``docs/lab/engine-notes.md``, "prefill.py"). Axis
letters: ``B`` rows of the group, ``L`` padded prompt length, ``C`` chunk length.
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
    """Whether padded groups run batched in chunks by default (on a GPU)."""
    return on_gpu()


class PrefillGroup:
    """A group of joining rows being prefilled together.

    Args:
        model: an mlx-lm model.
        prompts: ``B`` token-id lists to run into the cache (may be empty).
        prefill_step_size: chunk length ``C`` in tokens, ``>= 1``.
        max_kv_size: passed to mlx-lm's ``make_prompt_cache`` (no sink tokens).
        caches: per-row caches holding a cached prefix; ``prompts`` are then the tails.
        chunked_padding: as the module docstring says (``None``: on a GPU only).
        fixed_chunks: every row alone in chunks of exactly ``prefill_step_size`` tokens,
            whatever ``run_chunk`` asks (the batch-invariant mode).

    Attributes:
        caches: the group's per-layer batch caches once :attr:`done`.
        per_row: True when the group runs row by row.
        chunked_padding: True when a right-padded batched group runs in several chunks.
        position: prompt columns processed (batched), or tokens summed over rows (per row).
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
        """Whether padded groups longer than a chunk run batched in chunks for ``model``."""
        asked = chunked_padding_default() if chunked_padding is None else bool(chunked_padding)
        return asked and cls._pads_safely(model, max_kv_size)

    @staticmethod
    def _pads_safely(model: Any, max_kv_size: int | None) -> bool:
        """True when every layer's batch cache is exactly mlx-lm's ``BatchKVCache``."""
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
        """An independent copy (caches cloned sharing buffers, prompts shared)."""
        out = copy.copy(self)
        out.caches = clone_caches(self.caches, share_appended)
        if self.per_row:
            out._solo = [clone_caches(c, share_appended) for c in self._solo]
        return out

    def next_chunk(self) -> tuple[int, int, int]:
        """``(rows, start, remaining)`` of the next chunk: rows it runs, tokens they hold,
        tokens left to run in it; ``(0, 0, 0)`` once :attr:`done`."""
        if self._done:
            return 0, 0, 0
        if not self.per_row:
            return len(self.prompts), self.position, self.length - self.position
        row, pos = self._row, self._row_pos
        while pos >= self.lengths[row]:
            row, pos = row + 1, 0
        return 1, pos, self.lengths[row] - pos

    def next_rows(self) -> list[int]:
        """The rows the next :meth:`run_chunk` runs: all of them batched, the first with
        prompt tokens left per row; ``[]`` once :attr:`done`."""
        if self._done:
            return []
        if not self.per_row:
            return list(range(len(self.prompts)))
        return [next(b for b, (k, n) in enumerate(zip(self.rows_done_tokens, self.lengths)) if k < n)]

    def run_chunk(self, tokens: int | None = None) -> list[int]:
        """Run the next chunk (``[B, C]`` batched, ``[1, C]`` per row), evaluated before
        returning.

        Args:
            tokens: chunk length ``C`` (default ``prefill_step_size``).

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
