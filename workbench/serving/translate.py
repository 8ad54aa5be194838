"""OpenAI request bodies to workbench :class:`~workbench.engine.request.Request` s.

Knows: the fields of OpenAI's ``/v1/chat/completions`` and ``/v1/completions`` bodies, the
extras benchmark clients send (vLLM's ``ignore_eos``, ``min_tokens``, ``top_k``, ``min_p``,
``repetition_penalty``, ``priority``), and which :class:`Request` field each one becomes. Must not know:
the scheduler, HTTP, threads.

Only the shape of a field is checked here (a bool where a bool belongs, a dict where a dict
does); its limits are :func:`workbench.engine.request.validate`'s, run by the scheduler's
``submit``, so a served request and a notebook's are refused by the same words::

    {"max_tokens": 0}          -> BadField("max_tokens", "max_tokens must be an int >= 1, got 0")
    {"stream": "yes"}          -> BadField("stream", "stream must be a bool, got 'yes'")
    {"frobnicate": 1}          -> BadField("frobnicate", "unknown field 'frobnicate'; ...")

Fields mapped (OpenAI -> ``Request``): ``prompt`` / ``messages``, ``max_tokens`` (or
``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``, ``stop``,
``presence_penalty``, ``frequency_penalty``, ``logit_bias`` (string keys -> int ids), chat's
``logprobs`` + ``top_logprobs`` and completions' ``logprobs: k`` -> ``top_logprobs``,
``response_format`` (``json_schema`` -> ``json_schema``; ``json_object`` -> the schema
``{"type": "object"}``), ``ignore_eos: true`` -> ``stop_ids=[]`` (only ``max_tokens`` and
``stop`` end the row), ``min_tokens`` -> a logits processor that bars the EOS ids until that
many tokens were generated. ``n`` is ``Scheduler.submit_n``'s. Defaults follow
``mlx_lm.server``: ``temperature`` 0 (greedy), ``max_tokens`` the server's default (capped
at the model's context left after the prompt).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ..engine.request import MAX_TOP_LOGPROBS, Request
from ..engine.siblings import MAX_SAMPLES

# Fields accepted and not used (they change nothing in the engine's output).
IGNORED = frozenset({"model", "user", "metadata", "store", "service_tier", "parallel_tool_calls"})
COMMON = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "n",
        "stream",
        "stream_options",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "logprobs",
        "response_format",
        "ignore_eos",
        "min_tokens",
        "priority",
    }
)
CHAT = COMMON | {"messages", "top_logprobs", "max_completion_tokens"}
COMPLETIONS = COMMON | {"prompt", "echo", "best_of", "suffix"}


# The field a refusal's message starts with: ``max_tokens must ...``, ``Request: the field 'prompt' ...``,
# ``messages[0].content must ...``, ``stop[1] must ...`` (-> ``stop``), ``submit_n: n must ...`` (-> ``n``).
_FIELD = re.compile(r"^(?:Request: |submit_n: )?(?:the field )?'?([a-z_]+(?:\[\d+\]\.[a-z_]+)?)")


def field_of(message: str) -> str | None:
    """The field a refusal's ``message`` names first (``None`` if it names none): the words of
    :func:`workbench.engine.request.validate` start with the field, e.g.
    ``field_of("top_k must be an int >= 0, got -1") == "top_k"``. mlx-lm: none."""
    match = _FIELD.match(message)
    return match.group(1) if match else None


class BadField(ValueError):
    """A request body's field that cannot be served: ``field`` names it (``"body"`` for the
    body as a whole), the message says why and the limit. HTTP 400."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass
class Prepared:
    """A translated body: the ``request`` to submit ``n`` times (``Scheduler.submit_n``),
    whether to ``stream`` and to send ``usage`` in the last chunk (``include_usage``),
    whether to return log-probs (``logprobs``), ``min_tokens`` (the processor in
    ``request.logits_processors``; it needs the prompt length: :meth:`MinTokens.bind`), and
    whether ``max_tokens`` is the server's default (``default_max_tokens``: the engine thread
    then caps it at the context left after the prompt, as OpenAI's default is), and ``names``:
    the body's field of each :class:`Request` field named otherwise (``{"json_schema":
    "response_format"}``; chat's ``prompt`` is ``messages``), read by :meth:`field`."""

    request: Request
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    min_tokens: MinTokens | None = None
    default_max_tokens: bool = False
    names: dict[str, str] = dataclasses.field(default_factory=dict)

    def field(self, name: str) -> str:
        """The body's field that became :class:`Request` field ``name`` (a refusal at submit
        names the field the client sent: ``"top_logprobs"`` is completions' ``"logprobs"``)."""
        return self.names.get(name, name)


