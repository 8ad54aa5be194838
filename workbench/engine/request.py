"""Requests: what a user asks the engine for, and the validation done at submit.

:func:`validate` checks every field before the scheduler changes any state, so a bad request
never touches the running rows. Finish reasons: ``stop`` (a stop id, a stop string in the
decoded text, a complete grammar), ``length`` (``max_tokens`` generated), ``error``.
Notes: ``docs/lab/engine-notes.md``, "request.py".
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

FINISH_REASONS = ("stop", "length", "error", "abort")
# The smallest positive temperature: sampling scales log-probabilities (>= -ln V, V < e^32)
# by 1 / temperature in float32, which stays finite (<= 32 / 1e-37 < 3.4e38) from here on.
MIN_TEMPERATURE = 1e-37
# Stop strings per request and characters per stop string (the automaton that matches them
# costs the same per token whatever their number: these bound its size, built per request).
MAX_STOP_STRINGS, MAX_STOP_LENGTH = 64, 256
# Most (token id, log-prob) pairs a request may ask per generated token (OpenAI's limit too).
MAX_TOP_LOGPROBS = 20
# presence_penalty and frequency_penalty lie in [-MAX_PENALTY, MAX_PENALTY] (OpenAI's and
# vLLM's range): beyond it a penalty times a token count can overflow the logits (-1e300 did).
MAX_PENALTY = 2.0
# repetition_penalty lies in [1/MAX_REPETITION_PENALTY, MAX_REPETITION_PENALTY]: mlx-lm divides a
# positive logit by it (multiplies a negative one), so a tiny or huge value overflows the logits to
# inf and the row could only end in error; the usual values are 1.0-2.0.
MAX_REPETITION_PENALTY = 100.0
# logit_bias values lie in [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS] (OpenAI's range, which vLLM clamps to):
# -100 already bans a token and +100 forces it; 1e39 overflowed float32 and ended the row in error.
MAX_LOGIT_BIAS = 100.0


@dataclass(frozen=True)
class Request:
    """One generation request.

    Args:
        prompt: text (encoded as mlx-lm's ``stream_generate`` does: :func:`encode_text`) or a
            non-empty list of token ids in ``[0, vocab_size)``. Give ``prompt`` or ``messages``.
        max_tokens: maximum number of generated tokens, ``>= 1``.
        temperature: ``0.0`` greedy (argmax); ``>= MIN_TEMPERATURE`` (``1e-37``, where
            ``1 / temperature`` fits float32) samples as mlx-lm's ``make_sampler``, with the
            row's own PRNG key.
        top_p: nucleus mass in ``(0, 1]``; ``1.0`` disables it. Needs ``temperature > 0``.
        top_k: keep the ``k`` most likely tokens, ``>= 0``; ``0`` disables it.
        min_p: keep tokens with probability ``>= min_p`` times the top one's, ``[0, 1)``.
        stop_ids: token ids that end the row (``None``: the tokenizer's EOS ids; a
            constrained row always stops at EOS too).
        priority: larger is more urgent (the ``priority`` policy; preemption takes the lowest).
        seed: PRNG seed of a sampled row (``>= 0``; ``None``: drawn from the scheduler's).
        repetition_penalty, presence_penalty, frequency_penalty, logit_bias: mlx-lm's
            ``make_logits_processors`` options (``repetition_penalty`` in ``[0.01, 100]``; presence
            and frequency penalties in ``[-2, 2]``; ``logit_bias`` values in ``[-100, 100]``), over
            the row's own tokens.
        logits_processors: extra ``(tokens [T], logits [1, V]) -> logits [1, V]`` callables
            (an ``mx.array`` of a floating dtype).
        sampler: a custom ``(logprobs [1, V]) -> token [1]`` callable replacing sampling
            (one integer id in ``[0, V)``: an ``mx.array``, a Python or numpy int).
        on_token: ``(uid, token) -> None``, called when a token is read.
        messages: chat turns ``[{"role": str, "content": str}, ...]`` (mlx-lm's
            ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``).
        stop: stop strings (a str or a list; at most ``MAX_STOP_STRINGS`` (64) of at most
            ``MAX_STOP_LENGTH`` (256) characters): the text ends before the first one found.
        adapter: a LoRA adapter loaded by ``Scheduler(adapters=)``, this row only (``None``: base).
        top_logprobs: ``k`` in ``[0, MAX_TOP_LOGPROBS]`` (20) most likely tokens and their
            log-probs recorded per generated token (``None`` is ``0``: none).
        json_schema, regex, choices: structured output through llguidance, at most one
            (``workbench.engine.levers.constrained``); ``ImportError`` without the
            ``structured`` extra.

    A callable that raises or breaks its contract, or non-finite logits, ends only that row
    (finish reason ``error``, naming the callable, the value and the limit). Raises nothing
    itself; the scheduler calls :func:`validate` at ``submit``.
    """

    prompt: str | Sequence[int] | None = None
    max_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop_ids: Sequence[int] | None = None
    priority: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = None
    logits_processors: Sequence[Callable] = ()
    sampler: Callable | None = None
    on_token: Callable | None = None
    messages: Sequence[Mapping[str, str]] | None = None
    stop: str | Sequence[str] | None = None
    adapter: str | None = None
    top_logprobs: int | None = 0
    json_schema: Mapping[str, Any] | str | None = None
    regex: str | None = None
    choices: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if self.top_logprobs is None:  # OpenAI's and vLLM's null: none, the same request as 0
            object.__setattr__(self, "top_logprobs", 0)

    @property
    def constrained(self) -> bool:
        """True when the request sets ``json_schema``, ``regex`` or ``choices``."""
        return self.json_schema is not None or self.regex is not None or self.choices is not None

    @property
    def greedy(self) -> bool:
        """True for plain argmax rows (temperature 0, no sampler, processors or constraint)."""
        return (
            self.temperature == 0.0
            and self.sampler is None
            and not self.logits_processors
            and not self.logit_bias
            and not self.repetition_penalty
            and not self.presence_penalty
            and not self.frequency_penalty
            and not self.constrained
        )

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> "Request":
        """Build a request from a mapping; unknown keys raise ``ValueError`` naming them."""
        return cls(**fields)


_dataclass_init = Request.__init__
_FIELDS = tuple(f.name for f in dataclasses.fields(Request))


@functools.wraps(_dataclass_init)  # keeps the real signature for inspect.signature, help() and Shift-Tab
def _init_refusing_unknown_fields(self, *args, **kwargs):
    unknown = sorted(set(kwargs) - set(_FIELDS))
    if unknown:
        raise ValueError(f"Request: unknown field(s) {unknown}; allowed fields: {list(_FIELDS)}")
    if not args and kwargs.get("prompt") is None and kwargs.get("messages") is None:
        raise ValueError(
            "Request: the field 'prompt' (a str or a list of token ids) or 'messages' "
            "(chat turns) is required"
        )
    _dataclass_init(self, *args, **kwargs)


# An unknown keyword is bad input like any other: a ValueError naming it, not a TypeError.
Request.__init__ = _init_refusing_unknown_fields


@dataclass(frozen=True)
class ValidRequest:
    """A request after validation: prompt as token ids, stop ids as a frozenset, stop
    strings as a tuple (empty: none)."""

    request: Request
    prompt_ids: tuple[int, ...]
    stop_ids: frozenset[int]
    stop: tuple[str, ...] = ()


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x: Any) -> bool:
    """A finite int or float, numpy's scalars too (``np.float32(0.5)``), never a bool; an int
    beyond float's range (``10**400``: ``math.isfinite`` raises OverflowError on it) is none."""
    if not isinstance(x, (int, float, np.integer, np.floating)) or isinstance(x, (bool, np.bool_)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _shown(x: Any) -> str:
    """``repr(x)`` for a refusal's message, but an int beyond float's range as its digit count
    (``"an int of 401 digits"``): its repr would be hundreds of digits, and beyond 4,300 Python
    refuses to write it (a ValueError naming no field)."""
    if not isinstance(x, int) or isinstance(x, bool) or x.bit_length() <= 1024:
        return repr(x)
    n = abs(x)
    digits = int((n.bit_length() - 1) * math.log10(2)) + 1  # the digits of 2**(bit_length - 1)
    digits += n >= 10**digits
    return f"{'a negative' if x < 0 else 'an'} int of {digits} digits"


def _check_ids(name: str, ids: Sequence[Any], vocab_size: int) -> tuple[int, ...]:
    for i, t in enumerate(ids):
        if not _is_int(t):
            raise ValueError(f"{name}[{i}] must be an int token id, got {type(t).__name__}")
        if not 0 <= t < vocab_size:
            raise ValueError(f"{name}[{i}] = {_shown(t)} is outside the vocabulary [0, {vocab_size})")
    return tuple(int(t) for t in ids)


def validate(
    request: Any,
    tokenizer: Any,
    vocab_size: int,
    context_tokens: int | None = None,
    context_field: str = "max_position_embeddings",
) -> ValidRequest:
    """Check every field of ``request`` and tokenize its prompt.

    Args:
        request: a :class:`Request` (anything else is refused).
        tokenizer: an mlx-lm ``TokenizerWrapper`` (or any object with ``encode`` and
            ``eos_token_ids``).
        vocab_size: number of rows of the model's output projection (tokens).
        context_tokens: the model's context length (tokens); ``None`` for no limit.
        context_field: the config field it came from (named in the error).

    Returns:
        A :class:`ValidRequest`.

    Raises:
        ValueError: naming the field and its allowed range (:class:`Request`'s limits), also for
            ``top_p``/``top_k`` with ``temperature == 0``, ``prompt + max_tokens`` over
            ``context_tokens``, both or neither of ``prompt`` and ``messages``, ``messages``
            without a chat template or refused by it (its ``raise_exception``: the ValueError
            names ``messages``, chained from jinja2's ``TemplateError``), text with a lone
            surrogate (prompt, roles, contents, stop strings), or a number beyond float's range.
    """
    if not isinstance(request, Request):
        raise ValueError(f"request must be a workbench.Request, got {type(request).__name__}")
    r = request
    ids = _prompt_ids(r, tokenizer, vocab_size)
    if not _is_int(r.max_tokens) or r.max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {_shown(r.max_tokens)}")
    if context_tokens is not None and len(ids) + r.max_tokens > context_tokens:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_tokens ({_shown(r.max_tokens)}) = "
            f"{_shown(len(ids) + r.max_tokens)} "
            f"exceeds the model's context of {context_tokens} tokens ({context_field})"
        )
    if not _is_int(r.priority):
        raise ValueError(f"priority must be an int, got {_shown(r.priority)}")
    if r.adapter is not None and (not isinstance(r.adapter, str) or not r.adapter):
        raise ValueError(
            f"adapter must be a loaded adapter's name (a non-empty str) or None, got {r.adapter!r}"
        )
    _check_sampling(r)
    _check_processors(r, vocab_size)
    _check_top_logprobs(r, vocab_size)
    r = _plain_numbers(r)
    return ValidRequest(
        request=r, prompt_ids=ids, stop_ids=_stop_ids(r, tokenizer, vocab_size), stop=_stop_strings(r)
    )


_NUMBER_FIELDS = (
    "max_tokens", "priority", "temperature", "top_p", "top_k", "min_p", "seed", "top_logprobs",
    "repetition_penalty", "presence_penalty", "frequency_penalty",
)  # fmt: skip


def _plain_numbers(r: Request) -> Request:
    """``r`` with numpy scalars (``np.float32(0.5)``, ``np.int64(3)``) in its number fields and
    ``logit_bias`` as Python ints and floats: mlx-lm's compiled samplers take only those
    (a ``np.float32`` temperature ended the row in ``[compile]`` error). ``r`` itself when it
    has none (the usual case)."""
    changes = {
        name: type(value.item())(value)
        for name in _NUMBER_FIELDS
        if isinstance(value := getattr(r, name), np.generic)
    }
    if r.logit_bias is not None and any(isinstance(x, np.generic) for kv in r.logit_bias.items() for x in kv):
        changes["logit_bias"] = {int(t): float(b) for t, b in r.logit_bias.items()}
    return dataclasses.replace(r, **changes) if changes else r


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """``[T]`` ids of ``text`` as mlx-lm's ``stream_generate`` encodes it (BOS added unless present)."""
    bos = getattr(tokenizer, "bos_token", None)
    return list(tokenizer.encode(text, add_special_tokens=bos is None or not text.startswith(bos)))


def _prompt_ids(r: Request, tokenizer: Any, vocab_size: int) -> tuple[int, ...]:
    """The prompt as token ids, checked against the vocabulary."""
    if r.messages is not None:
        if r.prompt is not None:
            raise ValueError(
                "Request: give either 'prompt' or 'messages', not both "
                "(messages are encoded with the chat template into the prompt)"
            )
        return _chat_ids(r.messages, tokenizer, vocab_size)
    if r.prompt is None:
        raise ValueError("Request: the field 'prompt' or 'messages' is required")
    if isinstance(r.prompt, str):
        if not r.prompt:
            raise ValueError("prompt must be a non-empty str or list of token ids, got ''")
        check_unicode("prompt", r.prompt)
        ids = tuple(encode_text(tokenizer, r.prompt))
        if not ids:
            raise ValueError(f"prompt {r.prompt!r} tokenizes to zero tokens; need >= 1")
        return ids
    if isinstance(r.prompt, (list, tuple, np.ndarray)):
        if len(r.prompt) == 0:
            raise ValueError("prompt must have at least 1 token id, got an empty list")
        return _check_ids("prompt", r.prompt, vocab_size)
    raise ValueError(f"prompt must be a str or a list of int token ids, got {type(r.prompt).__name__}")


def check_unicode(name: str, text: str) -> None:
    """Refuse text the tokenizer (or llguidance) cannot take: a lone surrogate (``"\\ud800"``,
    which JSON can carry) has no UTF-8 form, and the tokenizer's own error names no field.
    Checked for the prompt, chat messages' roles and contents, stop strings and the structured
    output fields. mlx-lm: none (its tokenizer raises UnicodeEncodeError).

    Raises:
        ValueError: naming ``name`` and the character's position."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name} must be valid Unicode text: a lone surrogate {text[exc.start]!r} at character {exc.start}"
        ) from None


def _chat_ids(messages: Any, tokenizer: Any, vocab_size: int) -> tuple[int, ...]:
    """Chat turns as token ids through the tokenizer's chat template."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(
            f"messages must be a non-empty list of {{'role': str, 'content': str}} dicts, got {messages!r}"
        )
    for i, m in enumerate(messages):
        if (
            not isinstance(m, Mapping)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(f"messages[{i}] must be a dict with str 'role' and 'content', got {m!r}")
        check_unicode(f"messages[{i}].role", m["role"])
        check_unicode(f"messages[{i}].content", m["content"])
    if not getattr(tokenizer, "has_chat_template", False):
        raise ValueError(
            "messages need a tokenizer with a chat template, and this model's tokenizer has none "
            "(tokenizer.has_chat_template is False); pass prompt= (text or token ids) instead"
        )
    from jinja2 import TemplateError  # transformers' template engine (mlx-lm depends on it)

    try:
        ids = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True)
    except TemplateError as exc:  # its raise_exception ("roles must alternate"), or a broken template
        raise ValueError(f"messages: the chat template refuses them: {exc}") from exc
    if not ids:
        raise ValueError("messages encode to zero tokens through the chat template; need >= 1")
    return _check_ids("messages (chat template)", list(ids), vocab_size)


def _stop_strings(r: Request) -> tuple[str, ...]:
    """The stop strings as a tuple (a single str is one stop string; ``None``: none)."""
    if r.stop is None:
        return ()
    stops = [r.stop] if isinstance(r.stop, str) else r.stop
    if not isinstance(stops, (list, tuple)):
        raise ValueError(f"stop must be a str or a list of str, got {type(r.stop).__name__}")
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(
            f"stop has {len(stops)} strings; at most {MAX_STOP_STRINGS} (MAX_STOP_STRINGS) are allowed"
        )
    for i, s in enumerate(stops):
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop[{i}] must be a non-empty str, got {s!r}")
        check_unicode(f"stop[{i}]", s)
        if len(s) > MAX_STOP_LENGTH:
            raise ValueError(
                f"stop[{i}] is {len(s)} characters long; at most {MAX_STOP_LENGTH} (MAX_STOP_LENGTH) "
                "are allowed"
            )
    return tuple(dict.fromkeys(stops))


def _check_sampling(r: Request) -> None:
    """temperature, top_p, top_k, min_p and seed within their ranges."""
    if not _is_real(r.temperature) or r.temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {_shown(r.temperature)}")
    if 0 < r.temperature < MIN_TEMPERATURE:
        raise ValueError(
            f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g} (1 / temperature must be "
            f"finite in float32), got {_shown(r.temperature)}"
        )
    if not _is_real(r.top_p) or not 0 < r.top_p <= 1:
        raise ValueError(f"top_p must be a number in (0, 1], got {_shown(r.top_p)}")
    if not _is_int(r.top_k) or r.top_k < 0:
        raise ValueError(f"top_k must be an int >= 0, got {_shown(r.top_k)}")
    if r.temperature == 0 and (r.top_p < 1 or r.top_k > 0):
        raise ValueError("top_p / top_k need temperature > 0; temperature 0 is greedy decoding")
    if not _is_real(r.min_p) or not 0 <= r.min_p < 1:
        raise ValueError(f"min_p must be a number in [0, 1), got {_shown(r.min_p)}")
    if r.temperature == 0 and r.min_p > 0:
        raise ValueError("min_p needs temperature > 0; temperature 0 is greedy decoding")
    check_seed(r.seed)


def check_seed(seed: Any) -> None:
    """A request's ``seed``: an int ``>= 0`` or ``None`` (numpy's ``SeedSequence`` takes no
    negative seed). No mlx-lm counterpart (mlx-lm seeds one global PRNG).

    Raises:
        ValueError: naming ``seed`` and its limit."""
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise ValueError(f"seed must be an int >= 0 or None, got {_shown(seed)}")


def _check_top_logprobs(r: Request, vocab_size: int) -> None:
    """top_logprobs an int in ``[0, min(MAX_TOP_LOGPROBS, vocab_size)]`` (``None`` is already 0)."""
    most = min(MAX_TOP_LOGPROBS, vocab_size)
    if not _is_int(r.top_logprobs) or not 0 <= r.top_logprobs <= most:
        limit = "MAX_TOP_LOGPROBS" if most == MAX_TOP_LOGPROBS else "the vocabulary size"
        raise ValueError(
            f"top_logprobs must be an int in [0, {most}] ({limit}) or None (none), "
            f"got {_shown(r.top_logprobs)}"
        )


def _check_processors(r: Request, vocab_size: int) -> None:
    """Penalties, logit bias, processors, sampler and on_token of the right kinds."""
    rp, most = r.repetition_penalty, MAX_REPETITION_PENALTY
    if rp is not None and (not _is_real(rp) or not 1 / most <= rp <= most):
        raise ValueError(
            f"repetition_penalty must be a number in [{1 / most:g}, {most:g}] (MAX_REPETITION_PENALTY) "
            f"or None, got {_shown(rp)}"
        )
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(r, name)
        if not _is_real(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
            raise ValueError(
                f"{name} must be a finite number in [{-MAX_PENALTY:g}, {MAX_PENALTY:g}] (MAX_PENALTY), "
                f"got {_shown(value)}"
            )
    if r.logit_bias is not None:
        if not isinstance(r.logit_bias, Mapping):
            raise ValueError(
                f"logit_bias must be a mapping token id -> bias, got {type(r.logit_bias).__name__}"
            )
        _check_ids("logit_bias", list(r.logit_bias), vocab_size)
        for t, b in r.logit_bias.items():
            if not _is_real(b) or not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
                raise ValueError(
                    f"logit_bias[{t}] must be a finite number in [{-MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}] "
                    f"(MAX_LOGIT_BIAS), got {_shown(b)}"
                )
    if not isinstance(r.logits_processors, (list, tuple)) or not all(
        callable(f) for f in r.logits_processors
    ):
        raise ValueError("logits_processors must be a list of callables (tokens, logits) -> logits")
    for name in ("sampler", "on_token"):
        if getattr(r, name) is not None and not callable(getattr(r, name)):
            raise ValueError(f"{name} must be callable or None, got {type(getattr(r, name)).__name__}")


def _stop_ids(r: Request, tokenizer: Any, vocab_size: int) -> frozenset[int]:
    """The stop ids as a set (``None``: EOS ids; a constrained request's always include EOS)."""
    eos = frozenset(tokenizer.eos_token_ids)
    if r.stop_ids is None:
        return eos
    if isinstance(r.stop_ids, (list, tuple, set, frozenset)):
        ids = frozenset(_check_ids("stop_ids", list(r.stop_ids), vocab_size))
        return ids | eos if r.constrained else ids
    raise ValueError(f"stop_ids must be a list of int token ids or None, got {type(r.stop_ids).__name__}")


CONTEXT_FIELDS = (
    "max_position_embeddings",
    "n_positions",
    "n_ctx",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "context_length",
    "block_size",
)


def context_limit(model: Any) -> tuple[int | None, str]:
    """The model's context length (tokens) and its field: the first of ``CONTEXT_FIELDS`` that
    ``model.args`` sets to an int (``(None, "")`` when none does)."""
    args = getattr(model, "args", None)
    for name in CONTEXT_FIELDS:
        value = getattr(args, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, name
    return None, ""
