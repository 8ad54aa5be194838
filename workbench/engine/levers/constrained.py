"""Structured output per row: ``Request(json_schema=...)``, ``Request(regex=...)``,
``Request(choices=[...])`` as a per-row logits mask, through llguidance.

Contract: :func:`constraint_of` checks and compiles at ``submit`` (``ValueError`` naming the
field, before any state changes); the row's :class:`RowGrammar`, its last logits processor,
sets refused tokens' logits to ``-inf`` in that row only (``[1, V]``); its state is a function
of the row's generated tokens (:meth:`RowGrammar.sync`); a complete grammar finishes the row
with ``stop``; a refused token raises :class:`GrammarError`, ending that row only (``error``).
Why llguidance: ``docs/structured-output.md``; how and why in detail:
``docs/lab/engine-notes.md``, "levers/constrained.py". Axis letters: ``V`` vocabulary,
``T`` context tokens (prompt + generated).
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ..request import check_unicode
from ..sampling import BadOutput

FIELDS = ("json_schema", "regex", "choices")
# JSON output without free whitespace (llguidance's separators ``", "`` and ``": "``), so a
# schema's output is bounded; a schema's own ``"x-guidance"`` options override it.
JSON_DEFAULTS = {"whitespace_flexible": False}
EXTRA = "structured"  # pip install -e ".[structured]"
# Rust regex-syntax's meta characters (its ``escape``): a choice is matched literally.
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")
# Words of llguidance's messages for a resource limit (lexer fuel, states, grammar size), as
# against a token the grammar refuses ("... doesn't satisfy the grammar", "parser stopped").
_LIMIT_WORDS = ("too many", "fuel", "limit", "lexer error")


class GrammarError(BadOutput):
    """The row's grammar refused a token or has no continuation (the row's error)."""


def _llguidance() -> Any:
    """The ``llguidance`` module. Raises: ImportError naming the extra to install."""
    try:
        import llguidance
        import llguidance.hf  # noqa: F401  (from_tokenizer)
    except ImportError as exc:
        raise ImportError(
            f"structured output (Request(json_schema= / regex= / choices=)) needs llguidance: "
            f'pip install -e ".[{EXTRA}]" (or pip install llguidance); {exc}'
        ) from None
    return llguidance


@dataclass(frozen=True)
class Constraint:
    """A request's checked constraint.

    Attributes:
        field: ``"json_schema"``, ``"regex"`` or ``"choices"``.
        source: the schema as compact JSON, the regex, or the choices as a JSON list.
        grammar: llguidance's grammar (``LLMatcher.grammar_from_*``).
    """

    field: str
    source: str
    grammar: str

    def label(self, width: int = 48) -> str:
        """``field=source`` cut to ``width`` characters (``…`` marks a cut), for views.
        Example: ``Constraint("regex", "[0-9]+", g).label()`` is ``"regex=[0-9]+"``."""
        text = f"{self.field}={self.source}"
        return text if len(text) <= width else text[: width - 1] + "…"


def choices_regex(choices: Sequence[str]) -> str:
    """A regex matching exactly one of ``choices`` (each matched literally: Rust regex
    meta characters escaped). Example: ``choices_regex(["a.b", "c"])`` is ``"(a\\.b|c)"``."""
    return "(" + "|".join("".join("\\" + c if c in _REGEX_META else c for c in s) for s in choices) + ")"


def requested(request: Any) -> list[str]:
    """The constraint fields ``request`` sets (not ``None``), in :data:`FIELDS` order."""
    return [f for f in FIELDS if getattr(request, f, None) is not None]


def _source(field: str, value: Any) -> tuple[str, str]:
    """``(source text, llguidance grammar)`` of one field's value (ValueError naming the field;
    llguidance's own, a schema it cannot parse, prefixed with it)."""
    source, build = _checked(field, value)
    try:
        return source, build()
    except ValueError as exc:  # grammar_from_json_schema's serde error names no field
        raise ValueError(f"{field}: llguidance refuses it: {exc}") from None


