"""The padding cost of a mid-decode join, measured on the engine: how many padded
positions the batch cache gains when one request joins ``B - 1`` running rows.

mlx-lm's batch cache is one tensor ``[B, n_kv_heads, S, head_dim]`` whose rows are
right-aligned (left padding). A joiner that holds ``n`` tokens after its prefill meets
running rows at KV width ``w``: a shorter joiner is left-padded by ``w - n``; a longer one
widens the cache to ``n`` and pads each of the ``B - 1`` running rows by ``n - w``::

    added = max(0, w - n) + (B - 1) * max(0, n - w)

(``n`` the joiner's prompt tokens, all cached after the join; mlx-lm's
``BatchKVCache.extend`` / ``merge`` align the rows so). :func:`join_padding_table` runs the
join on a real scheduler and reads the added padding from its snapshots, beside this formula.

Knows: the scheduler's public ``submit / admit / step / filter / snapshot``. Must not know:
its internals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd

COLUMNS = ["batch_size", "prompt_tokens", "kv_width_tokens", "added_padding", "formula"]


def padded_positions(snap: Any) -> int:
    """Left-padded positions of a snapshot's first attention group: the sum over rows of
    ``clip(left_padding, 0, KV width)`` (tokens)."""
    g = next(g for g in snap.groups if g.name != "ssm")
    return int(np.clip(np.asarray(g.left_padding), 0, g.kv_width_tokens).sum())


def join_padding_formula(batch_size: int, prompt_tokens: int, width: int) -> int:
    """``max(0, w - n) + (B - 1) * max(0, n - w)``: padded positions a joiner of ``n``
    cached tokens adds to ``B - 1`` running rows at KV width ``w`` (see the module docstring).

    >>> join_padding_formula(4, 40, 14), join_padding_formula(4, 5, 14)
    (78, 9)
    """
    return max(0, width - prompt_tokens) + (batch_size - 1) * max(0, prompt_tokens - width)


def join_padding_table(
    make_sched: Callable[[int], Any],
    prompt: Callable[[int, int], list[int]],
    batch_sizes: Iterable[int] = (2, 4, 8),
    prompt_tokens: Iterable[int] = (1, 4, 8, 14, 20, 28, 36, 44),
    running_prompt_tokens: int = 10,
    steps_before: int = 4,
) -> pd.DataFrame:
    """Measure the padding of one mid-decode join per ``(B, n)``: ``B - 1`` rows of
    ``running_prompt_tokens`` decode ``steps_before`` steps, then a request of ``n`` prompt
    tokens joins (one ``admit()``); the added padding is read from the snapshots before and
    after that admit (:func:`padded_positions`).

    Args:
        make_sched: ``B -> Scheduler`` with ``max_batch >= B`` (a fresh, idle one each call).
        prompt: ``(n, start) -> n token ids`` (:func:`workbench.workloads.workload.prompt_maker`).
        batch_sizes: batch sizes ``B >= 2`` after the join (rows).
        prompt_tokens: the joiner's prompt lengths ``n`` (tokens).

    Returns:
        One row per ``(B, n)``: ``COLUMNS`` (``kv_width_tokens``: the running rows' width at
        the join; ``formula``: :func:`join_padding_formula`).

    Raises:
        ValueError: a batch size below 2.
    """
    rows = []
    for B in batch_sizes:
        if B < 2:
            raise ValueError(f"batch_sizes must be >= 2 (a join needs a running row), got {B}")
        for n in prompt_tokens:
            sched = make_sched(B)
            for i in range(B - 1):
                sched.submit(
                    {"prompt": prompt(running_prompt_tokens, 10 * i), "max_tokens": 64, "stop_ids": []}
                )
            sched.admit()
            for _ in range(steps_before):
                sched.step()
            width = sched.snapshot().kv_width_tokens
            sched.submit({"prompt": prompt(n, 300), "max_tokens": 2, "stop_ids": []})
            before = padded_positions(sched.snapshot())
            sched.admit()
            added = padded_positions(sched.snapshot()) - before
            rows.append((B, n, width, added, join_padding_formula(B, n, width)))
    return pd.DataFrame(rows, columns=COLUMNS)
