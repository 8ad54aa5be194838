"""The fields of a checkpoint file, checked one by one against the scheduler that loads it
(:func:`workbench.engine.checkpoint_io.read` gives it the parsed document and mlx-lm's
loaded caches; nothing in the file is trusted).

Each refusal is a ``ValueError`` naming the field, its value and the limit::

    checkpoint field batch.pending.tokens[2]: 50000 outside the vocabulary [0, 4096)
    checkpoint field caches[3].keys: shape (2, 4, 256, 32), this model and batch need 2x2x*x32
    checkpoint field requests[4].uid: uid 1 appears twice

Checked: token ids (prompts, generated, top-k, logit bias, pending) in ``[0, vocab_size)``;
uids unique and ``0 .. next_uid - 1``; statuses and finish reasons known and agreeing; counts
non-negative, within ``max_tokens`` and the counters; log-probs numbers ``<= 0`` (NaN kept);
times finite; every request in the place its status says (queue, batch row, or evicted);
every cache layer of this model's class with its arrays' shapes and dtypes (a one-token probe
on the scheduler's own fresh caches), ``B`` rows plus free slots, each row's offset equal to
its token count and, for full attention, left padding + offset = KV width; the seed
generator's state one numpy accepts; every event's fields of their types and its uid one of
the saved requests'.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, BatchRotatingKVCache, CacheList

from ..observe.events import Event
from .batch import Batch
from .forward import Pending
from .kv.cache_internals import complete_loaded_cache
from .request import FINISH_REASONS, Request, validate
from .sampling import RowSampler
from .state import RequestState, Status

CALLABLE_FIELDS = ("logits_processors", "sampler", "on_token")
STATE_FIELDS = (
    "uid",
    "seed",
    "projected_bytes",
    "submitted_s",
    "finish_reason",
    "message",
    "tokens",
    "logprobs",
    "fed",
    "cached_tokens",
    "join_order",
    "evicted",
    "sample_group",
)
_RECORD_FIELDS = frozenset(STATE_FIELDS) | {"request", "prompt_ids", "status", "top_logprobs"}
# A record's optional field: the callables the request had when saved (a file saved before it has none).
_NOT_RESTORED = "not_restored"
DOCUMENT_FIELDS = frozenset(
    {"format", "version", "identity", "counters", "rng", "requests", "queue", "batch", "events"}
)
_BATCH_FIELDS = frozenset({"rows", "free", "reuse_slots", "fast_path", "has_caches", "pending"})
_PENDING_FIELDS = frozenset({"tokens", "logprobs", "finite", "errors", "top"})
_COUNTERS = ("step_index", "next_uid", "joins")


def short(value: Any) -> str:
    """``value`` as JSON for an error message, cut to 80 characters."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A checkpoint file's parts, every field checked (:meth:`FieldReader.read`), for
    ``Checkpoint.load`` to assemble.

    Attributes:
        batch: the running batch (its caches loaded by mlx-lm). requests: uid -> state.
        queue: the waiting request states, in saved order. counters: ``step_index``,
        ``next_uid``, ``joins``. rng_state: the seed generator's ``bit_generator.state``.
        events: the event log.
    """

    batch: Batch
    requests: dict[int, RequestState]
    queue: list[RequestState]
    counters: dict[str, int]
    rng_state: dict
    events: list[Event]


def is_int(x: Any) -> bool:
    """True for an int that is not a bool (JSON's ``true`` is not a count)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def fields_differ(record: Any, expected: frozenset) -> str:
    """What differs between ``record``'s keys and ``expected``, for an error message."""
    have = set(record) if isinstance(record, dict) else set()
    return f"missing {sorted(expected - have)}, unknown {sorted(map(str, have - expected))}"


def need(ok: bool, where: str, what: str) -> None:
    """Refuse a checkpoint field: ``ValueError("checkpoint field <where>: <what>")``."""
    if not ok:
        raise ValueError(f"checkpoint field {where}: {what}")


def _int(value: Any, where: str, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi]`` (either bound optional), else refused."""
    need(is_int(value), where, f"{short(value)} is not an int")
    need(lo is None or value >= lo, where, f"{value} is below {lo}")
    need(hi is None or value <= hi, where, f"{value} is above {hi}")
    return value


def _list(value: Any, where: str, n: int | None = None) -> list:
    need(isinstance(value, list), where, f"{short(value)} is not a list")
    need(n is None or len(value) == n, where, f"{len(value)} entries, {n} expected")
    return value


def _object(value: Any, where: str, fields: frozenset | None = None) -> dict:
    need(isinstance(value, dict), where, f"{short(value)} is not an object")
    need(
        fields is None or set(value) == fields, where, f"fields {fields_differ(value, fields or frozenset())}"
    )
    return value


def _logprob(value: Any, where: str) -> float:
    """A log-probability: a number (NaN kept: an error row's), never above 0 or +inf."""
    need(_is_number(value), where, f"{short(value)} is not a number")
    need(math.isnan(value) or value <= 0, where, f"{value} is not a log-probability (<= 0)")
    return float(value)


class FieldReader:
    """Checks a checkpoint document field by field against one scheduler ``sched`` (its
    vocabulary, tokenizer, ledger, adapters, model and cache recipe; only read) and builds
    its parts (:meth:`read`); every refusal a ``ValueError`` naming the field."""

    def __init__(self, sched: Any):
        self.sched = sched
        self.vocab = int(sched.vocab_size)

    def token(self, value: Any, where: str) -> int:
        """A token id in ``[0, vocab_size)``."""
        need(is_int(value), where, f"{short(value)} is not a token id")
        need(0 <= value < self.vocab, where, f"{value} outside the vocabulary [0, {self.vocab})")
        return value

    def top(self, value: Any, where: str, most: int) -> tuple:
        """One token's top-k ``((id, log-prob), ...)``, at most ``most`` pairs."""
        _list(value, where)
        need(len(value) <= most, where, f"{len(value)} pairs, the request asks at most {most}")
        out = []
        for i, pair in enumerate(value):
            _list(pair, f"{where}[{i}]", 2)
            out.append((self.token(pair[0], f"{where}[{i}][0]"), _logprob(pair[1], f"{where}[{i}][1]")))
        return tuple(out)

    def read(self, document: dict, caches: list) -> Loaded:
        """The parts of ``document`` (its fields already named by ``DOCUMENT_FIELDS``, its
        identity equal to the scheduler's) with ``caches`` (mlx-lm's ``load_prompt_cache``).

        Raises:
            ValueError: the first field out of its range or inconsistent with another.
        """
        counters = _object(document["counters"], "counters", frozenset(_COUNTERS))
        for name in _COUNTERS:
            _int(counters[name], f"counters.{name}", 0)
        records = _list(document["requests"], "requests", counters["next_uid"])
        requests: dict[int, RequestState] = {}
        for i, record in enumerate(records):
            state = self.request_state(record, f"requests[{i}]", counters)
            need(state.uid not in requests, f"requests[{i}].uid", f"uid {state.uid} appears twice")
            requests[state.uid] = state
        queue = self.queue(document["queue"], requests)
        batch = self.batch(_object(document["batch"], "batch", _BATCH_FIELDS), requests, queue)
        self.places(requests, queue, batch)
        need(bool(batch.rows) or not caches, "caches", f"{len(caches)} layer(s) saved for an empty batch")
        batch.caches = self.caches(caches, batch) if batch.rows else None
        need(
            document["batch"]["has_caches"] is (batch.caches is not None),
            "batch.has_caches",
            f"{document['batch']['has_caches']} with {len(batch.rows)} row(s)",
        )
        rng, state = np.random.default_rng(), _object(document["rng"], "rng")
        need(state.get("bit_generator") == type(rng.bit_generator).__name__, "rng.bit_generator", "not PCG64")
        try:
            rng.bit_generator.state = state
            rng.integers(2**31)  # a state numpy accepts but cannot draw from is refused here
        except (TypeError, ValueError, KeyError, OverflowError) as exc:
            raise ValueError(f"checkpoint field rng: {exc}") from None
        events = [self.event(e, f"events[{i}]") for i, e in enumerate(_list(document["events"], "events"))]
        for i, e in enumerate(events):  # every event is of a saved request
            need(
                e.uid in requests,
                f"events[{i}].uid",
                f"{e.uid} is no request's uid (0 .. {len(requests) - 1})",
            )
        return Loaded(batch, requests, queue, dict(counters), state, events)

    # -- requests
    def request(self, record: dict, where: str) -> tuple[Request, Any]:
        """A record's request and its :class:`~workbench.engine.request.ValidRequest`,
        validated again by the scheduler (its tokenizer, vocabulary, context, adapters)."""
        sched = self.sched
        fields = dict(_object(record["request"], f"{where}.request"))
        for name in CALLABLE_FIELDS:
            need(fields.pop(name, None) is None, f"{where}.request.{name}", "a callable is never saved")
        bias = fields.get("logit_bias")
        if bias is not None:
            pairs = _list(bias, f"{where}.request.logit_bias")
            for j, pair in enumerate(pairs):
                _list(pair, f"{where}.request.logit_bias[{j}]", 2)
                self.token(pair[0], f"{where}.request.logit_bias[{j}][0]")
            fields["logit_bias"] = {t: b for t, b in pairs}
        try:
            request = Request(**fields)
            valid = validate(
                request, sched.tokenizer, sched.vocab_size, sched.context_tokens, sched.context_field
            )
            if sched.adapters is not None:
                sched.adapters.check(request.adapter)
            elif request.adapter is not None:
                raise ValueError(f"adapter {request.adapter!r}: this scheduler loads no adapters")
            refusal = sched.ledger.refusal(len(valid.prompt_ids), request.max_tokens)
            if refusal:  # as submit refuses it: under this KV budget it would wait forever
                raise ValueError(refusal)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint field {where}.request: {exc}") from None
        return request, valid

    def request_state(self, record: Any, where: str, counters: dict) -> RequestState:
        """A request state from its record (every field checked)."""
        _object(record, where, _record_fields(record))
        uid = _int(record["uid"], f"{where}.uid", 0, counters["next_uid"] - 1)
        request, valid = self.request(record, where)
        ids = _list(record["prompt_ids"], f"{where}.prompt_ids")
        if ids != list(valid.prompt_ids):
            raise ValueError(f"uid {uid}'s prompt tokenizes differently here than where it was saved")
        need(isinstance(record["status"], str), f"{where}.status", f"{short(record['status'])} is not a str")
        statuses = [s.value for s in Status if s is not Status.PREFILLING]
        need(record["status"] in statuses, f"{where}.status", f"{record['status']!r} not one of {statuses}")
        status = Status(record["status"])
        finished = status is Status.FINISHED
        seed = _int(record["seed"], f"{where}.seed", 0)
        need(request.seed in (None, seed), f"{where}.seed", f"{seed}, the request's seed is {request.seed}")
        constrained = getattr(request, "constrained", False)
        need(not (constrained and not finished), f"{where}.request", "a constraint on an unfinished row")
        reason = record["finish_reason"]
        need(
            reason in FINISH_REASONS if finished else reason is None,
            f"{where}.finish_reason",
            f"{short(reason)} for a {status.value} request (one of {FINISH_REASONS} once finished, else null)",
        )
        need(isinstance(record["message"], str), f"{where}.message", "not a str")
        most = request.max_tokens - (0 if finished else 1)  # an unfinished row reads at least one more
        tokens = _list(record["tokens"], f"{where}.tokens")
        need(
            len(tokens) <= most,
            f"{where}.tokens",
            f"{len(tokens)} tokens, at most {most} for a {status.value} row",
        )
        need(isinstance(record["evicted"], bool), f"{where}.evicted", "not a bool")
        return RequestState(
            uid,
            valid,
            seed,
            RowSampler(request, seed, self.vocab),
            projected_bytes=self.projected(record["projected_bytes"], f"{where}.projected_bytes", valid),
            submitted_s=self.finite(record["submitted_s"], f"{where}.submitted_s"),
            status=status,
            finish_reason=reason,
            message=record["message"],
            **self.generated(record, where, request.top_logprobs),
            sample_group=_int(record["sample_group"], f"{where}.sample_group", -1, counters["next_uid"] - 1),
            fed=_int(record["fed"], f"{where}.fed", 0),
            cached_tokens=_int(record["cached_tokens"], f"{where}.cached_tokens", 0, len(ids)),
            join_order=_int(record["join_order"], f"{where}.join_order", -1, counters["joins"] - 1),
            evicted=record["evicted"],
            not_restored=self.not_restored(record.get(_NOT_RESTORED, []), f"{where}.{_NOT_RESTORED}"),
        )

    @staticmethod
    def not_restored(value: Any, where: str) -> tuple[str, ...]:
        """A record's ``not_restored``: distinct names of :data:`CALLABLE_FIELDS` (the callables
        its request had when saved, which the file does not hold)."""
        names = _list(value, where)
        for j, name in enumerate(names):
            need(
                name in CALLABLE_FIELDS, f"{where}[{j}]", f"{short(name)} not one of {list(CALLABLE_FIELDS)}"
            )
        need(len(set(names)) == len(names), where, "a name appears twice")
        return tuple(names)

    def generated(self, record: dict, where: str, top_k: int) -> dict:
        """A record's ``tokens``, ``logprobs`` and ``top_logprobs``, checked."""
        tokens = [self.token(t, f"{where}.tokens[{j}]") for j, t in enumerate(record["tokens"])]
        logprobs = _list(record["logprobs"], f"{where}.logprobs", len(tokens))
        tops = _list(record["top_logprobs"], f"{where}.top_logprobs", len(tokens))
        return dict(
            tokens=tokens,
            logprobs=[_logprob(v, f"{where}.logprobs[{j}]") for j, v in enumerate(logprobs)],
            top_logprobs=[self.top(p, f"{where}.top_logprobs[{j}]", top_k) for j, p in enumerate(tops)],
        )

    def projected(self, value: Any, where: str, valid: Any) -> int:
        """A request's ``projected_bytes``, as this scheduler's ledger projects it."""
        alone = self.sched.ledger.alone_bytes(len(valid.prompt_ids), valid.request.max_tokens)
        need(_int(value, where, 0) == alone, where, f"{value}, this scheduler projects {alone} bytes")
        return alone

    @staticmethod
    def finite(value: Any, where: str) -> float:
        """A finite number (a time in seconds)."""
        need(_is_number(value) and math.isfinite(value), where, f"{short(value)} is not a finite number")
        return float(value)

    def queue(self, value: Any, requests: dict[int, RequestState]) -> list[RequestState]:
        """The queue: distinct uids of waiting (queued or preempted) requests."""
        uids = _list(value, "queue")
        for i, u in enumerate(uids):
            need(is_int(u) and u in requests, f"queue[{i}]", f"{short(u)} is no request's uid")
            need(requests[u].waiting, f"queue[{i}]", f"uid {u} is {requests[u].status.value}, not waiting")
        need(len(set(uids)) == len(uids), "queue", "a uid appears twice")
        return [requests[u] for u in uids]

    # -- batch
    def batch(self, record: dict, requests: dict[int, RequestState], queue: list) -> Batch:
        """The batch without its caches: distinct rows of running (or finished, not evicted)
        requests, free slots inside the cache rows, the pending next tokens (:meth:`pending`)."""
        for name in ("reuse_slots", "has_caches"):
            need(isinstance(record[name], bool), f"batch.{name}", f"{short(record[name])} is not a bool")
        need(isinstance(record["fast_path"], str), "batch.fast_path", "not a str")
        rows = _list(record["rows"], "batch.rows")
        for b, u in enumerate(rows):
            where = f"batch.rows[{b}]"
            need(is_int(u) and u in requests, where, f"{short(u)} is no request's uid")
            s = requests[u]
            need(s.status in (Status.RUNNING, Status.FINISHED), where, f"uid {u} is {s.status.value}")
            need(not s.evicted, where, f"uid {u} is evicted (it has no row)")
            if s.status is Status.RUNNING:  # its generated tokens are in its cache row
                need(
                    s.fed == len(s.tokens),
                    f"{where} (uid {u}).fed",
                    f"{s.fed}, it has {len(s.tokens)} tokens",
                )
        need(len(set(rows)) == len(rows), "batch.rows", "a uid holds two rows")
        B = len(rows)
        free = _list(record["free"], "batch.free")
        for i, p in enumerate(free):
            _int(p, f"batch.free[{i}]", 0, B + len(free) - 1)
        need(len(set(free)) == len(free), "batch.free", "a slot appears twice")
        need(B > 0 or not free, "batch.free", "free slots without rows")
        need(record["reuse_slots"] or not free, "batch.free", "free slots with reuse_slots off")
        here = self.sched.config.reuse_slots
        need(
            record["reuse_slots"] == here,
            "batch.reuse_slots",
            f"{record['reuse_slots']}, this scheduler's is {here}",
        )
        batch = Batch(record["reuse_slots"])
        batch.rows = [requests[u] for u in rows]
        batch.free, batch.fast_path = list(free), record["fast_path"]
        if B == 0:
            need(record["pending"] is None, "batch.pending", "pending tokens without rows")
        else:
            batch.pending = self.pending(record["pending"], batch.rows)
        return batch

    def pending(self, record: Any, rows: list[RequestState]) -> Pending:
        """The pending next tokens ``[B]`` (in the vocabulary), their log-probs, finite
        flags, error messages and top-k pairs (row keys in ``[0, B)``)."""
        B = len(rows)
        p = _object(record, "batch.pending", _PENDING_FIELDS)
        tokens = [
            self.token(t, f"batch.pending.tokens[{b}]")
            for b, t in enumerate(_list(p["tokens"], "batch.pending.tokens", B))
        ]
        logprobs = [
            _logprob(v, f"batch.pending.logprobs[{b}]")
            for b, v in enumerate(_list(p["logprobs"], "batch.pending.logprobs", B))
        ]
        finite = _list(p["finite"], "batch.pending.finite", B)
        for b, f in enumerate(finite):
            need(isinstance(f, bool), f"batch.pending.finite[{b}]", f"{short(f)} is not a bool")
        errors = {
            self.row(k, B, "batch.pending.errors"): m
            for k, m in _object(p["errors"], "batch.pending.errors").items()
        }
        for b, m in errors.items():
            need(isinstance(m, str), f"batch.pending.errors[{b}]", "not a str")
        top = {}
        for k, pairs in _object(p["top"], "batch.pending.top").items():
            b = self.row(k, B, "batch.pending.top")
            pairs = self.top(pairs, f"batch.pending.top[{b}]", rows[b].valid.request.top_logprobs)
            top[b] = (
                mx.array([t for t, _ in pairs], dtype=mx.int32),
                mx.array([v for _, v in pairs], dtype=mx.float32),
            )
        return Pending(
            mx.array(tokens, dtype=mx.uint32),
            mx.array(logprobs, dtype=mx.float32),
            mx.array(finite, dtype=mx.bool_),
            errors,
            top,
        )

    @staticmethod
    def row(key: str, B: int, where: str) -> int:
        """A row index saved as a JSON key (``"0"`` .. ``str(B - 1)``)."""
        need(key.isdigit() and int(key) < B, f"{where}[{key!r}]", f"not a row in [0, {B})")
        return int(key)

    @staticmethod
    def places(requests: dict[int, RequestState], queue: list, batch: Batch) -> None:
        """Every request in exactly the place its status says (queue, batch row, or gone)."""
        queued, rows = {s.uid for s in queue}, {s.uid for s in batch.rows}
        for uid, s in requests.items():
            where = f"requests[uid {uid}].status"
            if s.waiting:
                need(uid in queued, where, f"{s.status.value} but not in the queue")
            elif s.status is Status.RUNNING:
                need(uid in rows, where, "running but in no batch row")
            else:
                need(uid in rows or s.evicted, where, "finished, not evicted, but in no batch row")

    # -- caches
    def caches(self, loaded: list, batch: Batch) -> list:
        """The loaded caches, checked layer by layer against this model's own (a one-token
        probe on fresh batch caches) and the batch: class, array shapes and dtypes,
        ``B`` + free-slot rows, and for attention layers the offsets and widths."""
        reference = self.sched.recipe.batch(1)
        self.sched.model(mx.array([[0]], dtype=mx.uint32), cache=reference)
        mx.eval([c.state for c in reference])
        need(
            len(loaded) == len(reference), "caches", f"{len(loaded)} layers, this model has {len(reference)}"
        )
        P = len(batch.rows) + len(batch.free)
        live = batch.live_slots
        held = np.array([r.context_tokens for r in batch.rows])
        for i, (got, ref) in enumerate(zip(loaded, reference)):
            self.layer(got, ref, f"caches[{i}]", P, live, held)
        for c in loaded:
            complete_loaded_cache(c)
        return loaded

    def layer(self, got: Any, ref: Any, where: str, P: int, live: list[int], held: np.ndarray) -> None:
        """One loaded layer ``got`` against this model's ``ref`` (``CacheList`` members in
        turn; ``ArraysCache``: each state array ``[P, ...]`` as the model's; attention:
        :meth:`attention`)."""
        need(type(got) is type(ref), where, f"a {type(got).__name__}, this model's is a {type(ref).__name__}")
        if isinstance(ref, CacheList):
            subs = getattr(got, "caches", None)
            n = len(subs) if isinstance(subs, (list, tuple)) else 0
            need(n == len(ref.caches), where, f"{n} member caches, this model's has {len(ref.caches)}")
            for j, (g, r) in enumerate(zip(subs, ref.caches)):
                self.layer(g, r, f"{where}.{j}", P, live, held)
        elif isinstance(ref, ArraysCache):
            arrays, left_padding, lengths = got.state
            need(
                isinstance(arrays, list) and len(arrays) == len(ref.cache),
                where,
                f"{len(arrays) if isinstance(arrays, list) else 'no'} state arrays, this model's has {len(ref.cache)}",
            )
            for j, (a, r) in enumerate(zip(arrays, ref.cache)):
                if r is None:
                    need(a is None, f"{where}.cache[{j}]", "present, this model's is None")
                else:
                    _array(a, f"{where}.cache[{j}]", (P, *r.shape[1:]), r.dtype)
            for name, a in (("left_padding", left_padding), ("lengths", lengths)):
                if a is not None:
                    _array(a, f"{where}.{name}", (P,), None)  # mlx-lm counts it down past 0
        else:
            self.attention(got, ref, where, P, live, held)

    def attention(self, got: Any, ref: Any, where: str, P: int, live: list[int], held: np.ndarray) -> None:
        """A ``BatchKVCache`` / ``BatchRotatingKVCache`` layer: keys and values ``[P,
        n_kv_heads, capacity, head_dim]`` in this model's dtype, ``offset`` / ``left_padding``
        ``[P]`` int32, write index within the capacity (a ring's counters as :func:`_ring`);
        each row's offset equals its token count and (full attention) left padding + offset
        = KV width."""
        rotating = isinstance(ref, BatchRotatingKVCache)
        state = got.state
        keys, values, offset, left_padding = state[:4]
        if rotating:
            max_size, offset_total, idx, rotated = state[4:]
            need(
                max_size == ref.max_size,
                f"{where}.max_size",
                f"{short(max_size)}, this model's window is {ref.max_size}",
            )
            _int(offset_total, f"{where}._offset", 0)
            need(isinstance(rotated, bool), f"{where}.rotated", "not a bool")
        else:
            (idx,) = state[4:]
        rk, rv = ref.state[:2]
        _array(keys, f"{where}.keys", (P, rk.shape[1], None, rk.shape[3]), rk.dtype)
        capacity = keys.shape[2]
        _array(values, f"{where}.values", (P, rv.shape[1], capacity, rv.shape[3]), rv.dtype)
        _int(idx, f"{where}._idx", 0, capacity)
        if rotating:
            _ring(where, capacity, max_size, offset_total, idx, rotated)
        for name, a in (("offset", offset), ("left_padding", left_padding)):
            _array(a, f"{where}.{name}", (P,), mx.int32)
        rows = np.array(offset)[live]
        for b in np.nonzero(rows != held)[0]:
            need(False, f"{where}.offset[{live[b]}]", f"{rows[b]}, its row holds {held[b]} tokens")
        if not rotating:
            pad = np.array(left_padding)[live]
            for b in np.nonzero((pad < 0) | (pad + rows != idx))[0]:
                need(
                    False,
                    f"{where}.left_padding[{live[b]}]",
                    f"{pad[b]} + offset {rows[b]} != KV width {idx}",
                )

    # -- events
    def event(self, record: Any, where: str) -> Event:
        """An :class:`~workbench.observe.events.Event` from its record, each field of its type."""
        record = dict(_object(record, where))
        types = {f.name: getattr(f.type, "__name__", f.type) for f in dataclasses.fields(Event)}
        need(set(record) <= set(types), where, f"fields {fields_differ(record, frozenset(types))}")
        for name, kind in types.items():
            if name not in record:
                continue
            value, at = record[name], f"{where}.{name}"
            if kind == "int":
                _int(value, at)
            elif kind == "float":
                need(value is None or _is_number(value), at, f"{short(value)} is not a number")
            elif kind == "str":
                need(isinstance(value, str), at, f"{short(value)} is not a str")
            else:  # top_logprobs
                record[name] = self.top(value, at, len(value) if isinstance(value, list) else 0)
        if record.get("logprob") is None:
            record["logprob"] = float("nan")
        try:
            return Event(**record)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint field {where}: {exc}") from None


def _record_fields(record: Any) -> frozenset:
    """The fields a request record must have: :data:`_RECORD_FIELDS`, and ``not_restored``
    where it has one (a file saved before that field was written has none: read as ``[]``)."""
    return (
        _RECORD_FIELDS | {_NOT_RESTORED}
        if isinstance(record, dict) and _NOT_RESTORED in record
        else _RECORD_FIELDS
    )


def _ring(where: str, capacity: int, window: int, written: int, idx: int, rotated: bool) -> None:
    """A ``BatchRotatingKVCache``'s counters as ``update_and_fetch`` leaves them between steps:
    once ``rotated``, capacity = window, ``0 < _idx <= window <= _offset``; before,
    ``_idx = min(_offset, capacity)``."""
    if rotated:
        need(capacity == window, f"{where}.keys", f"capacity {capacity} in a rotated ring of window {window}")
        need(0 < idx <= window, f"{where}._idx", f"{idx} in a rotated ring, (0, {window}] expected")
        need(
            written >= window, f"{where}._offset", f"{written} in a rotated ring, at least {window} expected"
        )
    else:
        need(
            idx == min(written, capacity),
            f"{where}._idx",
            f"{idx}, min(_offset {written}, capacity {capacity}) expected before the ring rotates",
        )


def _array(a: Any, where: str, shape: tuple, dtype: Any) -> None:
    """``a`` an MLX array of ``shape`` (``None``: any length on that axis) and ``dtype``
    (``None``: any integer dtype)."""
    need(isinstance(a, mx.array), where, f"a {type(a).__name__}, not an array")
    ok = a.ndim == len(shape) and all(n is None or a.shape[k] == n for k, n in enumerate(shape))
    want = "x".join("*" if n is None else str(n) for n in shape)
    need(ok, where, f"shape {tuple(a.shape)}, this model and batch need {want}")
    if dtype is None:
        need(mx.issubdtype(a.dtype, mx.integer), where, f"dtype {a.dtype}, an integer dtype needed")
    else:
        need(a.dtype == dtype, where, f"dtype {a.dtype}, this model's is {dtype}")
