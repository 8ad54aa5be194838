"""The step-at-a-time continuous-batching scheduler.

Knows: the queue, the running rows, admission (FCFS up to ``max_batch``), the event log.
Uses: :mod:`workbench.caches` for mlx-lm's batch caches, :mod:`workbench.prefill`,
:mod:`workbench.sampling`. Must not know: views, Jupyter.

Life of a request (mlx-lm's names in brackets, vLLM's in braces)::

    submit ─▶ queue ─admit()─▶ running rows ─step()─▶ tokens ─filter()─▶ evicted
                     [insert]   {add_request}  [next]  {schedule}  [remove] {update_from_output}

- ``admit()`` takes queued requests FCFS while fewer than ``max_batch`` rows are in the
  batch (finished rows count until ``filter()`` evicts them), prefills all but the last
  prompt token of the joiners as one right-padded group, and joins them to the running
  batch with the caches' ``extend``. **A joiner's first token is sampled by the next
  ``step()``**, which feeds its last prompt token together with every other row (as
  mlx-lm's ``BatchGenerator`` does). TTFT is therefore measured from ``submit`` to the
  ``token`` event of that step, prefill and queueing included.
- ``step()`` runs one forward of shape ``[B, 1]`` for every row, samples one token per
  row and checks stop ids and ``max_tokens``. Rows that finished earlier but were not
  yet evicted are fed too (their cache grows) but their outputs are discarded.
- ``filter()`` evicts finished rows with the caches' ``filter`` (which trims the left
  padding all remaining rows share).

Axis letters: ``B`` rows, ``V`` vocabulary.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import mlx.core as mx
import numpy as np

from . import caches as kv
from .events import Event
from .prefill import prefill
from .report import Report, build_report
from .request import Request, ValidRequest, validate
from .sampling import Sampler, sample_rows, sampler_for
from .snapshot import LayerGroup, Snapshot, frozen


@dataclass
class _Row:
    uid: int
    valid: ValidRequest
    sampler: Sampler | None
    next_input: int
    tokens: list[int] = field(default_factory=list)
    fed: int = 0
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


def vocab_size(model: Any, tokenizer: Any) -> int:
    """Rows of the model's output (``model.args.vocab_size``, mlx-lm's config field),
    else the tokenizer's vocabulary size."""
    size = getattr(getattr(model, "args", None), "vocab_size", None)
    return int(size if size is not None else len(tokenizer.get_vocab()))


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class Scheduler:
    """A continuous-batching engine over an mlx-lm model, driven one call at a time.

    Args:
        model: an mlx-lm model (``mlx_lm.load``); every layer's cache must batch.
        tokenizer: its mlx-lm ``TokenizerWrapper``.
        max_batch: most rows in the running batch, ``>= 1``.
        prefill_step_size: prefill chunk length in tokens, ``>= 1`` (mlx-lm's
            ``--prefill-step-size``).
        clock: ``() -> seconds``; inject a fake clock for deterministic metrics.
        max_kv_size: bound every layer's KV cache to this many tokens (a rotating
            cache, mlx-lm's ``--max-kv-size``); only for models without ``make_cache``.
            Note mlx-lm's batch rotating cache keeps no "sink" tokens (its solo
            ``RotatingKVCache`` keeps 4), so the solo oracle uses ``keep=0``.
        history_size: how many snapshots :attr:`history` keeps (a ring buffer); one is
            taken after every ``admit``/``step``/``filter`` that changed the batch. ``0``
            turns recording off (no snapshot cost per step).

    Raises:
        ValueError: for a limit below 1, ``max_kv_size`` on a model with its own
            ``make_cache``, or a model with a cache type that cannot batch (naming the
            layer and type).
    """

    def __init__(self, model: Any, tokenizer: Any, max_batch: int = 4, prefill_step_size: int = 2048,
                 clock: Callable[[], float] = time.perf_counter, max_kv_size: int | None = None,
                 history_size: int = 64):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = _positive_int("max_batch", max_batch)
        self.prefill_step_size = _positive_int("prefill_step_size", prefill_step_size)
        self.clock = clock
        self.max_kv_size = None if max_kv_size is None else _positive_int("max_kv_size", max_kv_size)
        kv.check_batchable(model, self.max_kv_size)
        if not isinstance(history_size, int) or isinstance(history_size, bool) or history_size < 0:
            raise ValueError(f"history_size must be an int >= 0, got {history_size!r}")
        self.history: deque[Snapshot] = deque(maxlen=history_size)
        self.vocab_size = vocab_size(model, tokenizer)
        self.context_tokens = getattr(getattr(model, "args", None), "max_position_embeddings", None)
        self.events: list[Event] = []
        self.step_index = 0
        self._next_uid = 0
        self._queue: deque[tuple[int, ValidRequest]] = deque()
        self._rows: list[_Row] = []
        self._done: dict[int, _Row] = {}
        self._cache: list[Any] | None = None
        self._requests: dict[int, ValidRequest] = {}

    # -- requests ---------------------------------------------------------------------
    def submit(self, request: Request | dict) -> int:
        """Validate ``request`` and queue it. Returns its uid (an int, unique per scheduler).

        Raises:
            ValueError: naming the bad field and its allowed range; nothing changes.
        """
        if isinstance(request, dict):
            request = Request.from_dict(request)
        valid = validate(request, self.tokenizer, self.vocab_size, self.context_tokens)
        uid = self._next_uid
        self._next_uid += 1
        self._queue.append((uid, valid))
        self._requests[uid] = valid
        self._log("submit", uid, n_tokens=len(valid.prompt_ids))
        return uid

    # -- the three engine calls -------------------------------------------------------
    def admit(self) -> list[Event]:
        """Admit queued requests FCFS up to ``max_batch`` rows. Returns the admit events.

        Each admitted request leaves the queue (``admit`` event), is prefilled with the
        other joiners (``prefill`` events, one per chunk per row) and joins the batch
        (``join`` event). Joiners are prefilled (all but the last prompt token) as one group in chunks of
        ``prefill_step_size``, then joined with ``extend``; their first token comes from
        the next ``step()``.
        """
        n = min(self.max_batch - len(self._rows), len(self._queue))
        if n <= 0:
            return []
        joiners = [self._queue.popleft() for _ in range(n)]
        first_row = len(self._rows)
        admitted = [self._log("admit", uid, row=first_row + i, n_tokens=len(v.prompt_ids))
                    for i, (uid, v) in enumerate(joiners)]
        group = kv.new_batch_cache(self.model, n, self.max_kv_size)
        uids = [uid for uid, _ in joiners]

        def on_chunk(real_tokens: list[int]) -> None:
            for uid, k in zip(uids, real_tokens):
                if k:
                    self._log("prefill", uid, n_tokens=k)

        prefill(self.model, group, [v.prompt_ids[:-1] for _, v in joiners], self.prefill_step_size, on_chunk)
        self._cache = kv.join(self._cache, group)
        for i, (uid, v) in enumerate(joiners):
            self._rows.append(_Row(uid, v, sampler_for(v.request), next_input=v.prompt_ids[-1]))
            self._log("join", uid, row=first_row + i)
        self._record()
        return admitted

    def step(self) -> list[Event]:
        """One decode step: forward ``[B, 1]``, one token per unfinished row.

        Returns the token events, then any finish events. With no rows it is a no-op
        that returns ``[]`` and does not advance ``step_index``.
        """
        if not self._rows:
            return []
        inputs = mx.array([r.next_input for r in self._rows], dtype=mx.uint32)[:, None]  # [B, 1]
        logits = self.model(inputs, cache=self._cache)[:, -1, :]  # [B, V]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sampled = sample_rows(logprobs, [r.sampler for r in self._rows])  # [B]
        chosen = mx.take_along_axis(logprobs, sampled[:, None].astype(mx.int32), axis=-1)[:, 0]
        mx.eval(sampled, chosen)
        toks, lps = sampled.tolist(), chosen.astype(mx.float32).tolist()
        out, finished = [], []
        for b, row in enumerate(self._rows):
            row.fed += 1
            if row.finish_reason is not None:
                continue
            row.tokens.append(toks[b])
            row.logprobs.append(lps[b])
            row.next_input = toks[b]
            out.append(self._log("token", row.uid, row=b, token=toks[b], logprob=lps[b]))
            if toks[b] in row.valid.stop_ids:
                row.finish_reason = "stop"
            elif len(row.tokens) >= row.valid.request.max_tokens:
                row.finish_reason = "length"
            if row.finish_reason:
                finished.append(self._log("finish", row.uid, row=b, finish_reason=row.finish_reason))
        self.step_index += 1
        self._record()
        return out + finished

    def filter(self) -> list[Event]:
        """Evict finished rows (cache ``filter``). Returns the evict events (old rows)."""
        gone = [b for b, r in enumerate(self._rows) if r.finish_reason is not None]
        if not gone:
            return []
        keep = [b for b, r in enumerate(self._rows) if r.finish_reason is None]
        self._cache = kv.evict(self._cache, keep)
        events = []
        for b in gone:
            self._done[self._rows[b].uid] = self._rows[b]
            events.append(self._log("evict", self._rows[b].uid, row=b))
        self._rows = [self._rows[b] for b in keep]
        self._record()
        return events

    def run(self, arrivals: Iterable[tuple[int, Request]] = (), max_steps: int | None = None) -> Report:
        """Drive ``admit(); step(); filter()`` until idle and return the :class:`Report`.

        Args:
            arrivals: ``(step, request)`` pairs submitted once ``step_index`` reaches
                ``step`` (or at once when the engine would otherwise be idle).
            max_steps: stop after this many decode steps (``None``: until idle).
        """
        pending = deque(sorted(arrivals, key=lambda a: a[0]))
        start = self.step_index
        while max_steps is None or self.step_index - start < max_steps:
            while pending and (pending[0][0] <= self.step_index or self.idle):
                self.submit(pending.popleft()[1])
            if self.idle:
                break
            self.admit()
            self.step()
            self.filter()
        return self.report()

    # -- inspection -------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        """True when nothing is queued and no row is in the batch."""
        return not self._queue and not self._rows

    def _row_of(self, uid: int) -> _Row:
        for r in self._rows:
            if r.uid == uid:
                return r
        if uid in self._done:
            return self._done[uid]
        if any(u == uid for u, _ in self._queue):
            return _Row(uid, None, None, -1)  # type: ignore[arg-type]
        known = f"submitted uids are 0..{self._next_uid - 1}" if self._next_uid else "nothing was submitted yet"
        raise KeyError(f"uid {uid} is unknown ({known})")

    @property
    def batch_cache(self) -> list[Any] | None:
        """The running batch's per-layer mlx-lm caches (``None`` when no row runs), for
        inspection and oracles; do not mutate."""
        return self._cache

    def request_of(self, uid: int) -> ValidRequest:
        """The validated request (prompt ids, stop ids) behind ``uid``.

        Raises: KeyError for an unknown uid."""
        self._row_of(uid)
        return self._requests[uid]

    def finished_greedy_uids(self) -> list[int]:
        """Uids that finished (evicted or not) and were decoded greedily, in uid order."""
        rows = list(self._done.values()) + [r for r in self._rows if r.finish_reason]
        return sorted(r.uid for r in rows if r.valid.request.greedy)

    def tokens(self, uid: int) -> list[int]:
        """Generated token ids of ``uid`` so far (a final stop token included).

        Raises: KeyError for an unknown uid."""
        return list(self._row_of(uid).tokens)

    def logprobs(self, uid: int) -> list[float]:
        """Log-probability (natural log, float32) of each generated token of ``uid``."""
        return list(self._row_of(uid).logprobs)

    def finish_reason(self, uid: int) -> str | None:
        """``stop``, ``length``, or ``None`` while queued or running."""
        return self._row_of(uid).finish_reason

    def text(self, uid: int) -> str:
        """Visible completion of ``uid``: its tokens decoded, a final stop token excluded."""
        row = self._row_of(uid)
        toks = row.tokens[:-1] if row.finish_reason == "stop" else row.tokens
        return self.tokenizer.decode(toks)

    def snapshot(self) -> Snapshot:
        """Frozen numpy view of the batch as the next ``step()`` will see it. Pure: it
        changes nothing (the engine records :attr:`history` itself)."""
        B = len(self._rows)
        groups = []
        for name, layers in (kv.layer_groups(self._cache) if self._cache else {}).items():
            first = layers[0][1]
            nbytes = sum(int(c.nbytes) for _, c in layers)
            labels = tuple(label for label, _ in layers)
            if name == "ssm":
                geo = kv.ssm_geometry(first, B)
            elif hasattr(first, "left_padding") and hasattr(first, "offset"):
                geo = kv.attention_geometry(first)
            else:
                geo = {"mask": np.ones((B, 1), bool)}
            geo = {k: (frozen(v) if isinstance(v, (list, np.ndarray)) else v) for k, v in geo.items()}
            groups.append(LayerGroup(name=name, layers=labels, kv_bytes=nbytes, **geo))
        attn = next((g for g in groups if g.name == "full"), None) or next(
            (g for g in groups if g.window_tokens is not None), None)
        snap = Snapshot(
            step=self.step_index,
            uids=tuple(r.uid for r in self._rows),
            finished=tuple(r.finish_reason is not None for r in self._rows),
            generated_tokens=tuple(len(r.tokens) for r in self._rows),
            context_tokens=tuple(len(r.valid.prompt_ids) - 1 + r.fed for r in self._rows),
            left_padding=attn.left_padding if attn else frozen(np.zeros(B, np.int64)),
            offset=attn.offset if attn else frozen(np.zeros(B, np.int64)),
            kv_width_tokens=attn.kv_width_tokens if attn else 0,
            capacity_tokens=attn.capacity_tokens if attn else 0,
            kv_bytes=kv.kv_bytes(self._cache),
            groups=tuple(groups),
            queue=tuple(uid for uid, _ in self._queue),
        )
        return snap

    def _record(self) -> None:
        """Append a snapshot to :attr:`history` after an engine call that changed the batch."""
        if self.history.maxlen:
            self.history.append(self.snapshot())

    def report(self) -> Report:
        """The :class:`Report` of everything so far (events and per-request metrics)."""
        return build_report(self.events, lambda toks, uid: self.text(uid))

    def _log(self, kind: str, uid: int, **fields: Any) -> Event:
        event = Event(kind=kind, uid=uid, step=self.step_index, time_s=self.clock(), **fields)
        self.events.append(event)
        return event
