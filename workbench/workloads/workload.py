"""Workloads: requests with arrival times, prompts of exact token lengths, synthetic
generators, and the demo's staggered arrivals.

Knows: the bundled prompt set (``data/prompts/``), the tokenizer, :class:`Request`, the
seeded distributions of :mod:`workbench.workloads.distributions`. Must not know: the scheduler
(replaying a workload is :mod:`workbench.sim.replay`'s job).

Glossary: an *arrival* is ``(arrival_s, Request)``: the request reaches the server
``arrival_s`` seconds after the workload starts. A :class:`Workload` is a name and its
arrivals sorted by time. A *shared prefix* is a run of prompt tokens that several
prompts start with (what a prompt cache can reuse).

Synthetic prompts are cut from the prompt set's token ids (wrapping around), so a prompt
of ``n`` tokens is exactly ``n`` ids, whatever the tokenizer would merge in text.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..engine.request import Request
from ..runtime.loading import DATA_DIR
from .distributions import Lengths, gamma_arrivals_s, generator, lengths_from, poisson_arrivals_s

PROMPT_SOURCE = DATA_DIR / "prompts" / "python_source.txt"

DEMO_PROMPT_TOKENS = (1, 200, 5, 17, 40, 120, 3, 64, 150, 9, 90, 25, 180, 2)
DEMO_MAX_TOKENS = (8, 64, 16, 24, 32, 12, 48, 20, 8, 40, 16, 56, 28, 36)
DEMO_ARRIVAL_EVERY_STEPS = 3

WORKLOAD_COLUMNS = ["arrival_s", "prompt_tokens", "max_tokens", "priority", "temperature"]


@functools.lru_cache(maxsize=8)
def source_ids(tokenizer: Any, source: Path = PROMPT_SOURCE) -> tuple[int, ...]:
    """The prompt set's token ids (no special tokens), tokenized once per tokenizer.

    The set is a corpus, not one model input, so it goes through the fast tokenizer's
    backend (``tokenizers.Tokenizer.encode``: the same ids) when there is one: the
    transformers front end would warn that its 766 tokens exceed the model's 512-token
    context, which no request ever sends (prompts are cut from it)."""
    text = Path(source).read_text()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    ids = tuple(
        backend.encode(text, add_special_tokens=False).ids
        if backend is not None
        else tokenizer.encode(text, add_special_tokens=False)
    )
    if not ids:
        raise ValueError(f"prompt set {source} tokenizes to zero tokens")
    return ids


def prompt_of_length(
    tokenizer: Any, n_tokens: int, start: int = 0, source: Path = PROMPT_SOURCE
) -> list[int]:
    """``n_tokens`` token ids cut from the prompt set, starting at token ``start``
    (wrapping around the text).

    Raises:
        ValueError: if ``n_tokens < 1``.
    """
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    ids = source_ids(tokenizer, source)
    return [ids[(start + i) % len(ids)] for i in range(n_tokens)]


def prompt_maker(tokenizer: Any, source: Path = PROMPT_SOURCE) -> Callable[..., list[int]]:
    """``prompt(n_tokens, start=0) -> list[int]``: :func:`prompt_of_length` bound to
    ``tokenizer`` and ``source``, for notebooks and tests that cut many prompts with one
    tokenizer::

        prompt = prompt_maker(tokenizer)
        prompt(6)        # the prompt set's first 6 token ids
        prompt(4, 80)    # 4 token ids from token 80 on (wrapping around the text)

    The returned function raises ValueError if ``n_tokens < 1``, as
    :func:`prompt_of_length` does.
    """
    return functools.partial(prompt_of_length, tokenizer, source=source)


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


@dataclass(frozen=True)
class Workload:
    """Requests with arrival times, replayable by :func:`workbench.sim.replay.replay`.

    Args:
        arrivals: ``(arrival_s, Request)`` pairs; ``arrival_s`` finite and ``>= 0``
            (seconds from the workload's start). Stored sorted by time (stable, so equal
            times keep their given order).
        name: a label for tables and figures.

    Raises:
        ValueError: for a negative or non-finite time, or an item that is not a Request.
    """

    arrivals: tuple[tuple[float, Request], ...]
    name: str = "workload"

    def __post_init__(self):
        pairs = []
        for i, (t, r) in enumerate(self.arrivals):
            if not isinstance(t, (int, float, np.number)) or not math.isfinite(t) or t < 0:
                raise ValueError(f"arrivals[{i}]: arrival_s must be a finite number >= 0, got {t!r}")
            if not isinstance(r, Request):
                raise ValueError(f"arrivals[{i}]: expected a workbench.Request, got {type(r).__name__}")
            pairs.append((float(t), r))
        object.__setattr__(self, "arrivals", tuple(sorted(pairs, key=lambda p: p[0])))

    def __len__(self) -> int:
        return len(self.arrivals)

    def __iter__(self) -> Iterator[tuple[float, Request]]:
        return iter(self.arrivals)

    @property
    def duration_s(self) -> float:
        """Time of the last arrival (s); 0.0 when empty."""
        return self.arrivals[-1][0] if self.arrivals else 0.0

    def head(self, n: int) -> "Workload":
        """The first ``n`` arrivals."""
        return replace(self, arrivals=self.arrivals[:n])

    def with_priorities(self, priorities: Sequence[int]) -> "Workload":
        """The same arrivals with ``Request.priority`` set per arrival (larger first).

        Raises: ValueError when the lengths differ."""
        if len(priorities) != len(self):
            raise ValueError(f"need {len(self)} priorities, got {len(priorities)}")
        return replace(
            self,
            arrivals=tuple((t, replace(r, priority=int(p))) for (t, r), p in zip(self.arrivals, priorities)),
        )

    def frame(self) -> pd.DataFrame:
        """One row per arrival with ``WORKLOAD_COLUMNS``; ``prompt_tokens`` is ``-1`` for
        a text prompt or chat messages (their length depends on the tokenizer)."""
        return pd.DataFrame(
            [
                {
                    "arrival_s": t,
                    "prompt_tokens": len(r.prompt) if isinstance(r.prompt, (list, tuple)) else -1,
                    "max_tokens": r.max_tokens,
                    "priority": r.priority,
                    "temperature": r.temperature,
                }
                for t, r in self.arrivals
            ],
            columns=WORKLOAD_COLUMNS,
        )

    def text(self) -> str:
        """One deterministic line: requests, span, mean rate, prompt and output lengths."""
        if not self.arrivals:
            return f"{self.name}: 0 requests"
        f = self.frame()
        rate = f"{len(f) / self.duration_s:.2f} req/s" if self.duration_s > 0 else "all at 0 s"
        p = f.prompt_tokens[f.prompt_tokens >= 0]
        prompt = f"prompt tokens p50 {p.median():.0f} max {p.max()}" if len(p) else "text prompts"
        return (
            f"{self.name}: {len(f)} requests over {self.duration_s:.1f} s ({rate}), {prompt}, "
            f"max_tokens p50 {f.max_tokens.median():.0f} max {f.max_tokens.max()}"
        )

    def __str__(self) -> str:
        return self.text()


def synthesize_prompts(
    tokenizer: Any,
    lengths_tokens: Sequence[int],
    rng: int | np.random.Generator,
    shared_prefix_tokens: int = 0,
    n_prefixes: int = 1,
    source: Path = PROMPT_SOURCE,
) -> list[list[int]]:
    """One prompt of exactly ``lengths_tokens[i]`` ids per entry, cut from the prompt set.

    Each prompt starts at a random token of the set. With ``shared_prefix_tokens = P > 0``
    the first ``min(P, n)`` ids of a prompt are one of ``n_prefixes`` shared prefixes
    (chosen at random per prompt), and the rest is cut from its own random start::

        P = 4, two prefixes A, B:   A A A A x x x      (7 tokens)
                                    B B B B y y        (6 tokens)
                                    A A A A z z z z    (8 tokens)

    Raises:
        ValueError: for a length < 1, ``shared_prefix_tokens < 0`` or ``n_prefixes < 1``.
    """
    if shared_prefix_tokens < 0 or n_prefixes < 1:
        raise ValueError(
            f"need shared_prefix_tokens >= 0 and n_prefixes >= 1, got {shared_prefix_tokens} and {n_prefixes}"
        )
    rng = generator(rng)
    n_ids = len(source_ids(tokenizer, source))
    prefix_starts = rng.integers(0, n_ids, size=n_prefixes)
    out = []
    for n in lengths_tokens:
        group, start = rng.integers(0, n_prefixes), rng.integers(0, n_ids)
        shared = min(shared_prefix_tokens, int(n))
        head = prompt_of_length(tokenizer, shared, int(prefix_starts[group]), source) if shared else []
        tail = prompt_of_length(tokenizer, int(n) - shared, int(start), source) if n > shared else []
        out.append(head + tail)
    return out


def synthetic(
    tokenizer: Any,
    n_requests: int,
    rate_per_s: float,
    seed: int | np.random.Generator,
    *,
    arrivals: str = "poisson",
    cv: float = 1.0,
    prompt_tokens: "int | Lengths" = 32,
    output_tokens: "int | Lengths" = 16,
    shared_prefix_tokens: int = 0,
    n_prefixes: int = 1,
    stop_ids: Sequence[int] | None = (),
    temperature: float = 0.0,
    name: str | None = None,
) -> Workload:
    """A seeded synthetic workload.

    Args:
        tokenizer: cuts the prompts (see :func:`synthesize_prompts`).
        n_requests: how many requests.
        rate_per_s: mean arrival rate (requests per second).
        seed: an int or a ``numpy.random.Generator``; the same seed gives the same workload.
        arrivals: ``"poisson"`` or ``"gamma"`` (with ``cv``; see
            :mod:`workbench.workloads.distributions`).
        prompt_tokens, output_tokens: an int (fixed) or a ``Fixed`` / ``Uniform`` /
            ``LogNormal`` length distribution; ``output_tokens`` becomes ``max_tokens``.
        shared_prefix_tokens, n_prefixes: shared prompt prefixes (prompt-cache experiments).
        stop_ids: ``()`` (default) so every request generates exactly its ``max_tokens``;
            ``None`` for the tokenizer's EOS.
        temperature: sampling temperature of every request (``0`` greedy).

    Raises:
        ValueError: for an unknown ``arrivals`` kind, ``cv != 1`` with Poisson, or a bad
            rate, length or seed.
    """
    rng = generator(seed)
    if arrivals == "poisson":
        if cv != 1.0:
            raise ValueError(f"Poisson arrivals have cv 1; use arrivals='gamma' for cv={cv}")
        times = poisson_arrivals_s(n_requests, rate_per_s, rng)
    elif arrivals == "gamma":
        times = gamma_arrivals_s(n_requests, rate_per_s, cv, rng)
    else:
        raise ValueError(f"arrivals must be 'poisson' or 'gamma', got {arrivals!r}")
    n_prompt = lengths_from(prompt_tokens).sample(n_requests, rng)
    n_out = lengths_from(output_tokens).sample(n_requests, rng)
    prompts = synthesize_prompts(tokenizer, n_prompt, rng, shared_prefix_tokens, n_prefixes)
    stop = None if stop_ids is None else list(stop_ids)
    label = name or f"{arrivals}{'' if arrivals == 'poisson' else f' cv {cv:g}'} {rate_per_s:g} req/s"
    return Workload(
        tuple(
            (float(t), Request(prompt=p, max_tokens=int(m), stop_ids=stop, temperature=temperature))
            for t, p, m in zip(times, prompts, n_out)
        ),
        name=label,
    )
