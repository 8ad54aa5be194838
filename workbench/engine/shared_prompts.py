"""Samples of one ``submit_n`` admitted in later groups start from the first's prompt KV.

When ``max_batch`` or a KV budget leaves some samples of a group in the queue, the group's
prefilled row (its inputs but the last token) is extracted before the join forward (mlx-lm's
``extract``) and held under the group's first uid; a waiting sample is admitted with a copy of
it as its cached prefix (no prefill forward). A held prompt is never written, counts against
``kv_budget_bytes`` and yields before a request waits (``docs/lab/engine-notes.md``,
"shared_prompts.py"). Example, ``submit_n(request, 4)`` with ``max_batch=2``::

    admit()   uids 0 1 prefilled once, joined    held {0: prompt[:-1]}   (2 and 3 wait)
    filter()  0 1 evicted
    admit()   2 3 start from copies of held[0]   held {}  (none waits): no prefill forward

Any cache class works; not for a quantized KV cache or the packed layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .kv.cache_internals import clone_caches
from .state import RequestState


@dataclass(frozen=True)
class HeldPrompt:
    """One sample group's prefilled prompt.

    Attributes:
        tokens: the tokens its caches hold (the first sample's inputs but the last).
        caches: per-layer single-sequence mlx-lm caches ``[1, n_kv_heads, S, head_dim]``
            (``S = len(tokens)``), never written.
        nbytes: what they hold (the sum of mlx-lm's ``nbytes``).
    """

    tokens: tuple[int, ...]
    caches: list[Any]
    nbytes: int


def _waits_for(queue: Sequence[RequestState], group: int, tokens: tuple[int, ...]) -> bool:
    """Whether a queued request of sample group ``group`` starts with ``tokens``."""
    return any(q.sample_group == group and tuple(q.inputs[:-1]) == tokens for q in queue)


def hold(
    held: dict[int, HeldPrompt],
    prefilled: Sequence[RequestState],
    caches: Sequence[Any],
    queue: Sequence[RequestState],
    room_bytes: int | None,
) -> None:
    """After a group's prefill: hold row ``r`` of ``caches`` for its sample group where a sample
    with the same inputs waits in ``queue``, within ``room_bytes`` (``None``: no budget). In place.

    Args:
        held: sample group (first uid) -> :class:`HeldPrompt`.
        prefilled: the request state each prefill row ran (``Prefilling.prefilled``).
        caches: the group's per-layer batch caches, one row per prefill row, done.
    """
    for r, s in enumerate(prefilled):
        tokens = tuple(s.inputs[:-1])
        if s.sample_group < 0 or s.sample_group in held or not tokens:
            continue
        if not _waits_for(queue, s.sample_group, tokens):
            continue
        solo = [c.extract(r) for c in caches]
        mx.eval([c.state for c in solo])
        nbytes = int(sum(c.nbytes for c in solo))
        if room_bytes is not None and nbytes > room_bytes:
            continue
        held[s.sample_group] = HeldPrompt(tokens, solo, nbytes)
        if room_bytes is not None:
            room_bytes -= nbytes


def take(held: Mapping[int, HeldPrompt], s: RequestState) -> list[Any] | None:
    """A copy of the caches held for ``s``'s sample group when they fit its inputs, else ``None``."""
    h = held.get(s.sample_group)
    if h is None or tuple(s.inputs[:-1]) != h.tokens:
        return None
    return clone_caches(h.caches)


def prune(held: Mapping[int, HeldPrompt], queue: Sequence[RequestState]) -> dict[int, HeldPrompt]:
    """``held`` without the prompts no queued sample can use any more."""
    return {g: h for g, h in held.items() if _waits_for(queue, g, h.tokens)}


def held_bytes(held: Mapping[int, HeldPrompt]) -> int:
    """Bytes every held prompt holds."""
    return sum(h.nbytes for h in held.values())
