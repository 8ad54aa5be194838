"""Hostile request callables: custom samplers and logits processors whose *return value*
breaks the contract (``sampler(logprobs [1, V]) -> token [1]`` in ``[0, V)``;
``processor(tokens [T], logits [1, V]) -> logits [1, V]`` floating), for the containment
tests (``tests/engine/test_containment.py``) and the stateful fuzzer
(``tests/verify/test_fuzz.py``).

Each is stateless (a pure function of its inputs), so a checkpoint restored and continued
sees the same calls. ``HOSTILE[name](V, after)`` gives the request fields; ``after`` is how
many tokens a processor lets through before it turns bad (samplers are bad at once). The
message is a regex for the row's error, ``{V}`` standing for the vocabulary size.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np


def _sampler(value):
    return lambda V, after: dict(sampler=lambda logprobs: value(V, logprobs))


def _processor(bad):
    def fields(V, after):
        def processor(tokens, logits):
            return bad(V, logits) if tokens.size >= after else logits  # bad from the `after`-th call on

        return dict(logits_processors=[processor])

    return fields


# name -> (request fields(V, after), error regex)
HOSTILE = {
    "sampler -1": (
        _sampler(lambda V, lp: -1),
        r"sampler returned -1 \(int32\); a token id must be an integer in \[0, {V}\)",
    ),
    "sampler V + 10": (
        _sampler(lambda V, lp: mx.array([V + 10])),
        r"sampler returned {V10} \(int32\).*\[0, {V}\)",
    ),
    "sampler 3.7": (
        _sampler(lambda V, lp: 3.7),
        r"sampler returned 3.7\d* \(float32\); a token id must be an integer",
    ),
    "sampler NaN": (_sampler(lambda V, lp: math.nan), r"sampler returned nan \(float32\)"),
    "sampler uint32 -1": (
        _sampler(lambda V, lp: mx.array([-1]).astype(mx.uint32)),
        r"sampler returned 4294967295 \(uint32\)",
    ),
    "sampler [2]": (
        _sampler(lambda V, lp: mx.array([1, 2])),
        r"sampler returned shape \(2,\); a token id must be one integer",
    ),
    "sampler [1, V]": (_sampler(lambda V, lp: lp), r"sampler returned shape \(1, {V}\)"),
    "sampler None": (_sampler(lambda V, lp: None), r"sampler returned NoneType, not a token id"),
    "processor [1, V + 1]": (
        _processor(lambda V, lg: mx.concatenate([lg, lg[:, :1]], axis=1)),
        r"logits processor 0 returned shape \[1, {V1}\]; logits must be an mx.array \[1, {V}\]",
    ),
    "processor [V]": (_processor(lambda V, lg: lg[0]), r"logits processor 0 returned shape \[{V}\]"),
    "processor [2, V]": (
        _processor(lambda V, lg: mx.concatenate([lg, lg])),
        r"logits processor 0 returned shape \[2, {V}\]",
    ),
    "processor int32": (
        _processor(lambda V, lg: lg.astype(mx.int32)),
        r"logits processor 0 returned dtype int32",
    ),
    "processor numpy": (_processor(lambda V, lg: np.array(lg)), r"logits processor 0 returned ndarray"),
    "processor None": (_processor(lambda V, lg: None), r"logits processor 0 returned NoneType"),
}


def hostile_fields(name: str, vocab_size: int, after: int = 0) -> tuple[dict, str]:
    """``(request fields, error regex)`` of hostile callable ``name`` for a vocabulary of
    ``vocab_size``; a processor turns bad once it sees ``after`` context tokens."""
    fields, message = HOSTILE[name]
    regex = message.replace("{V10}", str(vocab_size + 10)).replace("{V1}", str(vocab_size + 1))
    return fields(vocab_size, after), regex.replace("{V}", str(vocab_size))
