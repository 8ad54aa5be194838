"""Oracles for structured output: a constrained row alone through mlx-lm, and whether its
text satisfies its constraint.

Knows: mlx-lm's ``generate_step`` (through :func:`workbench.verify.oracle.solo_reference`),
the engine's grammar mask (:mod:`workbench.engine.levers.constrained`), ``json`` /
``jsonschema`` / ``re``. Must not know: the scheduler's internals.

- :func:`constrained_reference`: the request alone through ``generate_step`` with a fresh
  :class:`~workbench.engine.levers.constrained.RowGrammar` as its logits processor, ending
  where the engine ends the row (a stop id, a complete grammar, ``max_tokens``): the
  *constrained solo run* a batched constrained row must equal.
- :func:`satisfies`: the text parses and validates (``json.loads`` then
  ``jsonschema.validate`` where jsonschema is installed), fully matches the regex
  (``re.fullmatch``), or is one of the choices.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..engine.levers.constrained import after_token, constraint_of, row_grammar
from .oracle import TokenTrace, ref_request, solo_reference


def constrained_reference(
    model: Any, tokenizer: Any, valid: Any, vocab_size: int, max_kv_size: int | None = None, **kwargs: Any
) -> TokenTrace:
    """The constrained solo run of ``valid`` (a ``ValidRequest`` with ``json_schema``,
    ``regex`` or ``choices``): greedy ``generate_step`` with the row's grammar mask, the
    model's own cache. ``kwargs`` go to :func:`solo_reference` (``prefill_step_size``,
    ``kv_bits``, ...).

    Raises:
        ValueError: the request sets no constraint, or a bad one (as ``submit`` refuses it).
    """
    constraint = constraint_of(valid.request, tokenizer, vocab_size)
    if constraint is None:
        raise ValueError("constrained_reference: the request sets none of json_schema, regex, choices")
    grammar = row_grammar(constraint, tokenizer, vocab_size, len(valid.prompt_ids))
    return solo_reference(
        model,
        ref_request(valid),
        max_kv_size=max_kv_size,
        tokenizer=tokenizer,
        logits_processors=[grammar],
        complete=lambda tokens: after_token(grammar, tokens)[1],
        **kwargs,
    )


def satisfies(request: Any, text: str) -> bool:
    """True when ``text`` (a finished row's visible text) satisfies ``request``'s
    constraint: ``json_schema``: ``json.loads`` parses it and ``jsonschema.validate`` passes
    (only the parse without jsonschema installed); ``regex``: ``re.fullmatch`` (Python's
    ``re``: use a regex both it and Rust's regex read alike); ``choices``: one of them.

    Raises:
        ValueError: the request sets none of the three.
    """
    if request.json_schema is not None:
        schema = (
            json.loads(request.json_schema) if isinstance(request.json_schema, str) else request.json_schema
        )
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return False
        try:
            import jsonschema
        except ImportError:
            return True
        return jsonschema.Draft202012Validator(schema).is_valid(value)
    if request.regex is not None:
        return re.fullmatch(request.regex, text) is not None
    if request.choices is not None:
        return text in request.choices
    raise ValueError("satisfies: the request sets none of json_schema, regex, choices")