def _checked(field: str, value: Any) -> tuple[str, Any]:
    """``(source text, a call building its llguidance grammar)`` of one field's value, checked:
    its type, and valid Unicode (a lone surrogate, ``"\\ud800"``, has no UTF-8 form for llguidance).

    Raises:
        ValueError: naming the field (``choices[i]`` for one choice)."""
    llg = _llguidance().LLMatcher
    if field == "json_schema":
        schema = value
        if isinstance(value, str):
            try:
                schema = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"json_schema must be a JSON schema object (a dict or its JSON text); "
                    f"the text is not JSON: {exc}"
                ) from None
        if not isinstance(schema, Mapping):
            raise ValueError(
                f"json_schema must be a JSON schema object (a dict or its JSON text), got "
                f"{type(schema).__name__}"
            )
        check_unicode("json_schema", json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
        source = json.dumps(schema, separators=(",", ":"))
        return source, lambda: llg.grammar_from_json_schema(source, defaults=JSON_DEFAULTS)
    if field == "regex":
        if not isinstance(value, str) or not value:
            raise ValueError(f"regex must be a non-empty str, got {value!r}")
        check_unicode("regex", value)
        return value, lambda: llg.grammar_from_regex(value)
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"choices must be a non-empty list of non-empty str, got {value!r}")
    for i, c in enumerate(value):
        if not isinstance(c, str) or not c:
            raise ValueError(f"choices[{i}] must be a non-empty str, got {c!r}")
        check_unicode(f"choices[{i}]", c)
    unique = list(dict.fromkeys(value))
    return json.dumps(unique, ensure_ascii=False), lambda: llg.grammar_from_regex(choices_regex(unique))


def constraint_of(request: Any, tokenizer: Any, vocab_size: int) -> Constraint | None:
    """The checked, compiled constraint of ``request`` (``None`` when it sets none).

    Args:
        request: a ``workbench.Request``.
        tokenizer: mlx-lm's ``TokenizerWrapper`` (a Hugging Face fast tokenizer inside).
        vocab_size: ``V``, rows of the model's output.

    Raises:
        ValueError: naming the field: more than one set, wrong type or empty, refused by
            llguidance or beyond its limits (:func:`compiled`), or a tokenizer it cannot map.
        ImportError: llguidance is not installed (naming the ``structured`` extra).
    """
    fields = requested(request)
    if not fields:
        return None
    if len(fields) > 1:
        raise ValueError(f"Request: give at most one of json_schema, regex, choices; got {fields}")
    field = fields[0]
    source, grammar = _source(field, getattr(request, field))
    compiled(grammar, ll_tokenizer(tokenizer, vocab_size), field)
    return Constraint(field, source, grammar)


# Compiled grammars kept (least recently used dropped first): (id of the LLTokenizer, grammar)
# -> (that LLTokenizer, its matcher at the start with its first mask computed, or the message
# refusing it: a refused grammar costs its compile time once).
MAX_COMPILED = 16  # each holds its lexer (its size: docs/structured-output.md)
_COMPILED: "OrderedDict[tuple[int, str], tuple[Any, Any]]" = OrderedDict()


def limits_text() -> str:
    """llguidance's default parser limits as text: ``"initial_lexer_fuel=1,000,000, ..."``."""
    limits = _llguidance().LLParserLimits()
    names = ("initial_lexer_fuel", "step_lexer_fuel", "max_lexer_states", "max_grammar_size")
    return ", ".join(f"{n}={getattr(limits, n):,}" for n in names)


def _limit_error(error: str) -> str:
    """The message for an llguidance resource-limit ``error``."""
    first = error.strip().splitlines()[0] if error.strip() else "unknown error"
    fuel = " (its lexer fuel ran out)" if "too many expressions" in first else ""
    return f"llguidance cannot compile it within its limits{fuel}: {first}; limits: {limits_text()}"


