"""What mlx-lm's batch caches will really allocate: the projection the KV budget admits on.

Pure integer arithmetic over mlx-lm's allocation rules (``mlx_lm/models/cache.py``: full
attention grows by ``STEP_TOKENS`` positions shared by all rows, rings up to their window
``W``, SSM states fixed; in full: ``docs/lab/engine-notes.md``, "kv/allocation.py") and the
model's per-layer sizes (:class:`workbench.engine.kv.profile.LayerBytes`). For ``R`` cache rows
the bytes held until every row finishes are
``R * (full_token_bytes * C + sum_rings ring_token_bytes * W + fixed_bytes)``, ``C`` the
full-attention capacity once the widest row holds its last token.

Worked example (tiny-llama: 2,048 bytes per row and position): four 20-token prompts,
``max_tokens=8``, prefilled together in one chunk::

    group caches     19 prompt tokens -> capacity 256;  the join token fits (20 <= 256)
    after the join   4 rows x 256 positions x 2,048 bytes = 2,097,152 bytes
    decode           widest row ends at 20 + 8 = 28 <= 256: no growth
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

STEP_TOKENS = 256  # mlx-lm's KVCache.step / BatchKVCache.step / RotatingKVCache.step (checked in tests)
FILL_SLACK = 4 / 3  # joining into a free slot keeps shared left padding below a quarter of the width


@dataclass(frozen=True)
class Allocation:
    """The batch caches as allocated now (read by :func:`read_allocation`).

    Attributes:
        rows: cache rows ``P`` (running rows and free slots).
        width_tokens: full-attention positions in use (mlx-lm's ``size()``; the widest
            row plus shared left padding), 0 without full-attention layers.
        capacity_tokens: full-attention positions allocated (``keys.shape[2]``).
        nbytes: bytes every layer's arrays take now (mlx-lm's ``nbytes``).
    """

    rows: int = 0
    width_tokens: int = 0
    capacity_tokens: int = 0
    nbytes: int = 0


@dataclass(frozen=True)
class RowTokens:
    """One row in tokens: ``held_tokens`` cached now, ``final_tokens`` at most (prompt + ``max_tokens``)."""

    uid: int
    held_tokens: int
    final_tokens: int


def round_up(n_tokens: int, step: int = STEP_TOKENS) -> int:
    """``n_tokens`` rounded up to a multiple of ``step`` (0 stays 0)."""
    return -(-n_tokens // step) * step


def full_capacity_tokens(capacity_tokens: int, width_tokens: int) -> int:
    """Capacity (positions) a full-attention batch cache reaches as its width grows one token a
    step to ``width_tokens`` (``BatchKVCache.update_and_fetch``). Example: 256 -> 300 tokens: 512."""
    if width_tokens <= capacity_tokens:
        return capacity_tokens
    return capacity_tokens + round_up(width_tokens - capacity_tokens)


def prefill_mode(lengths: Sequence[int], chunk_tokens: int, chunked_padding: bool) -> str:
    """How a group prefilling ``lengths`` tokens per row runs (:mod:`workbench.engine.prefill`):
    ``"batched"`` (no padding, or it fits one chunk), ``"chunked"`` (right-padded chunks, with
    ``chunked_padding``), else ``"per row"``. ``([5, 1], 8, False)``: batched; ``([30, 5], 8,
    False)``: per row; ``([30, 5], 8, True)``: chunked.
    """
    longest = max(lengths, default=0)
    if all(n == longest for n in lengths) or 2 <= longest <= chunk_tokens:
        return "batched"
    return "chunked" if chunked_padding and longest > chunk_tokens else "per row"


def group_capacity_tokens(
    input_tokens: int, chunk_tokens: int, exact: bool, stored_tokens: int = 0, per_row: bool = False
) -> tuple[int, int]:
    """Full-attention positions per row a joining group allocates: ``(while prefilling,
    after the join forward)``.

    Args:
        input_tokens: the longest member's input (tokens; the last one fed by the join).
        chunk_tokens: the longest prefill chunk (``prefill_step_size``).
        exact: fixed chunks in fresh caches (no prompt cache, no pacing); else a bound.
        stored_tokens: the longest prompt-cache entry a member may start from.
        per_row: the members prefill one at a time, then ``merge``.

    Example: a 20-token input: ``(256, 256)``; a 257-token input: ``(256, 512)``.
    """
    T = max(input_tokens - 1, 0)
    if exact:
        cap, idx = 0, 0
        while idx < T:  # mlx-lm's BatchKVCache.update_and_fetch, chunk by chunk
            S = min(chunk_tokens, T - idx)
            if idx + S > cap:
                base = idx if (cap and idx % STEP_TOKENS) else cap
                cap = base + round_up(S)
            idx += S
        return cap, (T + STEP_TOKENS if per_row or T + 1 > cap else cap)
    chunk = min(chunk_tokens, max(T, 1))
    prefill = max(stored_tokens, T - 1 + round_up(chunk) if T else 0)
    return prefill, max(prefill, T + STEP_TOKENS)


@dataclass(frozen=True)
class KVPlan:
    """Everything the projection needs, frozen at one admission decision.

    Attributes:
        full_token_bytes: bytes of one row and position over all full-attention layers.
        rings: ``(window W, bytes of one row and position)`` per ring layer.
        fixed_bytes: bytes of one row's fixed states (SSM layers) over all layers.
        chunk_tokens, exact_chunks, stored_tokens: as :func:`group_capacity_tokens`.
        reuse_slots: joiners may fill free slots. chunked_padding: as :func:`prefill_mode`.
        now: the :class:`Allocation` now. rows: the running rows' :class:`RowTokens`.
    """

    full_token_bytes: int
    rings: tuple[tuple[int, int], ...]
    fixed_bytes: int
    chunk_tokens: int
    exact_chunks: bool = True
    reuse_slots: bool = True
    stored_tokens: int = 0
    now: Allocation = Allocation()
    chunked_padding: bool = False
    rows: tuple[RowTokens, ...] = field(default_factory=tuple)

    def idle(self) -> "KVPlan":
        """This plan on an idle engine (nothing allocated, no row, no cached prefix)."""
        return dataclasses.replace(self, now=Allocation(), rows=(), stored_tokens=0)

    def row_bytes(self, full_capacity_tokens: int, ring_tokens: Sequence[int] | None = None) -> int:
        """Bytes of one cache row with ``full_capacity_tokens`` full-attention positions and
        ``ring_tokens`` positions per ring (default: each ring's whole window)."""
        rings = ring_tokens if ring_tokens is not None else [w for w, _ in self.rings]
        return (
            self.full_token_bytes * full_capacity_tokens
            + self.fixed_bytes
            + sum(b * n for (_, b), n in zip(self.rings, rings))
        )

    def group_bytes(self, joiners: Sequence[RowTokens]) -> tuple[int, int]:
        """``(bytes while prefilling, full capacity after the join)`` for ``joiners``."""
        if not joiners:
            return 0, 0
        longest = max(j.held_tokens for j in joiners)
        T = max(longest - 1, 0)
        lengths = [max(j.held_tokens - 1, 0) for j in joiners]
        per_row = prefill_mode(lengths, self.chunk_tokens, self.chunked_padding) == "per row"
        prefill, joined = group_capacity_tokens(
            longest, self.chunk_tokens, self.exact_chunks, self.stored_tokens, per_row
        )
        chunk = min(self.chunk_tokens, max(T, 1))
        rings = [
            max(min(w, T + STEP_TOKENS), min(T, w - 1 + chunk), min(self.stored_tokens, w))
            for w, _ in self.rings
        ]
        return len(joiners) * self.row_bytes(prefill, rings), joined

    def projected_bytes(
        self, joiners: Sequence[RowTokens] = (), dropped: Sequence[int] = (), started: bool = False
    ) -> int:
        """Most bytes the batch and the joining group hold from now on, with uids ``dropped``
        preempted and ``joiners`` prefilled together and joined (``started``: the group is
        already prefilling); 0 for an empty engine. The terms maximized: engine notes."""
        gone = set(dropped)
        rows = [r for r in self.rows if r.uid not in gone]
        P = (
            self.now.rows - (len(self.rows) - len(rows)) if rows else 0
        )  # free slots, until the next admit/step
        capacity = self.now.capacity_tokens if rows else 0
        width = self.now.width_tokens + max(r.final_tokens - r.held_tokens for r in rows) if rows else 0
        grown = full_capacity_tokens(capacity, width)
        held_now = P * self.row_bytes(capacity) if P else 0
        running = len(rows) * self.row_bytes(grown) if rows else 0
        if not joiners:
            return max(held_now, running)
        prefill_bytes, joined_capacity = self.group_bytes(joiners)
        slack = FILL_SLACK if self.reuse_slots and rows else 1.0
        widest = max(width, math.ceil(max(j.final_tokens for j in joiners) * slack))
        # the joined capacity is the larger of the two (``extend``); it grows from there only
        # when known exactly: a bound may be above the real capacity, which then grows
        joined = (
            full_capacity_tokens(max(capacity, joined_capacity), widest)
            if self.exact_chunks
            else max(capacity, joined_capacity, widest - 1 + STEP_TOKENS if widest > capacity else 0)
        )
        after = (len(rows) + len(joiners)) * self.row_bytes(max(grown, joined))
        beside = held_now + prefill_bytes if started else 0
        return max(held_now, running + prefill_bytes, after, beside)


def plan_of(profile: Sequence[Any], chunk_tokens: int, **fields: Any) -> KVPlan:
    """A :class:`KVPlan` from a model's ``kv_profile`` (``LayerBytes`` per layer) and ``fields``."""
    full = sum(lb.per_token_bytes for lb in profile if lb.window_tokens is None)
    rings = tuple((lb.window_tokens, lb.per_token_bytes) for lb in profile if lb.window_tokens)
    fixed = sum(lb.fixed_bytes for lb in profile)
    return KVPlan(full, rings, fixed, chunk_tokens, **fields)


def read_allocation(caches: Sequence[Any] | None) -> Allocation:
    """The :class:`Allocation` of per-layer batch caches (``None``: nothing), from public fields."""
    if not caches:
        return Allocation()
    flat = [sub for c in caches for sub in (getattr(c, "caches", None) or (c,))]
    rows, width, capacity = 0, 0, 0
    for c in flat:
        keys = getattr(c, "keys", None)
        keys = keys[0] if isinstance(keys, (tuple, list)) else keys  # quantized: (packed, scales, biases)
        if keys is not None and not hasattr(c, "max_size"):
            rows, width, capacity = int(keys.shape[0]), int(c.size()), int(keys.shape[2])
            break
        if keys is not None:
            rows = int(keys.shape[0])
        elif getattr(c, "cache", None) and c.cache[0] is not None:
            rows = int(c.cache[0].shape[0])
    return Allocation(rows, width, capacity, int(sum(c.nbytes for c in caches)))
