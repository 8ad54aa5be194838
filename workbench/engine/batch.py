"""The running batch: mlx-lm's per-layer batch caches and every per-row field, changed
together by mlx-lm's verbs.

Mirrors mlx-lm's ``GenerationBatch``: ``extend`` appends joiners, ``filter`` keeps the
listed rows, and every per-row field (cache row, pending token, request state) moves with
its row. One addition: with ``reuse_slots`` a filtered row's cache row stays allocated as
a *free slot* and :meth:`Batch.place` writes the next joiner into it (one row written
instead of the batch copied by ``filter`` then ``extend``); :meth:`Batch.compact` drops
free slots no joiner took before the next forward runs.

Axis letters: ``B`` rows, ``P`` cache rows (``B`` plus free slots).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx

from .forward import Pending
from .kv import cache_internals as internals
from .kv import caches as kv
from .state import RequestState

NEW_BATCH, EXTEND, FREE_SLOT = "new batch", "extend", "free slot"  # how a row joined (Event.join_mode)


class Batch:
    """The running rows and their caches.

    Args:
        reuse_slots: keep filtered rows' cache rows as free slots for the next joiner
            (``True``), or remove them at once with mlx-lm's ``filter`` (``False``).

    Attributes (read them; only the scheduler changes them):
        rows: ``B`` request states in row order.
        caches: per-layer mlx-lm batch caches over ``P`` cache rows (free slots
            included), or ``None`` when no row runs.
        pending: next-token results ``[B]`` of the last forward, aligned with ``rows``.
        free: cache rows (``[0, P)``) of filtered rows kept for the next joiner.
        fast_path: the last decode step's fast paths (``decode_fast_path``'s names; ``"none"``,
            ``"verify"``; ``""`` before the first decode step).
        draft: the draft model's :class:`~workbench.engine.levers.draft_model.DraftCaches`, or ``None``.
    """

    def __init__(self, reuse_slots: bool = True):
        self.reuse_slots = bool(reuse_slots)
        self.rows: list[RequestState] = []
        self.caches: kv.LayerCaches | None = None
        self.pending: Pending | None = None
        self.free: list[int] = []
        self.fast_path = ""
        self.draft = None

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def live_slots(self) -> list[int]:
        """Cache row of each running row (row order): the cache rows that are not free."""
        free = set(self.free)
        return [p for p in range(len(self.rows) + len(free)) if p not in free]

    @property
    def view(self) -> kv.LayerCaches | None:
        """The caches with row ``b`` = running row ``b`` (a lazy view; do not mutate)."""
        if not self.caches or not self.free:
            return self.caches
        return internals.view_rows(self.caches, self.live_slots)

    @property
    def kv_bytes(self) -> int:
        """Bytes the caches allocate (capacity and free slots included)."""
        return kv.kv_bytes(self.caches)

    def place(
        self, joiners: kv.LayerCaches, states: Sequence[RequestState], pending: Pending
    ) -> list[tuple[int, str]]:
        """Add joining rows (caches ``joiners``, pending first tokens), into free slots where they
        fit, else by ``extend``. Returns per joiner ``(row, "new batch" | "extend" | "free slot")``."""
        n_live = len(self.rows)
        if self.caches is None:
            self.caches, self.rows, self.pending = joiners, list(states), pending
            return [(b, NEW_BATCH) for b in range(len(states))]
        lengths = [s.context_tokens for s in states]
        order = self._put(joiners, lengths)
        self.pending = Pending.concat(self.pending, pending).take(
            [i if mode == "live" else n_live + i for mode, i in order]
        )
        self.rows = [self.rows[i] if mode == "live" else states[i] for mode, i in order]
        where = {i: (b, mode) for b, (mode, i) in enumerate(order) if mode != "live"}
        return [where[i] for i in range(len(states))]

    def _put(self, joiners: kv.LayerCaches, lengths: list[int]) -> list[tuple[str, int]]:
        """Free slots first, then ``extend``; the new cache row order as ``(mode, index)`` pairs."""
        live = self.live_slots
        n_slots = len(live) + len(self.free)
        by_slot: dict[int, tuple[str, int]] = {p: ("live", b) for b, p in enumerate(live)}
        width = internals.fill_width(self.caches) if self.free else 0
        fit = [i for i, n in enumerate(lengths) if n <= width][: len(self.free)]
        if fit and internals.can_fill(self.caches, joiners, [lengths[i] for i in fit]):
            used, self.free = self.free[: len(fit)], self.free[len(fit) :]
            internals.fill_slots(self.caches, used, joiners, fit, [lengths[i] for i in fit])
            by_slot.update({p: (FREE_SLOT, i) for p, i in zip(used, fit)})
            held = [r.context_tokens for r in self.rows] + [lengths[i] for i in fit]
            internals.trim_shared_padding(self.caches, max(held))
        else:
            fit = []
        rest = [i for i in range(len(lengths)) if i not in fit]
        if rest:
            self.caches = kv.join(self.caches, joiners if not fit else kv.evict(joiners, rest))
            by_slot.update({n_slots + k: (EXTEND, i) for k, i in enumerate(rest)})
        return [by_slot[p] for p in sorted(by_slot)]

    def filter(self, keep: Sequence[int], reuse_slots: bool | None = None) -> None:
        """Keep only rows ``keep`` (sorted), mlx-lm's ``filter``; the others' cache rows become
        free slots (``reuse_slots``, default the batch's) or go at once."""
        keep = list(keep)
        live = self.live_slots
        if not keep:
            self.caches, self.free = None, []
        elif self.reuse_slots if reuse_slots is None else reuse_slots:
            self.free = sorted(set(self.free) | {p for b, p in enumerate(live) if b not in keep})
        else:
            self.caches = kv.evict(self.caches, [live[b] for b in keep])
            self.free = []
        self.pending = self.pending.take(keep) if keep else None
        self.rows = [self.rows[b] for b in keep]

    def compact(self) -> bool:
        """Remove free slots from the caches (mlx-lm's ``filter``) so no forward runs over
        them. Returns True if there were any."""
        if not self.free:
            return False
        self.caches = kv.evict(self.caches, self.live_slots)
        self.free = []
        return True

    def extract(self, b: int) -> kv.LayerCaches:
        """Row ``b``'s single-sequence caches (mlx-lm's ``extract``), evaluated."""
        slot = self.live_slots[b]
        solo = [c.extract(slot) for c in self.caches]
        mx.eval([c.state for c in solo])
        return solo

    def clone(
        self, state_of: Callable[[RequestState], RequestState], share_appended: bool = False
    ) -> "Batch":
        """An independent copy sharing the cache buffers; ``state_of`` maps row states."""
        out = Batch(self.reuse_slots)
        out.rows = [state_of(r) for r in self.rows]
        out.caches = internals.clone_caches(self.caches, share_appended)
        out.pending = None if self.pending is None else self.pending.clone()
        out.free = list(self.free)
        out.fast_path = self.fast_path
        out.draft = None if self.draft is None else self.draft.clone(share_appended)
        return out