def compiled(grammar: str, tokenizer: Any, field: str = "constraint") -> Any:
    """llguidance's template matcher for ``grammar`` on an ``LLTokenizer``, first mask computed,
    cached (the :data:`MAX_COMPILED` latest, refusals too); each row copies it.

    Raises:
        ValueError: naming ``field`` and llguidance's message, its limits, or that no token
            can start the grammar.
    """
    key = (id(tokenizer), grammar)
    hit = _COMPILED.get(key)
    if hit is None or hit[0] is not tokenizer:  # (an id reused by another tokenizer: compile anew)
        hit = (tokenizer, _compile(grammar, tokenizer))
        _COMPILED[key] = hit
        while len(_COMPILED) > MAX_COMPILED:
            _COMPILED.popitem(last=False)
    _COMPILED.move_to_end(key)
    if isinstance(hit[1], str):
        raise ValueError(f"{field}: {hit[1]}")
    return hit[1]


def _compile(grammar: str, tokenizer: Any) -> Any:
    """:func:`compiled` without the cache (a refusal as a str)."""
    llg = _llguidance().LLMatcher
    error = llg.validate_grammar(grammar, tokenizer)
    if error:
        return f"llguidance refuses it: {error.strip()}"
    matcher = llg(tokenizer, grammar, log_level=0)
    mask = _unpacked(matcher.compute_bitmask(), tokenizer.vocab_size)
    if matcher.is_error():
        return _limit_error(matcher.get_error())
    if not mask.any():
        return "no token of the vocabulary can start the grammar"
    probe = matcher.deep_copy()  # the template itself stays at the start
    allowed = np.flatnonzero(mask)
    byte_tokens = [t for t in _single_byte_tokens(tokenizer) if mask[t]]
    for i, t in enumerate(dict.fromkeys([int(allowed[0]), *byte_tokens])):  # every first byte's path
        if probe.is_stopped():
            break
        if probe.consume_token(t) and i == 0:
            probe.compute_bitmask()  # the step after a first token
        if probe.is_error():
            error = probe.get_error()
            if any(w in error.lower() for w in _LIMIT_WORDS):
                return _limit_error(error)
            return f"llguidance fails on its first token {t}: {error.strip().splitlines()[0]}"
        if not probe.rollback(1):
            probe = matcher.deep_copy()
    return matcher


def _single_byte_tokens(tokenizer: Any) -> list[int]:
    """The ids of the tokens that are one byte each (at most 256), of an ``LLTokenizer``."""
    ids = (tokenizer.tokenize_bytes(bytes([b])) for b in range(256))
    return [t[0] for t in ids if len(t) == 1 and 0 <= t[0] < tokenizer.vocab_size]


def _unpacked(bitmask: bytes, vocab_size: int) -> np.ndarray:
    """llguidance's bitmask (one bit per token, little-endian) as ``[V]`` bool."""
    return np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8), bitorder="little")[:vocab_size].astype(bool)


_TOKENIZERS: "weakref.WeakKeyDictionary[Any, dict[int, Any]]" = weakref.WeakKeyDictionary()


def ll_tokenizer(tokenizer: Any, vocab_size: int) -> Any:
    """llguidance's ``LLTokenizer`` for mlx-lm's ``tokenizer`` and ``V``, built once per tokenizer.

    Raises:
        ValueError: the tokenizer is not a Hugging Face fast tokenizer (nothing to map).
    """
    built = _TOKENIZERS.setdefault(tokenizer, {})
    if vocab_size not in built:
        hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's TokenizerWrapper holds the HF one
        eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [])
        try:
            built[vocab_size] = _llguidance().hf.from_tokenizer(hf, n_vocab=vocab_size, eos_token=eos or None)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"structured output needs a Hugging Face fast tokenizer (tokenizer.json); "
                f"llguidance cannot map {type(hf).__name__}: {exc}"
            ) from None
    return built[vocab_size]


