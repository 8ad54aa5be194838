"""The served engine through the openai client: completions and chat, streamed and not, the
fields that map onto Request, and the shapes benchmark clients read (usage in the last chunk)."""

from __future__ import annotations

import httpx
import pytest

import workbench as wb

from .conftest import strict_json, strict_stream

PROMPT = "def add(a, b):"


def alone(bundled, **fields) -> tuple[list[int], str, str]:
    """(tokens, text, finish reason) of one request run alone on a fresh scheduler."""
    sched = wb.Scheduler(*bundled)
    uid = sched.submit(wb.Request(**fields))
    sched.run()
    return sched.tokens(uid), sched.text(uid), sched.finish_reason(uid)


def test_a_completion_is_the_requests_text_alone_with_its_usage(client, bundled):
    out = client.completions.create(model="any", prompt=PROMPT, max_tokens=12, temperature=0)
    tokens, text, reason = alone(bundled, prompt=PROMPT, max_tokens=12)
    assert out.object == "text_completion" and out.choices[0].text == text
    assert out.choices[0].finish_reason == reason == "length"
    prompt_tokens = len(bundled[1].encode(PROMPT))
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (prompt_tokens, len(tokens))
    assert out.usage.total_tokens == prompt_tokens + len(tokens)


def test_a_streamed_completion_joins_to_the_same_text_and_ends_with_usage(client, bundled):
    chunks = list(
        client.completions.create(
            model="any",
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    _, text, _ = alone(bundled, prompt=PROMPT, max_tokens=12)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # streamed, not one blob


def test_chat_streams_role_then_pieces_that_join_to_the_chat_prompts_text(client, bundled):
    from mlx_lm.server import convert_chat

    messages = [{"role": "user", "content": "import os"}]
    stream = client.chat.completions.create(model="any", messages=messages, max_tokens=10, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    # the bundled model has no chat template: messages become mlx_lm.server's plain-text prompt
    assert text == alone(bundled, prompt=convert_chat(messages), max_tokens=10)[1]
    whole = client.chat.completions.create(model="any", messages=messages, max_tokens=10)
    assert whole.object == "chat.completion" and whole.choices[0].message.content == text


def test_chat_logprobs_are_the_engines_with_top_k_best_first(client, bundled):
    out = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "x"}], max_tokens=5, logprobs=True, top_logprobs=3
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy: the argmax


def test_completion_logprobs_use_the_legacy_shape(client):
    out = client.completions.create(model="any", prompt=PROMPT, max_tokens=4, logprobs=2)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == out.choices[0].text
    assert all(len(top) <= 2 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0


def test_n_samples_with_a_seed_are_each_samples_request_alone(client, bundled):
    out = client.completions.create(model="any", prompt=PROMPT, max_tokens=8, temperature=0.9, seed=7, n=3)
    texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
    assert texts == [
        alone(bundled, prompt=PROMPT, max_tokens=8, temperature=0.9, seed=7 + i)[1] for i in range(3)
    ]
    assert out.usage.completion_tokens == 24


def test_stop_strings_and_ignore_eos_and_min_tokens(client, bundled):
    base = alone(bundled, prompt=PROMPT, max_tokens=12)[1]
    stop = base[4:7]
    out = client.completions.create(model="any", prompt=PROMPT, max_tokens=12, stop=[stop])
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == base[: base.index(stop)]
    eos = next(iter(bundled[1].eos_token_ids))
    bias = {str(eos): 100.0}  # EOS first, unless barred
    first = client.completions.create(model="any", prompt=PROMPT, max_tokens=6, logit_bias=bias)
    assert (first.usage.completion_tokens, first.choices[0].finish_reason) == (1, "stop")
    body = {"ignore_eos": True}
    barred = client.completions.create(
        model="any", prompt=PROMPT, max_tokens=6, logit_bias=bias, extra_body=body
    )
    assert (barred.usage.completion_tokens, barred.choices[0].finish_reason) == (6, "length")
    late = client.completions.create(
        model="any", prompt=PROMPT, max_tokens=9, logit_bias=bias, extra_body={"min_tokens": 4}
    )
    assert (late.usage.completion_tokens, late.choices[0].finish_reason) == (5, "stop")  # 4 barred, then EOS


def test_response_format_json_schema_gives_valid_json(client):
    import json

    pytest.importorskip("llguidance", reason="the structured extra")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    out = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
    )
    assert isinstance(json.loads(out.choices[0].message.content)["a"], int)


@pytest.mark.parametrize("chat", [False, True])
def test_a_constrained_answer_with_logprobs_is_strict_json_without_forbidden_tokens(server, chat):
    """The grammar sets forbidden tokens to -inf: they are left out of top_logprobs, so the
    body and every streamed chunk are strict JSON (issue 41, attack s5: HTTP 500, -Infinity)."""
    pytest.importorskip("llguidance", reason="the structured extra")
    body: dict = {"max_tokens": 12, "response_format": {"type": "json_object"}}
    if chat:
        url = f"{server.url}/chat/completions"
        body |= {"messages": [{"role": "user", "content": "JSON"}], "logprobs": True, "top_logprobs": 5}
    else:
        url = f"{server.url}/completions"
        body |= {"prompt": "Give JSON: ", "logprobs": 5}
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 200, r.text[:300]
    logprobs = strict_json(r.text)["choices"][0]["logprobs"]
    tops = (
        [[e["logprob"] for e in c["top_logprobs"]] for c in logprobs["content"]]
        if chat
        else [list(t.values()) for t in logprobs["top_logprobs"]]
    )
    assert tops and all(len(t) <= 5 for t in tops)
    assert any(len(t) < 5 for t in tops), "the grammar allows fewer than 5 tokens somewhere"
    chunks = strict_stream(url, body)
    assert len(chunks) > 1


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [server.model_id]
    assert httpx.get(server.url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
