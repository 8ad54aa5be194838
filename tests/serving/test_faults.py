"""Attacks on the served engine: bad fields (400 naming the field and its limit), requests over
the budget (413) or the queue (429), clients that disconnect (their row aborted, its KV freed,
the others untouched), 200 concurrent streams (each greedy answer equal to the request alone)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest

import workbench as wb
from workbench.serving.app import refusal
from workbench.serving.engine import Busy, Done
from workbench.serving.responses import Shaper
from workbench.serving.translate import BadField

from .conftest import wait_until

PROMPT = "def add(a, b):"


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens", ">= 1"),
        ({"prompt": PROMPT, "temperature": -1}, "temperature", ">= 0"),
        ({"prompt": PROMPT, "temperature": 1, "top_p": 1.5}, "top_p", "(0, 1]"),
        ({"prompt": PROMPT, "logprobs": 21}, "logprobs", "[0, 20]"),
        ({"prompt": PROMPT, "n": 5000}, "n", "[1, 1024]"),
        ({"prompt": PROMPT, "frequency_penalty": -1e300}, "frequency_penalty", "[-2, 2]"),
        ({"prompt": PROMPT, "presence_penalty": 3}, "presence_penalty", "[-2, 2]"),
        (
            {"prompt": PROMPT, "stream": True, "stream_options": {"continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
            "not served",
        ),
        ({"prompt": PROMPT, "priority": 5}, "priority", "policy 'fcfs'"),
        ({"prompt": PROMPT, "stop": [""]}, "stop", "non-empty"),
        ({"prompt": PROMPT, "seed": -3}, "seed", ">= 0"),
        ({"prompt": PROMPT, "n": 0}, "n", "[1, 1024]"),
        ({"prompt": PROMPT, "stream": "yes"}, "stream", "bool"),
        ({"prompt": [10**9]}, "prompt", "outside the vocabulary [0, 4096)"),
        ({"prompt": PROMPT, "logit_bias": {"x": 1}}, "logit_bias", "token id"),
        ({"prompt": PROMPT, "frobnicate": 1}, "frobnicate", "unknown field"),
        ({"prompt": PROMPT, "echo": True}, "echo", "not served"),
        ({"max_tokens": 3}, "prompt", "required"),
        ({"prompt": "ab\ud800", "max_tokens": 2}, "prompt", "valid Unicode text: a lone surrogate"),
        ({"prompt": PROMPT, "response_format": {"type": "xml"}}, "response_format", "json_schema"),
        # A break-it pass (2026-12-08): a lone surrogate in a field's name was HTTP 500 (its param unencodable).
        ({"prompt": PROMPT, "max_tokens": 2, "\ud800": 1}, "\\ud800", "unknown field '\\ud800'"),
        ({"prompt": PROMPT, "stop": ["ok", "\ud800"]}, "stop", "stop[1] must be valid Unicode text"),
        # An int beyond float's range was 400 with param "int" ("int too large to convert to float").
        ({"prompt": PROMPT, "temperature": 10**400}, "temperature", ">= 0, got an int of 401 digits"),
        ({"prompt": PROMPT, "temperature": 1, "top_p": 10**400}, "top_p", "(0, 1], got an int of 401"),
        ({"prompt": PROMPT, "temperature": 1, "min_p": 10**400}, "min_p", "[0, 1), got an int of 401"),
        ({"prompt": PROMPT, "presence_penalty": -(10**400)}, "presence_penalty", "got a negative int of 401"),
        ({"prompt": PROMPT, "frequency_penalty": 10**400}, "frequency_penalty", "[-2, 2]"),
        ({"prompt": PROMPT, "repetition_penalty": 10**400}, "repetition_penalty", "[0.01, 100]"),
        ({"prompt": PROMPT, "logit_bias": {"5": 10**400}}, "logit_bias", "[-100, 100]"),
        # stream_options is an object or null, and only with stream: true (OpenAI's); falsy ones passed.
        *[
            ({"prompt": PROMPT, "stream": True, "stream_options": v}, "stream_options", "an object")
            for v in ([], 0, False, "")
        ],
        (
            {"prompt": PROMPT, "stream_options": {"include_usage": True}},
            "stream_options",
            "when stream is true",
        ),
        # logit_bias keys: ASCII digits only (int() took these).
        *[
            ({"prompt": PROMPT, "logit_bias": {k: 1}}, "logit_bias", "ASCII digits")
            for k in ("5_0", " 5", "+5", "-5", "\u0665")
        ],
    ],
)
def test_a_bad_field_is_400_naming_the_field_and_its_limit(server, body, field, words):
    content = json.dumps({"model": "m", **body})  # ASCII: a lone surrogate travels escaped, as JSON allows
    r = httpx.post(f"{server.url}/completions", content=content, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and words in error["message"], error
    assert server.sched.idle  # refused before it touched the engine


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"max_completion_tokens": 0}, "max_completion_tokens", ">= 1"),
        ({"top_logprobs": 50, "logprobs": True}, "top_logprobs", "[0, 20]"),
        ({"messages": [{"role": 5, "content": "hi"}]}, "messages[0].role", "non-empty str"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role", "non-empty str"),
        ({"messages": [{"role": "user", "content": []}]}, "messages[0].content", "at least one text part"),
        ({"max_completion_tokens": 3, "max_tokens": "a"}, "max_tokens", ">= 1"),  # not dropped silently
    ],
)
def test_a_bad_chat_field_is_400_naming_the_field_the_client_sent(server, body, field, words):
    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4, **body}
    r = httpx.post(f"{server.url}/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and words in error["message"], error
    assert server.sched.idle


CHAT = {"messages": [{"role": "user", "content": PROMPT}]}


@pytest.mark.parametrize(
    "chat, body, status, field",
    [
        (False, {"prompt": PROMPT, "max_tokens": 10**23}, 413, "max_tokens"),  # not the prompt
        (False, {"prompt": list(range(600)), "max_tokens": 2}, 413, "prompt"),  # the prompt alone is too long
        (True, {"max_completion_tokens": 10**23}, 413, "max_completion_tokens"),
        (True, {"max_completion_tokens": None, "max_tokens": 10**23}, 413, "max_tokens"),
        (False, {"prompt": PROMPT, "stream": True, "stream_options": {"include_usage": "y"}}, 400, None),
        (False, {"prompt": PROMPT, "stream_options": {"continuous_usage_stats": "y"}}, 400, None),
        (False, {"prompt": PROMPT, "top_k": 3}, 400, "top_k"),  # top_k with greedy decoding
        (False, {"prompt": PROMPT, "top_p": 0.5}, 400, "top_p"),
        (False, {"prompt": None, "max_tokens": 2}, 400, "prompt"),
        (False, {"prompt": PROMPT, "min_tokens": -1}, 400, "min_tokens"),
        (False, {"prompt": PROMPT, "seed": 1.5}, 400, "seed"),
        (False, {"prompt": PROMPT, "stop": ["a", ""]}, 400, "stop"),
        (False, {"prompt": PROMPT, "logit_bias": {"1": "a"}}, 400, "logit_bias"),
        (True, {"max_tokens": 2, "temperature": 1, "min_p": 3}, 400, "min_p"),
        (True, {"max_tokens": 2, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ],
)
def test_every_refusal_names_the_field_the_client_sent(server, chat, body, status, field):
    stream_options = body.get("stream_options", {})
    field = field or f"stream_options.{next(iter(stream_options))}"  # OpenAI's dotted path
    body = {"model": "m", **(CHAT if chat else {}), **body}
    r = httpx.post(f"{server.url}/{'chat/' if chat else ''}completions", content=json.dumps(body), timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == field, error
    assert server.sched.idle


def test_a_row_that_ended_in_error_carries_its_message_streamed_or_not():
    shaper = Shaper(chat=False, model="m", decode=lambda ids: "")
    done = [Done(0, "length", "", 3, 2), Done(1, "error", "non-finite logits at step 4", 3, 4)]
    body = shaper.body({0: [], 1: []}, done)
    ok, bad = body["choices"]
    assert "error" not in ok and ok["finish_reason"] == "length"
    assert bad["finish_reason"] == "error"
    assert bad["error"]["message"] == "non-finite logits at step 4" and bad["error"]["type"] == "server_error"
    chunk = shaper.chunk(done[1], first=False, include_usage=False)
    assert chunk["choices"][0]["error"]["message"] == "non-finite logits at step 4"


def test_bad_json_and_a_bad_chat_message_are_400(server):
    r = httpx.post(f"{server.url}/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    r = httpx.post(f"{server.url}/chat/completions", json={"messages": [{"role": "user", "content": 3}]})
    assert r.status_code == 400 and "messages[0]" in r.json()["error"]["message"]


def test_over_the_kv_budget_or_the_context_is_413_and_a_full_queue_429(bundled):
    sched = wb.Scheduler(*bundled, kv_budget_bytes=1_000_000)  # 256 tokens of KV: 655,360 bytes
    with wb.serve(sched, port=0, max_queued=2) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="-", max_retries=0, timeout=60)
        with pytest.raises(openai.APIStatusError) as big:
            client.completions.create(model="m", prompt=PROMPT, max_tokens=400)
        assert big.value.status_code == 413 and "kv_budget_bytes" in big.value.message
        assert big.value.body["param"] == "max_tokens"  # the prompt alone would fit
        with pytest.raises(openai.APIStatusError) as long:
            client.completions.create(model="m", prompt=PROMPT, max_tokens=600)
        assert long.value.status_code == 413 and "context of 512 tokens" in long.value.message
        with pytest.raises(openai.BadRequestError) as never:  # no retry could take it: 400, not 429
            client.completions.create(model="m", prompt=PROMPT, max_tokens=4, n=3)
        assert (
            never.value.body["param"] == "n"
            and "queues at most 2 requests (max_queued)" in never.value.message
        )
        ok = client.completions.create(model="m", prompt=PROMPT, max_tokens=4, n=2)
        assert len(ok.choices) == 2  # the server goes on


@pytest.mark.parametrize("port", [70000, -1, "8000", True, np.int64(70000), np.bool_(True), 80.0])
def test_wb_serve_refuses_a_port_outside_0_65535_before_it_starts(bundled, port):
    with pytest.raises(ValueError, match=r"port must be an int in \[0, 65535\] \(0: a free one\), got "):
        wb.serve(wb.Scheduler(*bundled), port=port)


def test_wb_serve_takes_a_numpy_int_port_as_scheduler_config_takes_numpy_ints(bundled):
    """A break-it pass (2026-12-08): ``port=np.int64(8000)`` was refused."""
    with wb.serve(wb.Scheduler(*bundled), port=np.int64(0)) as srv:
        assert type(srv.port) is int and srv.port > 0
        assert httpx.get(f"{srv.url.removesuffix('/v1')}/health", timeout=30).status_code == 200


def test_a_full_queue_is_429_retry_later(bundled):
    sched = wb.Scheduler(*bundled, max_batch=1)
    with wb.serve(sched, port=0, max_queued=1) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="-", max_retries=0, timeout=60)
        running = client.completions.create(model="m", prompt=PROMPT, max_tokens=400, stream=True, stop=[])
        next(iter(running))  # the one row decodes
        waiting = threading.Thread(
            target=lambda: client.completions.create(model="m", prompt=PROMPT, max_tokens=2), daemon=True
        )
        waiting.start()
        wait_until(lambda: len(sched.queue) == 1, what="a request waiting in the queue")
        with pytest.raises(openai.RateLimitError) as busy:
            client.completions.create(model="m", prompt=PROMPT, max_tokens=2)
        assert "the queue holds 1 requests and max_queued is 1; retry later" in busy.value.message
        running.close()
        waiting.join(60)


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\xff\xfe{", "not valid JSON"),  # UTF-16 by its BOM, then not
        (b'{"prompt":"\xff","max_tokens":2}', "not valid JSON"),  # not UTF-8
        (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
        (b'{"prompt": "x", "max_tokens": ' + b"1" * 5000 + b"}", "Exceeds the limit (4300 digits)"),  # a 500
    ],
)
def test_a_body_not_utf8_or_nested_too_deep_is_400_not_500(server, content, words):
    r = httpx.post(f"{server.url}/completions", content=content, timeout=30)
    assert (
        r.status_code == 400
        and r.json()["error"]["param"] == "body"
        and words in r.json()["error"]["message"]
    )
    assert httpx.get(f"{server.url.removesuffix('/v1')}/health", timeout=30).status_code == 200


def test_a_chat_templates_refusal_is_400_naming_messages(bundled, refusing_tokenizer):
    """A break-it pass (2026-12-08): a template's raise_exception was 400 naming ``bad`` (the message's first
    word) or nothing; a role with a lone surrogate, which the message would echo, is refused before it."""
    chat = [
        ([{"role": "bot", "content": "hi"}], "messages", "the chat template refuses them: bad role bot"),
        ([{"role": "assistant", "content": "hi"}], "messages", "Conversation roles must alternate"),
        ([{"role": "\ud800", "content": "hi"}], "messages[0].role", "a lone surrogate '\\ud800'"),
    ]
    with wb.serve(wb.Scheduler(bundled[0], refusing_tokenizer), port=0) as srv:
        for messages, field, words in chat:
            content = json.dumps({"model": "m", "messages": messages, "max_tokens": 2})
            r = httpx.post(f"{srv.url}/chat/completions", content=content, timeout=30)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == field and words in r.json()["error"]["message"], r.json()
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        ok = httpx.post(f"{srv.url}/chat/completions", json=body, timeout=30)
        assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    "exc, field",
    [
        (BadField("\udfff", "unknown field \udfff"), "\\udfff"),
        (ValueError("messages: the chat template refuses them: bad role \ud800"), "messages"),
        (Busy("queue \ud800"), None),
    ],
)
def test_a_refusals_text_with_a_lone_surrogate_is_escaped_not_a_500(exc, field):
    """The error body is rendered whatever its text echoes (a lone surrogate has no UTF-8 form)."""
    error = json.loads(refusal(exc).body)["error"]
    assert error["param"] == field and "\\ud" in error["message"], error  # the escape, six characters
    error["message"].encode("utf-8")  # no lone surrogate left


@pytest.mark.skipif(importlib.util.find_spec("llguidance") is None, reason="needs the structured extra")
def test_a_lone_surrogate_in_a_json_schema_is_400_naming_response_format(server):
    """A break-it pass (2026-12-08): llguidance's message (``unexpected end of hex escape``) gave param
    ``unexpected``."""
    schema = {"type": "object", "properties": {"\ud800": {"type": "string"}}}
    body = {"prompt": PROMPT, "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    r = httpx.post(f"{server.url}/completions", content=json.dumps(body), timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (
        error["param"] == "response_format" and "json_schema must be valid Unicode text" in error["message"]
    )


def test_a_string_seed_with_n_is_400_naming_seed(server):
    r = httpx.post(f"{server.url}/completions", json={"prompt": PROMPT, "max_tokens": 2, "n": 2, "seed": "1"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.json()


def _stream_then_hang_up(url: str, body: dict, chunks: int) -> None:
    with httpx.Client(timeout=30) as h, h.stream("POST", url, json=body) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: {")
            if seen >= chunks:
                return  # closes the connection mid-stream


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_aborts_only_its_row_and_frees_its_kv(server, client, stream):
    sched = server.sched
    known = set(sched.requests)
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 480, "stream": stream}
    other = asyncio.run(_other_beside(server, body, stream, known))
    gone = [u for u in set(sched.requests) - known if sched.requests[u].finish_reason == "abort"]
    assert len(gone) == 1, {u: sched.requests[u].finish_reason for u in set(sched.requests) - known}
    assert 0 < len(sched.tokens(gone[0])) < 480
    assert other.usage.completion_tokens == 20 and other.choices[0].finish_reason == "length"
    wait_until(lambda: sched.idle and sched.batch_cache is None, what="the aborted row's eviction")
    assert not sched.requests[gone[0]].finished or sched.requests[gone[0]].evicted


async def _other_beside(server, body, stream, known):
    """Start a request beside one whose client hangs up (mid-stream, or while waiting for its
    whole body); returns the other's completion."""
    client = openai.AsyncOpenAI(base_url=server.url, api_key="-", max_retries=0, timeout=60)
    other = asyncio.create_task(client.completions.create(model="m", prompt="import os", max_tokens=20))
    if stream:
        await asyncio.to_thread(_stream_then_hang_up, f"{server.url}/completions", body, 3)
    else:
        async with httpx.AsyncClient(timeout=30) as h:  # leaving it closes the connection
            task = asyncio.create_task(h.post(f"{server.url}/completions", json=body))
            sched = server.sched

            def started() -> bool:  # the hanging-up request is decoding
                new = [sched.requests[u] for u in list(sched.requests) if u not in known]
                return any(s.valid.request.max_tokens == 480 and len(s.tokens) > 2 for s in new)

            await asyncio.to_thread(wait_until, started)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    await asyncio.to_thread(wait_until, lambda: server.sched.idle, 60, "the engine to go idle")
    return await other


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_client_that_leaves_while_sending_its_body_ends_quietly_without_a_traceback(server, path):
    """A break-it pass (2026-12-07): a client that hung up mid-body left ``Exception in ASGI
    application`` and starlette's ``ClientDisconnect`` traceback in the server's log."""
    logged: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = logged.append
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with socket.create_connection((server.host, server.port), timeout=30) as s:
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            s.sendall(head.encode() + b'{"prompt": "def add')  # 1000 bytes announced, 19 sent
            wait_until(lambda: server._uvicorn.server_state.tasks, what="the handler reading the body")
        wait_until(lambda: not server._uvicorn.server_state.tasks, what="the handler to end")
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert not [r for r in logged if r.exc_info or r.levelno >= logging.ERROR], [
        r.getMessage() for r in logged
    ]
    assert (
        server.sched.idle
        and httpx.get(f"{server.url.removesuffix('/v1')}/health", timeout=30).status_code == 200
    )