class MinTokens:
    """A logits processor ``(tokens [T], logits [1, V]) -> logits`` that sets the EOS ids'
    logits to ``-inf`` while fewer than ``n`` tokens follow the prompt (vLLM's
    ``min_tokens``). ``tokens`` is the row's prompt plus its generated tokens, so the
    prompt length (:meth:`bind`, set at submit) tells how many were generated."""

    def __init__(self, n: int, eos_ids: list[int]):
        self.n, self.eos_ids, self.prompt_tokens = n, sorted(eos_ids), None

    def bind(self, prompt_tokens: int) -> None:
        """Set the prompt length (tokens) of the rows it serves (all samples of one body share it)."""
        self.prompt_tokens = prompt_tokens

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        if self.prompt_tokens is None or len(tokens) - self.prompt_tokens >= self.n or not self.eos_ids:
            return logits
        barred = mx.zeros((logits.shape[-1],), dtype=mx.bool_)
        barred[mx.array(self.eos_ids)] = True
        return mx.where(barred, mx.array(-float("inf"), dtype=logits.dtype), logits)


def _bool(body: dict, name: str, default: bool = False, parent: str = "") -> bool:
    """``body[name]`` as a bool; a refusal names it by its path (``parent`` + ``name``:
    ``stream_options.include_usage``)."""
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadField(parent + name, f"{parent + name} must be a bool, got {value!r}")
    return value


def _int(body: dict, name: str, default: int, low: int, high: int | None = None) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high and value > high):
        limit = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise BadField(name, f"{name} must be an int {limit}, got {value!r}")
    return value


def _chat_messages(messages: Any) -> list[dict]:
    """OpenAI's messages with ``content`` as a str: text parts (``[{"type": "text",
    "text": ...}]``) joined; any other part is refused (no images here)."""
    if not isinstance(messages, list) or not messages:
        raise BadField(
            "messages", f"messages must be a non-empty list of {{role, content}}, got {messages!r}"
        )
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadField("messages", f"messages[{i}] must be an object with role and content, got {m!r}")
        if not isinstance(m.get("role"), str) or not m["role"]:
            raise BadField(
                f"messages[{i}].role", f"messages[{i}].role must be a non-empty str, got {m.get('role')!r}"
            )
        content = m.get("content")
        if isinstance(content, list) and not content:
            raise BadField(
                f"messages[{i}].content", f"messages[{i}].content must hold at least one text part"
            )
        if isinstance(content, list):
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise BadField(f"messages[{i}].content", "only text content parts are served")
            content = "".join(texts)
        if not isinstance(content, str):
            raise BadField(f"messages[{i}].content", f"messages[{i}].content must be a str, got {content!r}")
        out.append({"role": m.get("role"), "content": content})
    return out


