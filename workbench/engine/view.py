"""What a user reads of one request: a frozen :class:`RequestView`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .state import RequestState, Status


@dataclass(frozen=True)
class RequestView:
    """One request as it stands when read (``sched.request(uid)``); it does not change
    afterwards.

    Attributes:
        uid: its id. status: its :class:`Status`. prompt_ids: the prompt's token ids.
        tokens: generated token ids so far (a final stop id included). logprobs: their
        natural-log probabilities (float32). finish_reason: ``stop``, ``length``, ``error``,
        ``abort``, or ``None``. error: the message of an ``error`` row (else ``""``).
        text: the visible completion (:mod:`workbench.engine.text`).
        top_logprobs: per token its best ``((id, log-prob), ...)`` (``()``: none asked).
        constraint: ``field=source`` (``"regex=[0-9]+"``), ``""`` for a free row.

    Example: ``sched.request(uid).tokens`` after two steps of a running row is
    ``(tok_0, tok_1)``, ``status`` ``Status.RUNNING``, ``finish_reason`` ``None``.
    """

    uid: int
    status: Status
    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str | None
    error: str
    text: str
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    constraint: str = ""

    @classmethod
    def of(cls, state: RequestState, tokenizer: Any) -> "RequestView":
        """The view of ``state`` now (its text through ``tokenizer``)."""
        return cls(
            state.uid,
            state.status,
            tuple(state.valid.prompt_ids),
            tuple(state.tokens),
            tuple(state.logprobs),
            state.finish_reason,
            state.message,
            state.text(tokenizer).text,
            top_logprobs=tuple(state.top_logprobs),
            constraint=state.constraint,
        )


@dataclass(frozen=True)
class StreamChunk:
    """One chunk of ``Scheduler.stream(uid, logprobs=True)``: the text that settled and the
    tokens read since the previous chunk (either may be empty, not both).

    Attributes:
        text: the new visible text piece (joined over chunks: the request's text).
        tokens: token ids read since the previous chunk. logprobs, top_logprobs: theirs.

    Example: ``StreamChunk(text=" x", tokens=(87,), logprobs=(-0.2,), top_logprobs=(((87, -0.2),),))``.
    """

    text: str
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]

    @classmethod
    def of(cls, state: RequestState, text: str, start: int, stop: int) -> "StreamChunk":
        """``text`` with ``state``'s tokens ``[start, stop)`` and their log-probs."""
        return cls(
            text,
            tuple(state.tokens[start:stop]),
            tuple(state.logprobs[start:stop]),
            tuple(state.top_logprobs[start:stop]),
        )


def stream_pieces(
    requests: Callable[[], Mapping[int, RequestState]],
    tokenizer: Any,
    uids: list[int] | None,
    chunks: bool,
    iterate: Callable[[], None],
    idle: Callable[[], bool],
) -> Iterator[tuple[int, Any]]:
    """``(uid, piece)`` of ``Scheduler.stream`` / ``stream_all`` (``chunks``: :class:`StreamChunk`),
    calling ``iterate()`` until ``uids`` finish (``None``: until ``idle()``)."""
    sent: dict[int, int] = {}  # characters handed out per uid
    read: dict[int, int] = {}  # tokens handed out per uid (chunks)
    done: set[int] = set()  # uids finished and fully handed out: never read again

    def pieces() -> Iterator[tuple[int, Any]]:
        for u in uids if uids is not None else list(requests()):
            state = requests()[u]
            if u in done:
                continue
            ready = state.text(tokenizer).ready
            text, t0, t1 = ready[sent.get(u, 0) :], read.get(u, 0), len(state.tokens)
            sent[u], read[u] = len(ready), t1
            if chunks and (text or t1 > t0):
                yield u, StreamChunk.of(state, text, t0, t1)
            elif text and not chunks:
                yield u, text
            if state.finished:
                done.add(u)

    yield from pieces()
    while not (idle() if uids is None else all(requests()[u].finished for u in uids)):
        iterate()
        yield from pieces()
