"""The engine's integrity check: the request states, the queue, the prefilling group, the
batch and every layer's cache agree with each other.

Reads only (it evaluates the caches' small offset arrays, waiting for a forward in flight).
Notes: ``docs/lab/engine-notes.md``, "integrity.py".

Checked (``Scheduler.check()``; the tests and the fuzzer call it after every operation):

- every request is in exactly the place its status says (queue: queued or preempted;
  prefilling group: prefilling, or finished by an abort; batch: running, or finished and
  waiting for ``filter``), and an unfinished request is never in no place;
- uids are ``0 .. next_uid - 1``; tokens and log-probs have the same length, within
  ``max_tokens``;
- the batch has one pending token per row, caches exactly when it has rows, free slots
  inside its cache rows;
- every request's text cache (given the tokenizer) holds at most its text tokens, and its
  visible text and stop position equal a fresh detokenizer's over the tokens it counts;
- an idle engine (no running row, no prefilling group) with a queue admits someone of it
  once what may yield has (``Scheduler.check()`` asks admission: a queue it would admit
  none of is a wedge);
- every attention layer's ``offset[b]`` equals the scheduler's count of tokens in row
  ``b``'s cache (prompt + fed tokens) and full-attention layers have
  ``left_padding + offset = KV width``; every layer holds ``B`` + free-slot rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .kv import caches as kv
from .state import Status
from .text import RowText, sync, text_tokens

PLACES = {
    "queue": (Status.QUEUED, Status.PREEMPTED),
    "prefilling": (Status.PREFILLING, Status.FINISHED),
    "batch": (Status.RUNNING, Status.FINISHED),
}


@dataclass(frozen=True)
class Integrity:
    """The result of :func:`check_state`.

    Attributes:
        problems: one sentence per disagreement found (empty when healthy).
        summary: what was checked (rows, queued, prefilling, requests, layers).
    """

    problems: tuple[str, ...]
    summary: str

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def __str__(self) -> str:
        if self.ok:
            return f"integrity ok: {self.summary}"
        return "\n".join(
            [f"integrity: {len(self.problems)} problem(s) ({self.summary})"]
            + [f"  - {p}" for p in self.problems]
        )


def _places(state: Any) -> list[str]:
    problems, seen = [], {}
    members = {
        "queue": state.queue,
        "prefilling": state.prefilling.states if state.prefilling else [],
        "batch": state.batch.rows,
    }
    for place, states in members.items():
        for s in states:
            if s.uid in seen:
                problems.append(f"uid {s.uid} is in the {seen[s.uid]} and the {place}")
            seen[s.uid] = place
            if s.status not in PLACES[place] and not (
                place == "batch" and s.status is Status.PREFILLING and hasattr(state.batch, "problems")
            ):  # packed: joiners in the batch
                problems.append(f"uid {s.uid} is {s.status.value} but sits in the {place}")
            if state.requests.get(s.uid) is not s:
                problems.append(f"uid {s.uid} in the {place} is not the request state the scheduler holds")
    if sorted(state.requests) != list(range(state.next_uid)):
        problems.append(f"uids are not 0..{state.next_uid - 1}")
    for uid, s in state.requests.items():
        if uid not in seen and not (s.finished and s.evicted):
            problems.append(f"uid {uid} is {s.status.value} but in no place (lost)")
        if (
            len(s.tokens) != len(s.logprobs)
            or len(s.tokens) != len(s.top_logprobs)
            or len(s.tokens) > s.valid.request.max_tokens
        ):
            problems.append(
                f"uid {uid} has {len(s.tokens)} tokens, {len(s.logprobs)} log-probs, "
                f"{len(s.top_logprobs)} top-k entries, max_tokens {s.valid.request.max_tokens}"
            )
    return problems


def _texts(state: Any, tokenizer) -> list[str]:
    """Each text cache against a rebuild from the tokens it claims."""
    problems = []
    for uid, s in state.requests.items():
        t = s.text_state
        if t is None:
            continue
        tokens = text_tokens(s.tokens, s.finish_reason, s.valid.stop_ids)
        if t.n_tokens > len(tokens) or (t.closed and not s.finished):
            problems.append(
                f"uid {uid}: its text counts {t.n_tokens} tokens{' and is closed' if t.closed else ''}, "
                f"the request has {len(tokens)} text tokens and is {s.status.value}"
            )
            continue
        fresh = sync(RowText(tokenizer, s.valid.stop), tokens[: t.n_tokens], t.closed)
        if (t.text, t.stop_at) != (fresh.text, fresh.stop_at):
            problems.append(
                f"uid {uid}: its text {t.text[-40:]!r} (stop at {t.stop_at}) is not what its "
                f"{t.n_tokens} tokens decode to, {fresh.text[-40:]!r} (stop at {fresh.stop_at})"
            )
    return problems


def _batch(state: Any) -> tuple[list[str], int]:
    batch, problems = state.batch, []
    if hasattr(batch, "problems"):  # the packed layout checks its own pages (PackedBatch.problems)
        return batch.problems(), 0
    B, P = len(batch), len(batch.rows) + len(batch.free)
    if (batch.caches is None) != (B == 0) or (B == 0 and batch.free):
        problems.append(
            f"{B} row(s) but caches {'absent' if batch.caches is None else 'present'}, "
            f"{len(batch.free)} free slot(s)"
        )
        return problems, 0
    if B == 0:
        return problems, 0
    if batch.pending is None or batch.pending.tokens.shape[0] != B:
        problems.append(
            f"{B} row(s) but {0 if batch.pending is None else batch.pending.tokens.shape[0]} pending tokens"
        )
    if any(not 0 <= p < P for p in batch.free):
        problems.append(f"free slots {batch.free} outside the {P} cache rows")
    held = np.array([r.context_tokens for r in batch.rows])
    groups = kv.layer_groups(batch.view)
    for name, layers in groups.items():
        for label, c in layers:
            problems += _layer(name, label, c, held, B)
    return problems, sum(len(v) for v in groups.values())


def _layer(name: str, label: str, cache, held: np.ndarray, B: int) -> list[str]:
    if name == "ssm":
        rows = {a.shape[0] for a in cache.cache if a is not None}
        return [] if rows <= {B} else [f"layer {label} (ssm) holds {sorted(rows)} rows, the batch {B}"]
    if not hasattr(cache, "offset") or cache.keys is None:
        return []
    offset = np.array(cache.offset).reshape(-1)
    out = []
    if offset.shape[0] != B:
        return [f"layer {label} ({name}) holds {offset.shape[0]} rows, the batch {B}"]
    for b in np.nonzero(offset != held)[0]:
        out.append(
            f"layer {label} ({name}) row {b}: cache offset {offset[b]}, scheduler counts {held[b]} tokens"
        )
    if name == "full":
        width = int(cache.size())
        lp = np.array(cache.left_padding).reshape(-1)
        for b in np.nonzero(lp + offset != width)[0]:
            out.append(
                f"layer {label} (full) row {b}: left padding {lp[b]} + offset {offset[b]} != KV width {width}"
            )
    return out


def check_state(state: Any, tokenizer=None, wedge: str = "") -> Integrity:
    """Check ``state`` (text caches only with ``tokenizer``); ``wedge``: admission's sentence
    (:meth:`~workbench.engine.admission.Admission.wedge`), reported as a problem. Never raises."""
    problems = _places(state) + ([] if tokenizer is None else _texts(state, tokenizer))
    problems += [wedge] if wedge else []
    batch_problems, n_layers = _batch(state)
    summary = (
        f"{len(state.batch)} row(s), {len(state.queue)} queued, "
        f"{len(state.prefilling.states) if state.prefilling else 0} prefilling, "
        f"{len(state.requests)} request(s), {n_layers} layer cache(s) checked"
    )
    return Integrity(tuple(problems + batch_problems), summary)