def _response_format(value: Any) -> Any:
    """The ``json_schema`` of a ``response_format`` (``None`` for ``text``)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict | str):
            raise BadField(
                "response_format", "response_format.json_schema.schema must be a JSON schema object"
            )
        return schema
    raise BadField(
        "response_format",
        f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
    )


def _stream_options(options: Any, stream: bool) -> bool:
    """``include_usage`` of a ``stream_options`` (OpenAI's: an object or null, and only with
    ``stream: true``)."""
    if options is None:
        return False
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise BadField(
            "stream_options",
            f"stream_options must be an object {{'include_usage': bool}} or null, got {options!r}",
        )
    include_usage = _bool(options, "include_usage", parent="stream_options.")
    if _bool(options, "continuous_usage_stats", parent="stream_options."):
        raise BadField(
            "stream_options.continuous_usage_stats",
            "stream_options.continuous_usage_stats is not served (usage comes in the last chunk: include_usage)",
        )
    if not stream:
        raise BadField("stream_options", "stream_options is only allowed when stream is true (as OpenAI's)")
    return include_usage


_TOKEN_ID = re.compile(r"[0-9]+")  # ASCII digits only: int() also takes " 5", "5_0", "+5" and "٥"


def _logit_bias(value: Any) -> dict[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadField("logit_bias", f"logit_bias must be an object token id -> bias, got {value!r}")
    out = {}
    for key, bias in value.items():
        try:
            if not isinstance(key, str) or not _TOKEN_ID.fullmatch(key):
                raise ValueError
            out[int(key)] = bias
        except ValueError:  # not digits, or more digits than Python converts (4,300)
            raise BadField(
                "logit_bias", f"logit_bias key {key!r} must be a token id (an int >= 0 in ASCII digits)"
            ) from None
    return out


def _prompt(body: dict) -> Any:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # one prompt in a list: what clients send for a single prompt
    if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
        raise BadField(
            "prompt", "prompt must be a str or a list of token ids; one prompt per request is served"
        )
    return prompt


def translate(
    body: Any, chat: bool, eos_ids: list[int], default_max_tokens: int, chat_template: bool
) -> Prepared:
    """The :class:`Prepared` request of an OpenAI body.

    Args:
        body: the parsed JSON body (a dict).
        chat: ``/v1/chat/completions`` (``messages``) or ``/v1/completions`` (``prompt``).
        eos_ids: the tokenizer's EOS ids (for ``min_tokens``).
        default_max_tokens: ``max_tokens`` when the body sets none.
        chat_template: whether the tokenizer has a chat template; without one, ``messages``
            become a plain-text prompt by mlx-lm's ``convert_chat`` (as ``mlx_lm.server``).

    Raises:
        BadField: an unknown field, a field of the wrong type, or one not served (``echo``,
            ``suffix``, ``best_of`` other than ``n``; ``min_tokens`` with ``ignore_eos`` is served:
            no stop id to hold back, so it changes nothing).
            Limits (``max_tokens >= 1``, ``top_p`` in ``(0, 1]``, ...) are checked at submit.
    """
    if not isinstance(body, dict):
        raise BadField("body", f"the body must be a JSON object, got {type(body).__name__}")
    allowed = CHAT if chat else COMPLETIONS
    unknown = sorted(set(body) - allowed - IGNORED)
    if unknown:
        raise BadField(unknown[0], f"unknown field {unknown[0]!r}; served fields: {sorted(allowed)}")
    stream, n = _bool(body, "stream"), _int(body, "n", 1, 1, MAX_SAMPLES)
    include_usage = _stream_options(body.get("stream_options"), stream)
    fields: dict[str, Any] = {}
    names = {"json_schema": "response_format", "stop_ids": "ignore_eos", "logits_processors": "min_tokens"}
    if chat:
        if "messages" not in body:
            raise BadField("messages", "messages is required (a non-empty list of {role, content})")
        messages = _chat_messages(body["messages"])
        if chat_template:
            fields["messages"] = messages
        else:
            from mlx_lm.server import convert_chat

            fields["prompt"] = convert_chat(messages)
            names["prompt"] = "messages"
        logprobs = _bool(body, "logprobs")
        top = _int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
        if top and not logprobs:
            raise BadField("top_logprobs", "top_logprobs needs logprobs: true")
        fields["top_logprobs"] = top
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        else:
            names["max_tokens"] = "max_completion_tokens"
        for name in ("max_completion_tokens", "max_tokens"):  # both checked: neither is silently dropped
            if body.get(name) is not None:
                _int(body, name, 1, 1)  # the field the client sent, named
    else:
        if body.get("prompt") is None:
            raise BadField("prompt", "prompt is required (a str or a list of token ids)")
        fields["prompt"] = _prompt(body)
        for name in ("echo", "suffix"):
            if body.get(name):
                raise BadField(name, f"{name} is not served (a generation returns only its new text)")
        if body.get("best_of") not in (None, 1, n):
            raise BadField("best_of", f"best_of must equal n ({n}) or be left out, got {body['best_of']!r}")
        k = body.get("logprobs")
        logprobs = k is not None and k is not False
        fields["top_logprobs"] = 0 if not logprobs else _int(body, "logprobs", 0, 0, MAX_TOP_LOGPROBS)
        names["top_logprobs"] = "logprobs"
        max_tokens = body.get("max_tokens")
    fields["max_tokens"] = default_max_tokens if max_tokens is None else max_tokens
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "repetition_penalty", "priority"):
        if body.get(name) is not None:
            fields[name] = body[name]
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) is not None:
            fields[name] = body[name]
    fields["logit_bias"] = _logit_bias(body.get("logit_bias"))
    schema = _response_format(body.get("response_format"))
    if schema is not None:
        fields["json_schema"] = schema
    if _bool(body, "ignore_eos"):
        fields["stop_ids"] = []
    min_tokens = None
    k = _int(body, "min_tokens", 0, 0)
    if k:
        min_tokens = MinTokens(k, [] if _bool(body, "ignore_eos") else list(eos_ids))
        fields["logits_processors"] = [min_tokens]
    try:
        request = Request(**fields)
    except ValueError as exc:
        name = field_of(str(exc)) or "body"
        raise BadField(names.get(name, name), str(exc)) from None
    return Prepared(request, n, stream, include_usage, logprobs, min_tokens, max_tokens is None, names)
