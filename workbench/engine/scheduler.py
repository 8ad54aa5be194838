"""The step-at-a-time continuous-batching scheduler.

Knows: the queue, the joining (prefilling) group, the running rows, the admission
policy, the event log. Uses: :mod:`workbench.engine.caches` for mlx-lm's batch caches,
:mod:`workbench.engine.prefill`, :mod:`workbench.engine.decode`. Must not know: views, Jupyter.

Life of a request (mlx-lm's names in brackets, vLLM's in braces)::

    submit ─▶ queue ─admit()─▶ prefilling group ─admit()…─▶ running rows ─step()─▶ tokens ─filter()─▶ evicted
             [insert] {add_request}     (chunked prefill)        [next] {schedule}       [remove] {update_from_output}

- ``admit()`` forms a prefilling group from the queue (the policy's order, FCFS by
  default, while rows + group stay within ``max_batch`` and the group within
  ``prompt_concurrency``), runs prefill chunks of ``prefill_step_size`` tokens (one chunk
  per call when ``interleave_prefill``, so running rows stall at most one chunk between
  their tokens; the whole prompt otherwise), and when the group's prompts are in its
  cache it *joins*: one ``[n, 1]`` forward feeds each joiner's last prompt token
  (computing its first token's distribution, as mlx-lm's ``GenerationBatch`` does),
  then each joiner is written into a *free slot* (the cache row of a request evicted
  since the last step, :mod:`workbench.engine.slots`) or, when none is free, the caches'
  ``extend`` appends it to the running batch.
- ``step()`` reads one token per running row (the distribution computed by the
  previous forward) and feeds it: one ``[B, 1]`` forward. With ``pipeline`` that
  forward is launched (``mx.async_eval``) *before* the tokens are read, so the model
  computes while Python does the bookkeeping, as in mlx-lm's ``GenerationBatch._step``.
  A joiner's first token is therefore computed in ``admit()`` and **read, and timed,
  in the next ``step()``**: TTFT runs from ``submit`` to that ``token`` event, queueing
  and prefill included. Stop ids and ``max_tokens`` are checked on read; rows finished
  earlier but not yet evicted are fed too, their outputs discarded.
- ``filter()`` evicts finished rows. With ``reuse_slots`` their cache rows stay as free
  slots for the next join (one row written instead of the whole batch copied twice, by
  mlx-lm's ``filter`` then ``extend``); free slots that the next ``admit()`` does not
  fill (or the next ``step()``, when called without ``admit()``) are dropped with the
  caches' ``filter`` (which trims the left padding all remaining rows share), so no
  forward ever runs over a free slot.

Invariant between calls: every running row's latest token is in the cache, and the
distribution of its next token is pending. So a snapshot's masks are those of the next
forward, the one the next ``step()`` launches.

Axis letters: ``B`` rows, ``V`` vocabulary.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import mlx.core as mx
import numpy as np

from . import caches as kv
from . import slots
from .budget import kv_profile, projected_bytes
from .decode import Pending, launch
from ..observe.events import Event
from .inspection import History, Inspection
from .inspection import Row as _Row
from .policies import Policy, Queued, policy_from
from .prefill import PrefillGroup
from .promptcache import PromptCache
from ..observe.report import Report
from .request import Request, ValidRequest, validate
from .sampling import RowSampler
from ..observe.snapshot import Snapshot


@dataclass
class _Group:
    """A prefilling group: its requests, the prefill in progress, each row's last input
    token (fed at the join)."""

    members: list[tuple[int, ValidRequest]]
    prefill: PrefillGroup
    last_tokens: list[int]
    lengths: list[int]  # tokens in each row's cache once joined (its whole input)


def vocab_size(model: Any, tokenizer: Any) -> int:
    """Rows of the model's output (``model.args.vocab_size``, mlx-lm's config field),
    else the tokenizer's vocabulary size."""
    size = getattr(getattr(model, "args", None), "vocab_size", None)
    return int(size if size is not None else len(tokenizer.get_vocab()))


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class Scheduler(Inspection):
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
        reuse_slots: keep evicted rows' cache rows as free slots for the next join
            (``True``), or compact at once with mlx-lm's ``filter`` and join with
            ``extend`` like mlx-lm's ``BatchGenerator`` (``False``). Tokens are the same.

    Raises:
        ValueError: for a limit below 1, ``max_kv_size`` on a model with its own
            ``make_cache``, or a model with a cache type that cannot batch (naming the
            layer and type).
    """

    def __init__(self, model: Any, tokenizer: Any, max_batch: int = 4, prefill_step_size: int = 2048,
                 clock: Callable[[], float] = time.perf_counter, max_kv_size: int | None = None,
                 history_size: int = 64, prompt_concurrency: int | None = None,
                 interleave_prefill: bool = True, pipeline: bool = True,
                 policy: str | Policy = "fcfs", clear_cache_every: int = 256, seed: int = 0,
                 kv_budget_bytes: int | None = None, prompt_cache: Any = None, reuse_slots: bool = True):
        self._config = {k: v for k, v in locals().items() if k not in ("self", "model", "tokenizer")}
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = _positive_int("max_batch", max_batch)
        self.prefill_step_size = _positive_int("prefill_step_size", prefill_step_size)
        self.prompt_concurrency = self.max_batch if prompt_concurrency is None else _positive_int(
            "prompt_concurrency", prompt_concurrency)
        self.interleave_prefill = bool(interleave_prefill)
        self.pipeline = bool(pipeline)
        self.policy = policy_from(policy)
        self.clear_cache_every = _positive_int("clear_cache_every", clear_cache_every)
        self.clock = clock
        self.max_kv_size = None if max_kv_size is None else _positive_int("max_kv_size", max_kv_size)
        kv.check_batchable(model, self.max_kv_size)
        if not isinstance(history_size, int) or isinstance(history_size, bool) or history_size < 0:
            raise ValueError(f"history_size must be an int >= 0, got {history_size!r}")
        self.history: History = History(maxlen=history_size)
        self.vocab_size = vocab_size(model, tokenizer)
        self.context_tokens = getattr(getattr(model, "args", None), "max_position_embeddings", None)
        self.events: list[Event] = []
        self.step_index = 0
        self._next_uid = 0
        self._queue: dict[int, ValidRequest] = {}  # insertion order = arrival order
        self._group: _Group | None = None
        self._rows: list[_Row] = []
        self._pending: Pending | None = None
        self._done: dict[int, _Row] = {}
        self._cache: list[Any] | None = None
        self.reuse_slots = bool(reuse_slots)
        self._free: list[int] = []  # cache rows of evicted requests, kept for the next joiner
        self._joins = 0
        self._requests: dict[int, ValidRequest] = {}
        self._seeds: dict[int, int] = {}
        self._aborted: set[int] = set()
        self._preempted: dict[int, _Row] = {}
        self.kv_budget_bytes = None if kv_budget_bytes is None else _positive_int("kv_budget_bytes", kv_budget_bytes)
        self._kv_profile = kv_profile(model, self.max_kv_size)
        self._projected: dict[int, int] = {}
        self.prompt_cache = None if prompt_cache is None else PromptCache(model, prompt_cache, self.max_kv_size)
        self._cached_tokens: dict[int, int] = {}
        self._rng = np.random.default_rng(seed)

    # -- requests ---------------------------------------------------------------------
    def submit(self, request: Request | dict) -> int:
        """Validate ``request`` and queue it. Returns its uid (an int, unique per scheduler).

        Raises:
            ValueError: naming the bad field and its allowed range; nothing changes.
        """
        if isinstance(request, dict):
            request = Request.from_dict(request)
        valid = validate(request, self.tokenizer, self.vocab_size, self.context_tokens)
        need = projected_bytes(self._kv_profile, len(valid.prompt_ids) + valid.request.max_tokens)
        if self.kv_budget_bytes is not None and need > self.kv_budget_bytes:
            raise ValueError(
                f"request projects {need:,} KV bytes (prompt {len(valid.prompt_ids)} + max_tokens "
                f"{valid.request.max_tokens} tokens) but kv_budget_bytes is {self.kv_budget_bytes:,}; "
                "it could never be admitted")
        uid = self._next_uid
        self._next_uid += 1
        self._queue[uid] = valid
        self._requests[uid] = valid
        self._projected[uid] = need
        drawn = int(self._rng.integers(2**31))  # drawn for every request: seeds do not depend on others' fields
        self._seeds[uid] = valid.request.seed if valid.request.seed is not None else drawn
        self._log("submit", uid, n_tokens=len(valid.prompt_ids))
        return uid

    # -- the three engine calls -------------------------------------------------------
    def admit(self) -> list[Event]:
        """Admission and prefill. Returns the events of this call (``admit``, ``prefill``,
        ``join``).

        Forms a prefilling group from the queue when none is in progress (the policy's
        order; rows + group within ``max_batch``, group within ``prompt_concurrency``),
        runs its prefill chunks (at most one per call with ``interleave_prefill``), and
        joins it to the running batch once its prompts are cached. After a join it forms
        and starts the next group in the same call if the chunk budget allows.
        """
        start = len(self.events)
        chunks = 0
        while True:
            if self._group is None and not self._form_group():
                break
            group = self._group
            if not group.prefill.done:
                if self.interleave_prefill and chunks >= 1:
                    break
                real = group.prefill.run_chunk()
                chunks += 1
                for (uid, _), k in zip(group.members, real):
                    if k:
                        self._log("prefill", uid, n_tokens=k)
                continue
            self._join(group)
        dropped = self._compact()  # free slots no joiner took
        if len(self.events) > start or dropped:
            self._record()
        return self.events[start:]

    @property
    def kv_projected_bytes(self) -> int:
        """Projected KV bytes of the running and prefilling requests (the budget's use)."""
        live = [r.uid for r in self._rows if r.finish_reason is None]
        live += [uid for uid, _ in self._group.members] if self._group else []
        return sum(self._projected[u] for u in live)

    def _form_group(self) -> bool:
        slots = min(self.max_batch - len(self._rows), self.prompt_concurrency)
        if slots <= 0 or not self._queue:
            return False
        queued = [Queued(uid, len(v.prompt_ids), v.request.priority, i)
                  for i, (uid, v) in enumerate(self._queue.items())]
        chosen, used = [], self.kv_projected_bytes
        for uid in self.policy.order(queued)[:slots]:
            if self.kv_budget_bytes is not None and used + self._projected[uid] > self.kv_budget_bytes:
                if not chosen and self._preempt_for(uid):
                    used = self.kv_projected_bytes
                    if used + self._projected[uid] <= self.kv_budget_bytes:
                        chosen.append(uid)
                        used += self._projected[uid]
                        continue
                break  # keep the policy's order: nobody jumps a request that does not fit
            chosen.append(uid)
            used += self._projected[uid]
        if not chosen:
            return False
        members = [(uid, self._queue.pop(uid)) for uid in chosen]
        inputs = [list(v.prompt_ids) + (self._preempted[uid].tokens if uid in self._preempted else [])
                  for uid, v in members]
        caches = None
        if self.prompt_cache is not None:
            fetched = [self.prompt_cache.fetch(inp[:-1]) for inp in inputs]
            caches = [c for c, _ in fetched]
            tails = [rest for _, rest in fetched]
            for (uid, _), inp, rest in zip(members, inputs, tails):
                self._cached_tokens[uid] = len(inp) - 1 - len(rest)
        else:
            tails = [inp[:-1] for inp in inputs]
        for (uid, v), inp in zip(members, inputs):
            self._log("admit", uid, n_tokens=len(inp), n_cached=self._cached_tokens.get(uid, 0))
        group = PrefillGroup(self.model, tails, self.prefill_step_size, self.max_kv_size, caches)
        self._group = _Group(members, group, [inp[-1] for inp in inputs], [len(inp) for inp in inputs])
        return True

    def _preempt_for(self, uid: int) -> bool:
        """Preempt running rows of lower priority than ``uid`` (lowest first, the latest
        joined among equals) until ``uid`` fits the KV budget. Returns True if any was."""
        want = self._requests[uid].request.priority
        preempted = False
        while self.kv_projected_bytes + self._projected[uid] > self.kv_budget_bytes:
            victims = [r for r in self._rows if r.finish_reason is None and r.valid.request.priority < want]
            if not victims:
                break
            victim = min(victims, key=lambda r: (r.valid.request.priority, -r.joined))
            self.preempt(victim.uid)
            preempted = True
        return preempted

    def preempt(self, uid: int) -> list[Event]:
        """Preempt running row ``uid``: drop its cache row now and re-queue it (original
        arrival order) to resume from its prompt plus the tokens generated so far; its
        greedy output equals an uninterrupted run. Returns the ``preempt`` event.

        Raises:
            KeyError: unknown uid. ValueError: ``uid`` is not a running, unfinished row.
        """
        row = self._row_of(uid)
        b = next((i for i, r in enumerate(self._rows) if r is row), None)
        if b is None or row.finish_reason is not None:
            raise ValueError(f"uid {uid} is not a running, unfinished row; only those can be preempted")
        self._drop([i for i in range(len(self._rows)) if i != b])
        self._preempted[uid] = row
        order = list(self._queue.items()) + [(uid, row.valid)]
        self._queue = dict(sorted(order, key=lambda item: item[0]))  # uids grow with arrival
        event = self._log("preempt", uid, row=b, n_tokens=len(row.tokens))
        self._record()
        return [event]

    def _join(self, group: _Group) -> None:
        rows = []
        for uid, v in group.members:
            row = self._preempted.pop(uid, None) or _Row(uid, v, RowSampler(v.request, self._seeds[uid], self.vocab_size))
            row.fed = len(row.tokens)  # a resumed row's generated tokens are in its cache again
            row.joined, self._joins = self._joins, self._joins + 1
            if uid in self._aborted:  # aborted while prefilling: joins finished, evicted at filter
                row.finish_reason = "abort"
            rows.append(row)
        last = mx.array(group.last_tokens, dtype=mx.uint32)
        contexts = [self._context(r, None, b) for b, r in enumerate(rows)]
        pending = launch(self.model, group.prefill.caches, last, [r.sampler for r in rows], contexts,
                         [len(r.tokens) for r in rows], self.pipeline)
        order = self._place(group.prefill.caches, group.lengths)
        n_live = len(self._rows)
        self._pending = Pending.concat(self._pending, pending).take(
            [i if src == "live" else n_live + i for src, i in order])
        self._rows = [self._rows[i] if src == "live" else rows[i] for src, i in order]
        self._group = None
        rows_of = {i: b for b, (src, i) in enumerate(order) if src in ("free slot", "extend")}
        for i, (uid, v) in enumerate(group.members):
            self._log("join", uid, row=rows_of[i], n_tokens=len(v.prompt_ids), message=order[rows_of[i]][0])

    def _place(self, joiners: list[Any], lengths: list[int]) -> list[tuple[str, int]]:
        """Put the joiners' cache rows into the batch cache: into free slots where they
        fit (:func:`workbench.engine.slots.fill_slots`), the rest by ``extend`` (after the free
        slots left, which the next group of this ``admit()`` may still fill). Returns the
        new row order as ``("live", running row)`` / ``("free slot" or "extend", joiner
        index)`` pairs."""
        live = self._live_slots()
        n_slots = len(live) + len(self._free)
        by_slot: dict[int, tuple[str, int]] = {p: ("live", b) for b, p in enumerate(live)}
        width = slots.fill_width(self._cache) if self._free else 0
        fit = [i for i, n in enumerate(lengths) if n <= width][: len(self._free)]
        if fit and slots.can_fill(self._cache, joiners, [lengths[i] for i in fit]):
            used = self._free[: len(fit)]
            slots.fill_slots(self._cache, used, joiners, fit, [lengths[i] for i in fit])
            by_slot.update({p: ("free slot", i) for p, i in zip(used, fit)})
            held = [len(r.valid.prompt_ids) + r.fed for r in self._rows] + [lengths[i] for i in fit]
            slots.trim_shared_padding(self._cache, max(held))
            self._free = self._free[len(fit):]
        else:
            fit = []
        rest = [i for i in range(len(lengths)) if i not in fit]
        if rest:
            self._cache = kv.join(self._cache, joiners if not fit else kv.evict(joiners, rest))
            by_slot.update({n_slots + k: ("extend", i) for k, i in enumerate(rest)})
        return [by_slot[p] for p in sorted(by_slot)]

    def _live_slots(self) -> list[int]:
        """Cache row of each running row (row order): the rows that are not free slots."""
        free = set(self._free)
        return [p for p in range(len(self._rows) + len(free)) if p not in free]

    def _drop(self, keep: list[int]) -> None:
        """Remove running rows not in ``keep`` (sorted row indices) and their pending
        tokens; their cache rows become free slots (``reuse_slots``) or are filtered out."""
        live = self._live_slots()
        if not keep:
            self._cache, self._free = None, []
        elif self.reuse_slots:
            self._free = sorted(set(self._free) | {p for b, p in enumerate(live) if b not in keep})
        else:
            self._cache = kv.evict(self._cache, [live[b] for b in keep])
            self._free = []
        self._pending = self._pending.take(keep) if keep else None
        self._rows = [self._rows[b] for b in keep]

    def _compact(self) -> bool:
        """Drop free slots from the batch cache (mlx-lm's ``filter``) before a forward.
        Returns True if there were any."""
        if not self._free:
            return False
        self._cache = kv.evict(self._cache, self._live_slots())
        self._free = []
        return True

    def step(self) -> list[Event]:
        """One decode step: read one token per unfinished row, feed it (``[B, 1]``).

        Returns the token events, then any finish events. With no running rows it is a
        no-op that returns ``[]`` and does not advance ``step_index``.
        """
        if not self._rows:
            return []
        self._compact()
        current = self._pending
        samplers = [r.sampler for r in self._rows]
        contexts = [self._context(r, current, b) for b, r in enumerate(self._rows)]
        index = [len(r.tokens) + 1 for r in self._rows]
        if self.pipeline:  # launch step n+1 from step n's unread tokens, then read step n
            self._pending = launch(self.model, self._cache, current.tokens, samplers, contexts, index, True)
        toks, lps, finite = current.read()
        if not self.pipeline:
            self._pending = launch(self.model, self._cache, current.tokens, samplers, contexts, index, False)
        out, finished = [], []
        for b, row in enumerate(self._rows):
            row.fed += 1
            if row.finish_reason is not None:
                continue
            message = current.errors.get(b) or ("" if finite[b] else "non-finite logits (NaN or inf)")
            if not message:
                row.tokens.append(toks[b])
                row.logprobs.append(lps[b])
                out.append(self._log("token", row.uid, row=b, token=toks[b], logprob=lps[b]))
                message = self._call_on_token(row, toks[b])
            if message:
                row.finish_reason, row.message = "error", message
            elif toks[b] in row.valid.stop_ids:
                row.finish_reason = "stop"
            elif len(row.tokens) >= row.valid.request.max_tokens:
                row.finish_reason = "length"
            if row.finish_reason:
                finished.append(self._log("finish", row.uid, row=b, finish_reason=row.finish_reason,
                                          message=row.message))
        self.step_index += 1
        if self.step_index % self.clear_cache_every == 0:
            mx.clear_cache()
        self._record()
        return out + finished

    @staticmethod
    def _context(row: _Row, pending: Pending | None, b: int) -> Callable[[], mx.array]:
        """The row's own tokens ``[T]`` (prompt, read tokens, and the unread one in
        ``pending``) for its logits processors: built only when asked."""
        def build() -> mx.array:
            known = mx.array(list(row.valid.prompt_ids) + row.tokens, dtype=mx.uint32)
            return known if pending is None else mx.concatenate([known, pending.tokens[b : b + 1]])
        return build

    @staticmethod
    def _call_on_token(row: _Row, token: int) -> str:
        """Run the request's ``on_token`` callback; its exception becomes the row's error."""
        callback = row.valid.request.on_token
        if callback is None:
            return ""
        try:
            callback(row.uid, token)
        except Exception as exc:  # contained: only this row ends
            return f"on_token raised {type(exc).__name__}: {exc}"
        return ""

    def abort(self, uid: int) -> list[Event]:
        """End ``uid`` with finish reason ``abort``, wherever it is.

        A queued request leaves the queue; a prefilling one finishes and its row is
        dropped right after its group joins; a running row finishes and is evicted by the
        next ``filter()``. Aborting a finished uid is a documented no-op (returns ``[]``).

        Raises:
            KeyError: for a uid that was never submitted.
        """
        row = self._row_of(uid)
        if row.finish_reason is not None or uid in self._aborted:
            return []
        if uid in self._queue:
            del self._queue[uid]
            self._preempted.pop(uid, None)
            self._done[uid] = row
        elif any(r is row for r in self._rows):
            pass
        else:  # prefilling: dropped at join
            self._aborted.add(uid)
            return [self._log("finish", uid, finish_reason="abort")]
        row.finish_reason = "abort"
        return [self._log("finish", uid, finish_reason="abort")]

    def filter(self) -> list[Event]:
        """Evict finished rows (cache ``filter``). Returns the evict events (old rows)."""
        gone = [b for b, r in enumerate(self._rows) if r.finish_reason is not None]
        if not gone:
            return []
        keep = [b for b, r in enumerate(self._rows) if r.finish_reason is None]
        if self.prompt_cache is not None:
            live = self._live_slots()
            for b in gone:
                row = self._rows[b]
                if row.finish_reason in ("stop", "length"):
                    solo = [c.extract(live[b]) for c in self._cache]
                    mx.eval([c.state for c in solo])
                    self.prompt_cache.store(list(row.valid.prompt_ids) + row.tokens, solo, row.fed - len(row.tokens))
        events = []
        for b in gone:
            self._done[self._rows[b].uid] = self._rows[b]
            events.append(self._log("evict", self._rows[b].uid, row=b))
        self._drop(keep)
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

    @property
    def idle(self) -> bool:
        """True when nothing is queued, prefilling or in the batch."""
        return not self._queue and self._group is None and not self._rows

    def fresh(self) -> "Scheduler":
        """A new, empty scheduler with this one's model, tokenizer and configuration (a
        prompt cache object is shared; an int size makes a new one)."""
        return Scheduler(self.model, self.tokenizer, **self._config)

    def _log(self, kind: str, uid: int, **fields: Any) -> Event:
        event = Event(kind=kind, uid=uid, step=self.step_index, time_s=self.clock(), **fields)
        self.events.append(event)
        return event
