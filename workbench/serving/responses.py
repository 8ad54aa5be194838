"""OpenAI's response shapes, as ``mlx_lm.server`` and vLLM send them.

Knows: the JSON of chat completions (``chat.completion`` / ``chat.completion.chunk``) and
completions (``text_completion``), their ``logprobs`` and ``usage``, OpenAI's error body.
Must not know: the scheduler, threads, HTTP.

A stream is ``data: {chunk}\\n\\n`` lines ending in ``data: [DONE]``: each row's first chat
chunk carries ``delta.role``, every new piece one chunk, each row's end a chunk with its
``finish_reason``, and with ``stream_options.include_usage`` a last chunk whose ``choices``
is empty and whose ``usage`` counts every row (the earlier chunks carry ``"usage": null``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .engine import Done, Piece

FINGERPRINT = "workbench"


def error_body(message: str, field: str | None, kind: str = "invalid_request_error") -> dict:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``, its text
    encodable whatever it echoes: a lone surrogate (``"\\ud800"``, which a JSON body can carry
    in a field's name, or a chat template's message can repeat) has no UTF-8 form, and the
    response would fail to render (HTTP 500); each is written as its escape, the six
    characters ``\\ud800``. mlx-lm: none."""
    return {"error": {"message": _escaped(message), "type": kind, "param": _escaped(field), "code": None}}


def _escaped(text: str | None) -> str | None:
    """``text`` with each lone surrogate as its backslash escape (``"\\ud800"`` -> ``"\\\\ud800"``)."""
    if text is None:
        return None
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def sse(payload: dict | str) -> str:
    """One server-sent event: ``data: <json>`` and a blank line (``[DONE]`` as is).

    Raises:
        ValueError: a non-finite float in ``payload`` (strict JSON, as Starlette's
            ``JSONResponse`` renders the non-streamed body: ``NaN`` / ``Infinity`` are no JSON).
    """
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, allow_nan=False)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """OpenAI's ``usage`` object (tokens)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass
class Shaper:
    """Builds one request's chunks and final body.

    Args:
        chat: chat completions (else completions).
        model: the served model's id.
        decode: ``(token ids) -> str``, for log-prob entries' ``token``.
        logprobs: whether choices carry ``logprobs``.
    """

    chat: bool
    model: str
    decode: Callable[[list[int]], str]
    logprobs: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def _head(self, streaming: bool) -> dict:
        if self.chat:
            kind = "chat.completion.chunk" if streaming else "chat.completion"
            prefix = "chatcmpl-"
        else:
            kind, prefix = "text_completion", "cmpl-"
        return {
            "id": prefix + self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
        }

    def logprobs_of(self, pieces: list[Piece], offset: int = 0) -> dict | None:
        """The ``logprobs`` of ``pieces``' tokens (``None`` unless asked): chat's
        ``{"content": [{token, logprob, bytes, top_logprobs}]}`` or completions'
        ``{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}``
        (``offset``: characters already sent)."""
        if not self.logprobs:
            return None
        ids = [t for p in pieces for t in p.tokens]
        lps = [lp for p in pieces for lp in p.logprobs]
        tops = [top for p in pieces for top in p.top_logprobs]
        words = [self.decode([t]) for t in ids]
        if self.chat:
            return {
                "content": [
                    {
                        "token": w,
                        "logprob": lp,
                        "bytes": list(w.encode()),
                        "top_logprobs": [
                            {"token": (tw := self.decode([i])), "logprob": g, "bytes": list(tw.encode())}
                            for i, g in top
                        ],
                    }
                    for w, lp, top in zip(words, lps, tops)
                ]
            }
        offsets, at = [], offset
        for w in words:
            offsets.append(at)
            at += len(w)
        return {
            "tokens": words,
            "token_logprobs": lps,
            "top_logprobs": [{self.decode([i]): g for i, g in top} for top in tops],
            "text_offset": offsets,
        }

    def chunk(self, item: Piece | Done, first: bool, include_usage: bool, offset: int = 0) -> dict:
        """The stream chunk of one piece, or of a row's end (``finish_reason``); ``first``: the
        row's first chunk (chat: ``delta.role``)."""
        finish = item.finish_reason if isinstance(item, Done) else None
        text = item.text if isinstance(item, Piece) else ""
        pieces = [item] if isinstance(item, Piece) else []
        choice: dict[str, Any] = {"index": item.index}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text or first:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text
        choice["logprobs"] = self.logprobs_of(pieces, offset) if pieces else None
        choice["finish_reason"] = finish
        if finish == "error":
            choice["error"] = error_body(item.message, None, "server_error")["error"]
        out = {**self._head(True), "choices": [choice]}
        if include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, done: list[Done]) -> dict:
        """The last chunk with ``stream_options.include_usage``: no choices, the usage of every row."""
        return {**self._head(True), "choices": [], "usage": self.usage_of(done)}

    @staticmethod
    def usage_of(done: list[Done]) -> dict:
        """Usage summed over the rows (the prompt counted once, as OpenAI counts ``n``)."""
        prompt = done[0].prompt_tokens if done else 0
        return usage(prompt, sum(d.completion_tokens for d in done))

    def body(self, pieces: dict[int, list[Piece]], done: list[Done]) -> dict:
        """The whole (non-streamed) response: one choice per row, in index order; a row that
        ended in ``error`` carries ``"error": {"message", "type": "server_error", ...}`` beside
        its ``finish_reason`` (so do streamed rows' last chunks), the other rows are as ever."""
        choices = []
        for d in sorted(done, key=lambda d: d.index):
            rows = pieces.get(d.index, [])
            text = "".join(p.text for p in rows)
            choice: dict[str, Any] = {"index": d.index}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["logprobs"] = self.logprobs_of(rows)
            choice["finish_reason"] = d.finish_reason
            if d.finish_reason == "error":
                choice["error"] = error_body(d.message, None, "server_error")["error"]
            choices.append(choice)
        return {**self._head(False), "choices": choices, "usage": self.usage_of(done)}