class RowGrammar:
    """One row's grammar as a logits processor ``(context [T], logits [1, V]) -> logits [1, V]``.

    Args:
        constraint: the row's :class:`Constraint`.
        tokenizer: llguidance's ``LLTokenizer`` (:func:`ll_tokenizer`).
        prompt_tokens: the row's prompt length; ``context[prompt_tokens:]`` are generated.

    Attributes:
        mask_calls: masks computed so far (for the cost benchmark).
    """

    def __init__(self, constraint: Constraint, tokenizer: Any, prompt_tokens: int):
        self.constraint, self.tokenizer, self.prompt_tokens = constraint, tokenizer, int(prompt_tokens)
        self._state: tuple[Any, tuple[int, ...]] | None = None  # (matcher, the generated ids it consumed)
        self.mask_calls = 0

    @property
    def consumed(self) -> tuple[int, ...]:
        """The generated tokens the matcher has consumed (its cache key; ``()`` when none)."""
        return () if self._state is None else self._state[1]

    def _fresh(self) -> Any:
        return compiled(self.constraint.grammar, self.tokenizer, self.constraint.field).deep_copy()

    def sync(self, tokens: Sequence[int]) -> Any:
        """The matcher brought to exactly ``tokens`` (rolled back to the common prefix, then
        consuming the rest). Raises :class:`GrammarError` for a refused token."""
        tokens = [int(t) for t in tokens]
        state, self._state = self._state, None  # detached while it changes
        matcher, consumed = state if state is not None else (self._fresh(), ())
        common = 0
        for a, b in zip(consumed, tokens, strict=False):  # lengths differ
            if a != b:
                break
            common += 1
        if common < len(consumed) and (matcher.is_error() or not matcher.rollback(len(consumed) - common)):
            matcher, common = self._fresh(), 0
        for i, t in enumerate(tokens[common:], start=common):
            if not matcher.consume_token(t):
                piece = self.tokenizer.decode_str([t]) if 0 <= t < self.tokenizer.vocab_size else ""
                error = matcher.get_error()
                if any(w in error.lower() for w in _LIMIT_WORDS):  # a limit, not the token's fault
                    field = self.constraint.field
                    raise GrammarError(f"{field}: {_limit_error(error)} (at generated token {i})")
                raise GrammarError(
                    f"{self.constraint.field}: the grammar refuses token {t} ({piece!r}) after "
                    f"{i} generated token(s): {error}"
                )
        self._state = (matcher, tuple(tokens))
        return matcher

    def allowed(self, tokens: Sequence[int], vocab_size: int) -> np.ndarray:
        """The tokens that may follow ``tokens``: ``[V]`` bool (llguidance's bitmask,
        unpacked). Raises: :class:`GrammarError` (a refused token, or nothing allowed)."""
        matcher = self.sync(tokens)
        mask = _unpacked(matcher.compute_bitmask(), vocab_size)
        self.mask_calls += 1
        if not mask.any():
            raise GrammarError(
                f"{self.constraint.field}: no token of the vocabulary can continue the grammar "
                f"after {len(tokens)} generated token(s): {matcher.get_error()}"
            )
        return mask

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        """``logits`` ``[1, V]`` with every token the grammar refuses set to ``-inf``."""
        generated = context[self.prompt_tokens :].tolist()
        mask = mx.array(self.allowed(generated, logits.shape[-1]))[None]  # [1, V] bool
        return mx.where(mask, logits, mx.array(-float("inf"), dtype=logits.dtype))

    def done(self, tokens: Sequence[int]) -> bool:
        """True when the grammar is complete after ``tokens``: only EOS may follow
        (llguidance ``is_stopped``). Raises: :class:`GrammarError` for a refused token."""
        return bool(self.sync(tokens).is_stopped())


def row_grammar(
    constraint: Constraint | None, tokenizer: Any, vocab_size: int, prompt_tokens: int
) -> RowGrammar | None:
    """A fresh :class:`RowGrammar` for ``constraint`` (``None`` for none)."""
    if constraint is None:
        return None
    return RowGrammar(constraint, ll_tokenizer(tokenizer, vocab_size), prompt_tokens)


def after_token(grammar: RowGrammar | None, tokens: Sequence[int]) -> tuple[str, bool]:
    """``(error message or "", complete)`` of a row's grammar after its generated ``tokens``;
    raises nothing."""
    if grammar is None:
        return "", False
    try:
        return "", grammar.done(tokens)
    except GrammarError as exc:
        return str(exc), False
    except Exception as exc:  # contained: only this row ends
        return f"{grammar.constraint.field}: llguidance raised {type(exc).__name__}: {exc}", False