PROMPTS = [f"def f{i}(x):\n    return x + {i}" for i in range(20)]


@pytest.mark.slow
def test_200_concurrent_streams_each_equal_the_request_alone(server, client):
    solo = {p: client.completions.create(model="m", prompt=p, max_tokens=8).choices[0].text for p in PROMPTS}

    async def one(c, p):
        stream = await c.completions.create(model="m", prompt=p, max_tokens=8, stream=True)
        return p, "".join([ch.choices[0].text async for ch in stream if ch.choices])

    async def all_at_once():
        c = openai.AsyncOpenAI(base_url=server.url, api_key="-", max_retries=0, timeout=120)
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(c, PROMPTS[i % 20]) for i in range(200))), 180)
        finally:
            await c.close()

    before = len(server.sched.requests)
    t0 = time.monotonic()
    results = asyncio.run(all_at_once())
    assert len(results) == 200
    assert [text for p, text in results] == [solo[p] for p, _ in results]
    assert len(server.sched.requests) - before == 200 and server.sched.idle
    wait_until(lambda: server.connections == 0, 30, "every connection to close")  # none left hanging
    assert time.monotonic() - t0 < 180


def test_ctrl_c_stops_workbench_serve_in_one_line_exit_130():
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as tests/test_cli.py says why
    )
    line = proc.stdout.readline().decode() + proc.stdout.readline().decode()
    assert "(Ctrl-C stops)" in line, line + proc.stderr.read().decode()
    url = line.split(" on ")[-1].split()[0]
    assert httpx.get(url.removesuffix("/v1") + "/health", timeout=30).json()["status"] == "ok"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert err.decode().strip().splitlines() == ["workbench serve: interrupted (Ctrl-C)"]
