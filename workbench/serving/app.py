"""The HTTP routes: an ASGI app (Starlette) in front of the :class:`EngineThread`.

Knows: the endpoints, status codes, server-sent events, client disconnects. Must not know:
the scheduler's internals (it only hands :class:`Submit` / abort commands to the thread).

======================  ==========================================================
``POST /v1/chat/completions``  chat turns through the tokenizer's chat template
``POST /v1/completions``       a text or token-id prompt
``GET /v1/models``             the served model
``GET /health``                ``{"status": "ok"}`` (and ``last_fault``: an engine call's error)
``GET /metrics``               Prometheus text (:mod:`workbench.serving.metrics`)
======================  ==========================================================

Status codes: 400 a bad field (OpenAI's error body; ``param`` names the field, the message
its limit: the same words as ``Request`` validation); 413 a request the KV budget or the
model's context can never hold; 429 the queue is full (``max_queued``); 501 ``response_format``
without the ``structured`` extra. An engine call that raises (the scheduler is then as before
it) ends the live rows with finish reason ``error``. A client that disconnects (mid-stream or
while waiting for a whole body) has its rows aborted: they finish ``abort`` and the next ``filter()`` frees their KV;
one that disconnects while sending its request body reaches no engine and logs nothing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .engine import Busy, Done, EngineThread, Piece, Submit
from .metrics import EngineMetrics
from .responses import Shaper, error_body, sse
from .translate import BadField, Prepared, field_of, translate

TOO_LARGE = ("could never be admitted", "exceeds the model's context")  # the KV budget's, the context's


class Disconnected(Exception):
    """The client closed its connection."""


def refusal(exc: Exception) -> JSONResponse:
    """The HTTP response of a refused request: 400 / 413 / 429 / 501 with OpenAI's error body,
    ``param`` the body's field (a :class:`BadField`'s ``field``; else the field the message
    starts with). mlx-lm: none."""
    message = str(exc)
    if isinstance(exc, Busy):
        return JSONResponse(error_body(message, None, "rate_limit_exceeded"), 429)
    if isinstance(exc, ImportError):  # response_format without the structured extra
        return JSONResponse(error_body(message, "response_format", "not_implemented"), 501)
    field = exc.field if isinstance(exc, BadField) else field_of(message)
    if any(t in message for t in TOO_LARGE):
        return JSONResponse(error_body(message, field, "request_too_large"), 413)
    return JSONResponse(error_body(message, field), 400)


class Feed:
    """One request's outbox read on the server's loop, racing the client's disconnect."""

    def __init__(self, http: HTTPRequest, engine: EngineThread, prepared: Prepared):
        self.http, self.engine, self.prepared = http, engine, prepared
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.uids: list[int] = []
        self.open = set(range(prepared.n))
        self.gone = asyncio.ensure_future(self._disconnect())

    async def _disconnect(self) -> None:
        while (await self.http.receive())["type"] != "http.disconnect":
            pass

    async def start(self) -> None:
        """Submit to the engine; raises what ``submit_n`` raised (the refusal)."""
        command = Submit(self.prepared, asyncio.get_running_loop(), self.outbox)
        self.engine.submit(command)
        self.uids = await asyncio.wrap_future(command.uids)

    async def next(self) -> Piece | Done:
        """The next item of any row; raises :class:`Disconnected` if the client left first."""
        get = asyncio.ensure_future(self.outbox.get())
        await asyncio.wait({get, self.gone}, return_when=asyncio.FIRST_COMPLETED)
        if not get.done():
            get.cancel()
            raise Disconnected
        item = get.result()
        if isinstance(item, Done):
            self.open.discard(item.index)
        return item

    def close(self) -> None:
        """Abort the rows still open (the client left, or the handler ended early)."""
        self.gone.cancel()
        if self.open and self.uids:
            self.engine.abort([self.uids[i] for i in sorted(self.open)])


class SSEResponse(Response):
    """A server-sent-event stream of one :class:`Feed` (``text/event-stream``); a client that
    disconnects aborts the rows still open."""

    media_type = "text/event-stream"

    def __init__(self, feed: Feed, shaper: Shaper):
        self.status_code, self.background, self.feed, self.shaper = 200, None, feed, shaper
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        feed, shaper, usage_on = self.feed, self.shaper, self.feed.prepared.include_usage
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        started, sent_chars, done = set(), {}, []
        try:
            while feed.open:
                item = await feed.next()
                if isinstance(item, Done):
                    done.append(item)
                chunk = shaper.chunk(item, item.index not in started, usage_on, sent_chars.get(item.index, 0))
                started.add(item.index)
                if isinstance(item, Piece):
                    sent_chars[item.index] = sent_chars.get(item.index, 0) + len(item.text)
                await send({"type": "http.response.body", "body": sse(chunk).encode(), "more_body": True})
            tail = (sse(shaper.usage_chunk(done)) if usage_on else "") + sse("[DONE]")
            await send({"type": "http.response.body", "body": tail.encode(), "more_body": False})
        except (Disconnected, OSError):
            pass
        finally:
            feed.close()


def build_app(
    engine: EngineThread, metrics: EngineMetrics, model_id: str, default_max_tokens: int
) -> Starlette:
    """The Starlette app serving ``engine`` as ``model_id``."""
    tokenizer = engine.sched.tokenizer
    eos_ids = sorted(tokenizer.eos_token_ids)
    chat_template = bool(getattr(tokenizer, "has_chat_template", False))

    async def generate(http: HTTPRequest, chat: bool) -> Response:
        try:
            body = json.loads(await http.body() or b"null")
        except ClientDisconnect:  # the client left while sending its body: nothing to answer, nothing to log
            return Response(status_code=499)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # not JSON, or not UTF-8/16/32 text
            return refusal(BadField("body", f"the body is not valid JSON: {exc}"))
        except ValueError as exc:  # an int of more digits than Python converts (4,300)
            return refusal(BadField("body", f"the body's JSON cannot be read: {exc}"))
        except RecursionError:
            return refusal(BadField("body", "the body's JSON nests too deeply to parse"))
        try:
            prepared = translate(body, chat, eos_ids, default_max_tokens, chat_template)
        except BadField as exc:
            return refusal(exc)
        shaper = Shaper(chat, model_id, tokenizer.decode, prepared.logprobs)
        feed = Feed(http, engine, prepared)
        try:
            await feed.start()
        except Exception as exc:  # the engine's refusal: ValueError naming the field, Busy, ImportError
            feed.close()
            return refusal(exc)
        if prepared.stream:
            return SSEResponse(feed, shaper)
        pieces: dict[int, list[Piece]] = {}
        done: list[Done] = []
        try:
            while feed.open:
                item = await feed.next()
                if isinstance(item, Piece):
                    pieces.setdefault(item.index, []).append(item)
                else:
                    done.append(item)
        except Disconnected:
            return Response(status_code=499)
        finally:
            feed.close()
        return JSONResponse(shaper.body(pieces, done))

    async def chat_completions(http: HTTPRequest) -> Response:
        return await generate(http, chat=True)

    async def completions(http: HTTPRequest) -> Response:
        return await generate(http, chat=False)

    async def models(http: HTTPRequest) -> Response:
        entry = {"id": model_id, "object": "model", "created": 0, "owned_by": "workbench"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def health(http: HTTPRequest) -> Response:
        return JSONResponse({"status": "ok", **({"last_fault": engine.fault} if engine.fault else {})})

    async def prometheus(http: HTTPRequest) -> Response:
        return Response(metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
        ]
    )
