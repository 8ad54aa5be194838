"""Small experiments the teaching notebooks run, each measuring one batching pitfall on a
real model. Each returns numbers (log-probabilities), never prints.

Knows: mlx-lm models and single-sequence caches (``make_prompt_cache``), the oracle.
Must not know: the scheduler, views.

Axis letters: ``V`` vocabulary, ``T`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from .oracle import RefRequest, TokenTrace, solo_reference


def next_logprobs(model: Any, tokens: Sequence[int], cache: list[Any] | None = None) -> np.ndarray:
    """Log-probabilities ``[V]`` of the token after ``tokens`` (one forward of ``[1, T]``),
    updating ``cache`` in place when given."""
    logits = model(mx.array([list(tokens)], dtype=mx.uint32), cache=cache)[0, -1]
    logprobs = logits - mx.logsumexp(logits)
    return np.array(logprobs.astype(mx.float32))


def pad_scan_gap(model: Any, prompt: Sequence[int], n_pads: int, pad_id: int = 0) -> float:
    """Largest |logprob| change of the next token when ``n_pads`` pad tokens are scanned
    into a recurrent state before ``prompt`` (what happens if a left-padded row is run
    without mlx-lm's mask), versus the prompt alone. 0.0 means the pads are harmless."""
    clean = next_logprobs(model, prompt, make_prompt_cache(model))
    padded = next_logprobs(model, [pad_id] * n_pads + list(prompt), make_prompt_cache(model))
    return float(np.abs(clean - padded).max())


def stale_state_gap(model: Any, previous: Sequence[int], prompt: Sequence[int]) -> float:
    """Largest |logprob| change of the next token when ``prompt`` starts from the state
    another request (``previous``) left behind, versus a zero state: why a joining row
    must start from a fresh cache."""
    clean = next_logprobs(model, prompt, make_prompt_cache(model))
    stale_cache = make_prompt_cache(model)
    next_logprobs(model, previous, stale_cache)
    stale = next_logprobs(model, prompt, stale_cache)
    return float(np.abs(clean - stale).max())


@dataclass(frozen=True)
class SinkGap:
    """Solo references with ``keep=0`` (what mlx-lm's batch rotating cache does) and
    ``keep=4`` (mlx-lm's single-sequence default), and where they first part."""

    keep0: TokenTrace
    keep4: TokenTrace
    first_token_divergence: int | None
    max_logprob_gap: float


def sink_gap(model: Any, prompt: Sequence[int], max_kv_size: int, max_tokens: int) -> SinkGap:
    """Run ``prompt`` alone with a rotating cache of ``max_kv_size`` tokens keeping 0 and 4
    sink tokens; compare the greedy traces."""
    req = RefRequest(tuple(prompt), max_tokens, frozenset())
    keep0 = solo_reference(model, req, max_kv_size=max_kv_size, keep=0)
    keep4 = solo_reference(model, req, max_kv_size=max_kv_size, keep=4)
    first = next((t for t, (a, b) in enumerate(zip(keep0.tokens, keep4.tokens)) if a != b), None)
    n = min(len(keep0.logprobs), len(keep4.logprobs))
    gap = float(np.abs(np.array(keep0.logprobs[:n]) - np.array(keep4.logprobs[:n])).max())
    return SinkGap(keep0, keep4, first, gap)
