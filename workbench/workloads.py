"""Workloads: prompts of exact token lengths and the demo's staggered arrivals.

Knows: the bundled prompt set (``data/prompts/``) and the tokenizer. Must not know: the
scheduler. A workload here is a list of ``(arrival_step, Request)`` pairs for
``Scheduler.run(arrivals=...)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .loading import DATA_DIR
from .request import Request

PROMPT_SOURCE = DATA_DIR / "prompts" / "python_source.txt"

DEMO_PROMPT_TOKENS = (1, 200, 5, 17, 40, 120, 3, 64, 150, 9, 90, 25, 180, 2)
DEMO_MAX_TOKENS = (8, 64, 16, 24, 32, 12, 48, 20, 8, 40, 16, 56, 28, 36)
DEMO_ARRIVAL_EVERY_STEPS = 3


def prompt_of_length(tokenizer: Any, n_tokens: int, start: int = 0, source: Path = PROMPT_SOURCE) -> list[int]:
    """``n_tokens`` token ids cut from the prompt set, starting at token ``start``
    (wrapping around the text).

    Raises:
        ValueError: if ``n_tokens < 1``.
    """
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    ids = tokenizer.encode(source.read_text(), add_special_tokens=False)
    return [ids[(start + i) % len(ids)] for i in range(n_tokens)]


def demo_workload(tokenizer: Any, max_tokens_cap: int | None = None) -> list[tuple[int, Request]]:
    """The demo's 14 requests: prompt lengths 1..200 tokens, max_tokens 8..64, one
    arriving every ``DEMO_ARRIVAL_EVERY_STEPS`` decode steps. ``max_tokens_cap`` lowers
    every ``max_tokens`` to at most that value."""
    out = []
    for i, (n, m) in enumerate(zip(DEMO_PROMPT_TOKENS, DEMO_MAX_TOKENS)):
        m = min(m, max_tokens_cap) if max_tokens_cap else m
        prompt = prompt_of_length(tokenizer, n, start=37 * i)
        out.append((DEMO_ARRIVAL_EVERY_STEPS * i, Request(prompt=prompt, max_tokens=m)))
    return out
