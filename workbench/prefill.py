"""Prefill of a joining group: run the prompts (all but their last token) into fresh
batch caches, in chunks of ``prefill_step_size`` tokens.

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

from typing import Any, Callable, Sequence

import mlx.core as mx


def prefill(
    model: Any,
    caches: list[Any],
    prompts: Sequence[Sequence[int]],
    prefill_step_size: int,
    on_chunk: Callable[[list[int]], None] | None = None,
) -> None:
    """Fill ``caches`` (the group's batch caches, modified in place) with ``prompts``.

    Args:
        model: an mlx-lm model.
        caches: per-layer batch caches for the ``B`` rows, empty (``new_batch_cache``).
        prompts: ``B`` token-id lists (may be empty; an all-empty group is a no-op).
        prefill_step_size: chunk length ``C`` in tokens, ``>= 1``.
        on_chunk: called after each chunk with the real (non-pad) tokens per row.

    Raises:
        ValueError: if ``len(prompts)`` does not match the caches' batch size.
    """
    lengths = [len(p) for p in prompts]
    L = max(lengths, default=0)
    if L == 0:
        return
    right_padding = [L - n for n in lengths]
    tokens = mx.array([list(p) + [0] * (L - len(p)) for p in prompts], dtype=mx.uint32)  # [B, L]
    if max(right_padding) > 0:
        for c in caches:
            c.prepare(lengths=lengths, right_padding=right_padding)
    for start in range(0, L, prefill_step_size):
        chunk = tokens[:, start : start + prefill_step_size]  # [B, C]
        model(chunk, cache=caches)
        mx.eval([c.state for c in caches])
        if on_chunk is not None:
            C = chunk.shape[1]
            on_chunk([max(0, min(C, n - start)) for n in lengths])
    if max(right_padding) > 0:
        for c in caches:
            c.finalize()
        mx.eval([c.state for c in caches])
