"""Inspection of a running scheduler: per-uid results, snapshots and history, the report.

Knows: the scheduler's state (queue, prefilling group, rows, finished rows, batch cache),
mlx-lm's caches through :mod:`workbench.engine.caches`. Must not know: how the engine changes
that state (see :mod:`workbench.engine.scheduler`, which mixes this class in). Reads only:
nothing here changes the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections import deque
from typing import Any, Callable

import numpy as np

from . import caches as kv
from . import slots
from ..observe.report import Report, build_report
from .request import ValidRequest
from .sampling import RowSampler
from ..observe.snapshot import LayerGroup, Snapshot, frozen


@dataclass
class Row:
    """A request's generation state while it runs and after it finished."""

    uid: int
    valid: ValidRequest
    sampler: RowSampler
    tokens: list[int] = field(default_factory=list)
    fed: int = 0
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    message: str = ""
    joined: int = -1  # order of joining the running batch (rows in free slots break row order)


class Inspection:
    """The scheduler's read-only side (mixed into :class:`workbench.engine.scheduler.Scheduler`)."""

    def _row_of(self, uid: int) -> Row:
        for r in self._rows:
            if r.uid == uid:
                return r
        if uid in self._done:
            return self._done[uid]
        if uid in self._preempted:
            return self._preempted[uid]
        if uid in self._requests:  # queued or prefilling: nothing generated yet
            row = Row(uid, self._requests[uid], None)
            row.finish_reason = "abort" if uid in self._aborted else None
            return row
        known = f"submitted uids are 0..{self._next_uid - 1}" if self._next_uid else "nothing was submitted yet"
        raise KeyError(f"uid {uid} is unknown ({known})")

    @property
    def batch_cache(self) -> list[Any] | None:
        """The running batch's per-layer mlx-lm caches (``None`` when no row runs), for
        inspection and oracles; do not mutate. Row ``b`` is running row ``b``: while
        evicted rows' slots wait for a joiner (:attr:`Snapshot.free_slots`) this is a lazy
        view that leaves them out, as mlx-lm's ``filter`` would."""
        if not self._cache or not self._free:
            return self._cache
        return slots.view_rows(self._cache, self._live_slots())

    def request_of(self, uid: int) -> ValidRequest:
        """The validated request (prompt ids, stop ids) behind ``uid``.

        Raises: KeyError for an unknown uid."""
        self._row_of(uid)
        return self._requests[uid]

    def finished_greedy_uids(self) -> list[int]:
        """Uids that finished by ``stop`` or ``length`` (evicted or not) and were decoded
        greedily, in uid order: the rows an oracle can check."""
        rows = list(self._done.values()) + [r for r in self._rows if r.finish_reason]
        return sorted(r.uid for r in rows if r.valid.request.greedy and r.finish_reason in ("stop", "length"))

    def tokens(self, uid: int) -> list[int]:
        """Generated token ids of ``uid`` so far (a final stop token included).

        Raises: KeyError for an unknown uid."""
        return list(self._row_of(uid).tokens)

    def logprobs(self, uid: int) -> list[float]:
        """Log-probability (natural log, float32) of each generated token of ``uid``."""
        return list(self._row_of(uid).logprobs)

    def finish_reason(self, uid: int) -> str | None:
        """``stop``, ``length``, ``error``, ``abort``, or ``None`` while queued or running."""
        return self._row_of(uid).finish_reason

    def error(self, uid: int) -> str:
        """The message of a row that finished with ``error`` (else ``""``)."""
        return self._row_of(uid).message

    def text(self, uid: int) -> str:
        """Visible completion of ``uid``: its tokens decoded, a final stop token excluded."""
        row = self._row_of(uid)
        toks = row.tokens[:-1] if row.finish_reason == "stop" else row.tokens
        return self.tokenizer.decode(toks)

    def snapshot(self) -> Snapshot:
        """Frozen numpy view of the batch as the next ``step()`` will see it. Pure: it
        changes nothing (the engine records :attr:`history` itself). Waits for an
        in-flight forward when the batch's arrays are still being computed."""
        return self._capture()()

    def _capture(self) -> Callable[[], Snapshot]:
        """Everything a snapshot shows, captured now without evaluating MLX arrays; the
        returned function converts to numpy (see :func:`workbench.engine.caches.attention_geometry`)."""
        B = len(self._rows)
        groups = []
        cache = self.batch_cache  # free slots left out
        shown = kv.layer_groups(cache) if cache else {}
        allocated = shown if cache is self._cache else kv.layer_groups(self._cache)  # free slots counted
        for name, layers in shown.items():
            first = layers[0][1]
            nbytes = sum(int(c.nbytes) for _, c in allocated[name])
            labels = tuple(label for label, _ in layers)
            if name == "ssm":
                geo = kv.ssm_geometry(first, B)
            elif hasattr(first, "left_padding") and hasattr(first, "offset"):
                geo = kv.attention_geometry(first)
            else:
                geo = lambda: {"mask": np.ones((B, 1), bool)}  # noqa: E731
            groups.append((name, labels, nbytes, geo))
        fields = dict(
            step=self.step_index,
            uids=tuple(r.uid for r in self._rows),
            finished=tuple(r.finish_reason is not None for r in self._rows),
            generated_tokens=tuple(len(r.tokens) for r in self._rows),
            context_tokens=tuple(len(r.valid.prompt_ids) + r.fed for r in self._rows),
            kv_bytes=kv.kv_bytes(self._cache),
            kv_budget_bytes=self.kv_budget_bytes,
            kv_projected_bytes=self.kv_projected_bytes,
            queue=tuple(self._queue),
            prefilling=tuple((uid, done, total) for uid, done, total in self._prefill_progress()),
            free_slots=len(self._free),
        )

        def build() -> Snapshot:
            built = []
            for name, labels, nbytes, geo in groups:
                values = {k: (frozen(v) if isinstance(v, (list, np.ndarray)) else v) for k, v in geo().items()}
                built.append(LayerGroup(name=name, layers=labels, kv_bytes=nbytes, **values))
            attn = next((g for g in built if g.name == "full"), None) or next(
                (g for g in built if g.window_tokens is not None), None)
            return Snapshot(
                left_padding=attn.left_padding if attn else frozen(np.zeros(B, np.int64)),
                offset=attn.offset if attn else frozen(np.zeros(B, np.int64)),
                kv_width_tokens=attn.kv_width_tokens if attn else 0,
                capacity_tokens=attn.capacity_tokens if attn else 0,
                groups=tuple(built), **fields)

        return build

    def _prefill_progress(self) -> list[tuple[int, int, int]]:
        """``(uid, prefilled tokens, tokens to prefill)`` for the prefilling group."""
        if self._group is None:
            return []
        g = self._group.prefill
        return [(uid, done, total) for (uid, _), done, total in zip(self._group.members, g.rows_done_tokens, g.lengths)]

    def _record(self) -> None:
        """Append a snapshot to :attr:`history` after an engine call that changed the batch:
        captured now, converted to numpy when first read (so recording never waits for
        the forward the call launched)."""
        if self.history.maxlen:
            self.history.append(self._capture())
            self._recorded_at = len(self.events)

    def record(self) -> Snapshot:
        """The current snapshot, appended to :attr:`history` unless nothing happened (no
        event) since the last one there — for views that show the engine after calls that
        do not change the batch (e.g. ``submit``)."""
        if not self.history.maxlen:
            return self.snapshot()
        if not self.history or getattr(self, "_recorded_at", -1) != len(self.events):
            self._record()
        return self.history[-1]

    def report(self) -> Report:
        """The :class:`Report` of everything so far (events and per-request metrics)."""
        return build_report(self.events, lambda toks, uid: self.text(uid))


class History(deque):
    """A ring buffer (``collections.deque`` with ``maxlen``) of :class:`Snapshot` s whose
    entries may be stored as capture functions: each is converted to its
    :class:`Snapshot` the first time it is read (index, iteration), then kept."""

    def __getitem__(self, i):
        item = super().__getitem__(i)
        if not isinstance(item, Snapshot):
            item = item()
            super().__setitem__(i, item)
        return item

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __reversed__(self):
        return (self[i] for i in range(len(self) - 1, -1, -1))

