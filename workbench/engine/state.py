"""Per-request state: one object per uid, with an explicit status.

Status of a request (mirrors nano-vllm's ``SequenceStatus``, vLLM's ``RequestStatus``)::

    QUEUED ─admit()─▶ PREFILLING ─join─▶ RUNNING ─stop/length/error─▶ FINISHED ─filter()─▶ (evicted)
       ▲                                    │
       └────────── PREEMPTED ◀─preempt()────┘      abort(): any status ─▶ FINISHED ("abort")

A FINISHED request may still hold a row of the batch until ``filter()`` evicts it
(``evicted`` tells). A PREEMPTED request waits in the queue like a QUEUED one and resumes
from its prompt plus the tokens it generated. Notes: ``docs/lab/engine-notes.md``, "state.py".
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field

from .request import ValidRequest
from .sampling import RowSampler
from .text import RowText, sync, text_tokens


class Status(enum.Enum):
    """Where a request is in its life (see the module docstring)."""

    QUEUED = "queued"
    PREFILLING = "prefilling"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass
class RequestState:
    """Everything the engine knows about one request.

    Attributes:
        uid: the request's id. valid: the validated request (prompt ids, stop ids).
        seed: PRNG seed of its sampler (its own ``Request.seed`` or one the scheduler drew).
        sampler: its :class:`workbench.engine.sampling.RowSampler`.
        projected_bytes: bytes it may hold alone on an idle engine (``KVLedger.alone_bytes``).
        submitted_s: the scheduler's clock when it was submitted (seconds).
        status: its :class:`Status`. finish_reason: ``stop``, ``length``, ``error``,
            ``abort`` once FINISHED, else ``None``. message: the error text (else ``""``).
        tokens: generated token ids. logprobs: their log-probabilities (natural log).
        top_logprobs: per generated token its best ``((id, log-prob), ...)`` (``()``: none asked).
        sample_group: the first uid of its ``submit_n`` group (``-1``: submitted alone).
        fed: generated tokens already fed into its cache row.
        cached_tokens: prompt tokens found in the prompt cache at its last admission.
        join_order: order of joining the running batch (-1 before), for preemption.
        evicted: True once ``filter()`` removed its row (or it never had one).
        not_restored: the callable fields of its request (``sampler``, ``logits_processors``,
            ``on_token``) it had when saved to a checkpoint file, which cannot hold them: loaded
            from one, its request has ``None`` there, its tokens made with them (``()``: none lost).
        text_state: its :class:`workbench.engine.text.RowText`, rebuilt from ``tokens`` by :meth:`text`.
    """

    uid: int
    valid: ValidRequest
    seed: int
    sampler: RowSampler
    projected_bytes: int
    submitted_s: float = 0.0
    status: Status = Status.QUEUED
    finish_reason: str | None = None
    message: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[tuple] = field(default_factory=list)
    sample_group: int = -1
    fed: int = 0
    cached_tokens: int = 0
    join_order: int = -1
    evicted: bool = False
    not_restored: tuple[str, ...] = ()
    text_state: RowText | None = field(default=None, compare=False, repr=False)

    @property
    def finished(self) -> bool:
        """True once the request has a finish reason."""
        return self.status is Status.FINISHED

    @property
    def constraint(self) -> str:
        """Its output constraint as ``field=source`` (cut for views), ``""`` for a free row."""
        grammar = self.sampler.constraint
        return "" if grammar is None else grammar.constraint.label()

    @property
    def waiting(self) -> bool:
        """True while it sits in the queue (QUEUED or PREEMPTED)."""
        return self.status in (Status.QUEUED, Status.PREEMPTED)

    @property
    def context_tokens(self) -> int:
        """Tokens in its cache row while running: prompt plus fed generated tokens."""
        return len(self.valid.prompt_ids) + self.fed

    @property
    def inputs(self) -> list[int]:
        """Tokens to prefill at admission: the prompt, plus generated tokens when resuming."""
        return list(self.valid.prompt_ids) + self.tokens

    @property
    def n_inputs(self) -> int:
        """``len(inputs)`` (prompt plus generated tokens), without building the list."""
        return len(self.valid.prompt_ids) + len(self.tokens)

    def inputs_slice(self, start: int, end: int) -> list[int]:
        """``inputs[start:end]`` (``0 <= start <= end``), without building the whole list."""
        n = len(self.valid.prompt_ids)
        if start >= n:
            return self.tokens[start - n : end - n]
        return list(self.valid.prompt_ids[start:end]) + self.tokens[: max(end - n, 0)]

    def finish(self, reason: str, message: str = "") -> None:
        """Mark it FINISHED with ``reason`` (one of ``workbench.engine.request.FINISH_REASONS``)."""
        self.status, self.finish_reason, self.message = Status.FINISHED, reason, message

    def text(self, tokenizer) -> RowText:
        """Its :class:`RowText` brought up to date with its tokens, closed once finished
        (mlx-lm's per-request ``detokenizer``); interrupt-safe."""
        text, self.text_state = self.text_state, None
        if text is None:
            text = RowText(tokenizer, self.valid.stop)
        sync(text, text_tokens(self.tokens, self.finish_reason, self.valid.stop_ids), self.finished)
        self.text_state = text
        return text

    def memo(self) -> tuple:
        """Its mutable fields now, for :meth:`undo`."""
        t = self.text_state
        return (
            self.status,
            self.finish_reason,
            self.message,
            len(self.tokens),
            len(self.logprobs),
            len(self.top_logprobs),
            self.fed,
            self.cached_tokens,
            self.join_order,
            self.evicted,
            t,
            t and (t.n_tokens, t.closed),
        )

    def undo(self, memo: tuple) -> None:
        """Return to the fields of :meth:`memo` (a text cache fed since is dropped)."""
        (
            self.status,
            self.finish_reason,
            self.message,
            n_tokens,
            n_logprobs,
            n_top,
            self.fed,
            self.cached_tokens,
            self.join_order,
            self.evicted,
            text,
            fed,
        ) = memo
        del self.tokens[n_tokens:], self.logprobs[n_logprobs:], self.top_logprobs[n_top:]
        now = self.text_state
        self.text_state = (
            text if text is not None and now is text and (now.n_tokens, now.closed) == fed else None
        )

    def copy(self) -> "RequestState":
        """An independent copy (token lists copied, request and sampler shared)."""
        out = copy.copy(self)
        out.tokens, out.logprobs, out.text_state = list(self.tokens), list(self.logprobs), None
        out.top_logprobs = list(self.top_logprobs)
        return out
