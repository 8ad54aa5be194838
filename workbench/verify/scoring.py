"""The scoring oracle: a finished greedy row checked against the same request alone in one
forward (teacher forcing), instead of one decode step per token.

Knows: the model's forward, mlx-lm's ``make_prompt_cache`` (the model's own single-sequence
cache), and the solo oracle's traces and stop rule (:mod:`workbench.verify.oracle`). Must
not know: the scheduler's internals; it reads a scheduler through its public API.

Greedy decoding is a function of the prefix: the token at step ``t`` is the argmax of the
next-token distribution given the prompt and tokens ``0 .. t-1``. One forward of ``[1, P + T]``
over a row's prompt (``P`` tokens) and its ``T`` generated tokens gives those ``T + 1``
distributions at once (the last one: the token the request alone would produce next). The
reference trace is their argmaxes, cut by the solo oracle's stop rule (a stop id, a stop
string completed, ``max_tokens``). Up to the first step where it differs from the row, it is
exactly the trace :func:`workbench.verify.oracle.solo_reference` decodes token by token, and
:func:`workbench.verify.oracle.compare_row` stops at that step; so the verdict is the solo
oracle's, for ``P + T`` tokens of prefill instead of a prefill and ``T`` decode steps::

    prompt  p0 p1 p2 | row's tokens  t0 t1 t2        one forward [1, 6]
    argmax        a0 a1 a2 a3                         a_k: solo greedy token after t_{k-1}
    the row matches when t0 t1 t2 == a0 a1 a2 and the solo run stops after a2 (a3 unused)

The log-probs come from a prefill-shaped matmul, not a decode-shaped one: in float32 they
agree within the oracle's ``DEFAULT_ATOL``, as batched and solo runs do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache

from ..engine.text import RowText
from .oracle import (
    DEFAULT_ATOL,
    OracleReport,
    RefRequest,
    TokenTrace,
    checkable_uids,
    compare_traces,
    ref_request,
    scheduler_trace,
)


def scored_reference(model: Any, req: RefRequest, tokens: Sequence[int], tokenizer: Any = None) -> TokenTrace:
    """The solo greedy trace of ``req`` along the prefix ``tokens`` (a row's generated ids),
    from one forward ``[1, P + T]`` with the model's own cache (see the module docstring).

    Returns a :class:`~workbench.verify.oracle.TokenTrace` of at most ``T + 1`` tokens: the
    argmax after each prefix, its log-prob (natural log) and the top-2 margin, cut after the
    first stop id, the token that completes a stop string of ``req.stop`` (decoded with
    ``tokenizer``, as :func:`workbench.verify.oracle.solo_reference` does) or ``max_tokens``.

    Raises:
        ValueError: when ``req.stop`` is not empty and no ``tokenizer`` is given, or when
            the model's cache is not mlx-lm's full-attention ``KVCache`` in every layer
            (a sliding window or recurrent state: decode them token by token, with
            :func:`workbench.verify.oracle.solo_reference`).
    """
    if req.stop and tokenizer is None:
        raise ValueError(
            "scored_reference: a request with stop strings needs the tokenizer to decode its text"
        )
    cache = make_prompt_cache(model)
    if not all(type(c) is KVCache for c in cache):
        kinds = sorted({type(c).__name__ for c in cache})
        raise ValueError(
            f"scored_reference: needs a full-attention KVCache in every layer, the model makes {kinds}"
        )
    ids = mx.array([[*req.prompt_ids, *tokens]], dtype=mx.uint32)  # [1, P + T]
    logits = model(ids, cache=cache)[0, len(req.prompt_ids) - 1 :].astype(mx.float32)  # [T + 1, V]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # [T + 1, V]
    top2 = mx.topk(logprobs, 2, axis=-1)  # [T + 1, 2], unordered
    best = mx.argmax(logprobs, axis=-1)  # [T + 1]
    mx.eval(top2, best)
    top2_np, best_np = np.sort(np.array(top2), axis=-1), np.array(best)
    text = RowText(tokenizer, req.stop) if req.stop else None
    trace = TokenTrace()
    for (second, first), token in zip(top2_np[: req.max_tokens], best_np.tolist()):
        trace.tokens.append(int(token))
        trace.logprobs.append(float(first))
        trace.margins.append(float(first - second))
        if int(token) in req.stop_ids or (text is not None and text.feed(int(token))):
            break
    return trace


def score_check(
    model: Any, sched: Any, uids: Sequence[int] | None = None, atol: float = DEFAULT_ATOL
) -> OracleReport:
    """The solo oracle's verdict (:func:`workbench.verify.oracle.solo_check`) by scoring: each
    finished greedy uid of ``sched`` (default: all of them) checked by :func:`scored_reference`
    along its own tokens, stop strings decoded with ``sched.tokenizer``.

    Raises:
        ValueError: for a scheduler with a quantized KV cache (``kv_bits``) or a
            ``max_kv_size`` (their solo runs differ from one forward: use ``solo_check``),
            and as :func:`scored_reference` does.
    """
    if sched.recipe.kv_quant is not None or sched.config.max_kv_size is not None:
        raise ValueError("score_check: kv_bits and max_kv_size need the token-by-token oracle.solo_check")
    uids = list(uids) if uids is not None else checkable_uids(sched)
    ours = {u: scheduler_trace(sched, u) for u in uids}
    refs = {
        u: scored_reference(model, ref_request(sched.request_of(u)), ours[u].tokens, sched.tokenizer)
        for u in uids
    }
    return compare_traces(ours, refs, atol)
