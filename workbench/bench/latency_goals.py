"""The latency goals of ``workbench bench --packed`` (:data:`GOALS`: TTFT p95 <= 0.6x and ITL
p95 <= 1.0x mlx-lm's, at once), each said met or missed with its number, the floor measured in
the same run, and where an engine's time went (``docs/packed.md``, "Latency goals").

Knows: the event log's kinds (``submit``, ``admit``, ``prefill``, ``join``, ``token``),
an engine's iteration spans (:class:`Span`, recorded by
:class:`workbench.bench.packed.TrackedWorkbench`), mlx-lm's model call. Must not know: which
engines exist, how a run is driven or printed.

Floors (measured in the run, before and after the scenario's engines, the lowest of a few runs):

- **TTFT**: each prompt's pure prefill, the model's forward of that prompt alone on a fresh
  mlx-lm cache with only the last position through the LM head (:func:`prefill_floors`;
  :func:`ttft_floors` measures the longest prompts only, the others' floor is 0).
  Any engine's TTFT of a request is at least that (chunks only add forwards, other rows only
  add tokens), so the requests' p95 of it bounds every engine's TTFT p95 from below
  (:mod:`workbench.bench.floors` gives the quantile argument). Floor / mlx-lm's TTFT p95
  above the goal (0.6) means *no schedule* meets it on this machine and these arrivals.
- **ITL**: the decode step at the bench's batch size (the lowest of the engines' median steps
  in the decode section): a floor at that batch size.

Where the time went (one row per workbench run, :func:`run_parts`), from the events and the
iteration spans:

- per request: ``queue`` (submit to admit: a free row or a step boundary), ``own prefill``
  (the iterations that ran one of its prefill chunks or its join, between its admit and its
  first token) and ``waiting`` (the rest of its TTFT: iterations that carried none of its
  tokens, such as a forward in flight when it was admitted, or other rows' prefill ahead of
  it in the token budget); the ``tail`` is the requests at or above the TTFT p90;
- per inter-token gap: the prefill tokens of the iterations it spans; the ``tail`` gaps are
  those at or above the ITL p95, and ``behind_prefill`` the share of them that waited on a
  forward carrying prefill.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np
import pandas as pd
from mlx_lm.models.cache import make_prompt_cache

from ..observe.metrics import token_gaps
from .pacing import GOALS  # p95 at most this x mlx-lm's, both at once (issues 17, 27, 40)

TAIL_TTFT_Q, TAIL_ITL_Q = 0.9, 0.95  # the requests / gaps whose parts are reported
PART_COLUMNS = [
    "tail_queue_s",
    "tail_own_prefill_s",
    "tail_waiting_s",
    "itl_tail_behind_prefill",
    "itl_tail_prefill_tokens",
]


class Span(NamedTuple):
    """One engine iteration: clock seconds it started and returned, and the prefill tokens
    its forwards carried (the ``prefill`` events it logged)."""

    start_s: float
    end_s: float
    prefill_tokens: int


def prefill_floors(model: Any, prompts: Iterable[Sequence[int]], repeats: int = 3) -> dict[int, float]:
    """Prompt length -> the lowest of ``repeats`` pure prefills of a prompt that long (seconds).

    A pure prefill: ``model.model`` over the ``[1, n]`` prompt on a fresh
    ``make_prompt_cache(model)``, then the LM head on the last position, evaluated (one
    untimed run per length first: the first forward of a shape allocates). Every distinct
    length of ``prompts`` (token ids) is measured with the first prompt of that length.

    Raises:
        ValueError: for ``repeats < 1`` or an empty prompt."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}")
    by_length: dict[int, Sequence[int]] = {}
    for p in prompts:
        if not len(p):
            raise ValueError("prefill_floors: an empty prompt has no prefill")
        by_length.setdefault(len(p), p)
    best = {n: float("inf") for n in by_length}
    for i in range(repeats + 1):
        for n, p in sorted(by_length.items()):
            seconds = _prefill_s(model, p)
            if i:  # the first pass warms each shape
                best[n] = min(best[n], seconds)
    return best


def ttft_floors(
    model: Any, prompts: Sequence[Sequence[int]], repeats: int = 5, above_q: float = 0.9
) -> list[float]:
    """Each request's TTFT floor (seconds, in order): :func:`prefill_floors` for the prompts
    at least as long as the ``above_q`` quantile of the lengths (the ones a p95 reads), ``0.0``
    for the shorter ones (a floor too, so every quantile of these is still a floor, and only
    a few lengths are measured, each ``repeats`` times).

    Raises:
        ValueError: what :func:`prefill_floors` raises, or an ``above_q`` outside ``[0, 1]``."""
    if not 0 <= above_q <= 1:
        raise ValueError(f"above_q must be in [0, 1], got {above_q!r}")
    cut = float(np.quantile([len(p) for p in prompts], above_q))
    floor_of = prefill_floors(model, [p for p in prompts if len(p) >= cut], repeats)
    return [floor_of.get(len(p), 0.0) for p in prompts]


def _prefill_s(model: Any, prompt: Sequence[int]) -> float:
    cache = make_prompt_cache(model)
    start = time.perf_counter()
    hidden = model.model(mx.array([list(prompt)]), cache=cache)
    head = model.lm_head if hasattr(model, "lm_head") else model.model.embed_tokens.as_linear
    mx.eval(head(hidden[:, -1:]))
    return time.perf_counter() - start


def ttft_parts(events: pd.DataFrame, spans: Sequence[Span]) -> pd.DataFrame:
    """Per request with a first token: ``uid``, ``ttft_s``, ``queue_s`` (submit to first
    admit), ``own_prefill_s`` (the iterations holding one of its ``prefill`` or ``join``
    events, clipped to admit .. first token) and ``waiting_s`` (the rest of the TTFT);
    seconds. ``queue_s`` and the parts are NaN for an engine that logs no ``admit``."""
    first = lambda kind: events[events.kind == kind].groupby("uid").time_s.min()  # noqa: E731
    submit, admit, token = first("submit"), first("admit"), first("token")
    starts = np.array([s.start_s for s in spans])
    ends = np.array([s.end_s for s in spans])
    own = events[events.kind.isin(["prefill", "join"])]
    rows = []
    for uid, t_first in token.items():
        t_admit = admit.get(uid, np.nan)
        prefill_s = np.nan
        if not np.isnan(t_admit):
            idx = np.unique(np.searchsorted(ends, own[own.uid == uid].time_s.to_numpy(), side="left"))
            idx = idx[idx < len(spans)]
            lo, hi = np.maximum(starts[idx], t_admit), np.minimum(ends[idx], t_first)
            prefill_s = float(np.clip(hi - lo, 0, None).sum())
        ttft_s = t_first - submit[uid]
        queue_s = t_admit - submit[uid]
        rows.append((uid, ttft_s, queue_s, prefill_s, ttft_s - queue_s - prefill_s))
    return pd.DataFrame(rows, columns=["uid", "ttft_s", "queue_s", "own_prefill_s", "waiting_s"])


def gap_parts(events: pd.DataFrame, spans: Sequence[Span]) -> pd.DataFrame:
    """Every inter-token gap (:func:`workbench.observe.metrics.token_gaps`) with
    ``prefill_tokens``: the prefill tokens of the iterations that started after the one that
    read its first token, up to the one that read its second (forwards that ran other rows'
    prefill while this row waited for its next token)."""
    gaps = token_gaps(events)
    starts = np.array([s.start_s for s in spans])
    cum = np.concatenate([[0], np.cumsum([s.prefill_tokens for s in spans], dtype=np.int64)])
    lo = np.searchsorted(starts, gaps.from_s.to_numpy(), side="right")  # after the one that read from_s
    hi = np.searchsorted(starts, gaps.to_s.to_numpy(), side="left")  # up to the one that read to_s
    return gaps.assign(prefill_tokens=cum[np.maximum(hi, lo)] - cum[lo])


def run_parts(events: pd.DataFrame, spans: Sequence[Span]) -> dict[str, float]:
    """One workbench run's :data:`PART_COLUMNS`: the mean ``queue_s``, ``own_prefill_s`` and
    ``waiting_s`` (seconds) of the requests whose TTFT is at or above the p90
    (:func:`ttft_parts`), and of the gaps at or above the ITL p95 (:func:`gap_parts`) the
    share that overlapped a forward carrying prefill and their mean prefill tokens. NaN
    without spans (an engine that records none, such as mlx-lm's)."""
    if not spans:
        return dict.fromkeys(PART_COLUMNS, float("nan"))
    t = ttft_parts(events, spans)
    tail = t[t.ttft_s >= t.ttft_s.quantile(TAIL_TTFT_Q)]
    g = gap_parts(events, spans)
    gtail = g[g.gap_s >= g.gap_s.quantile(TAIL_ITL_Q)]
    return {
        "tail_queue_s": float(tail.queue_s.mean()),
        "tail_own_prefill_s": float(tail.own_prefill_s.mean()),
        "tail_waiting_s": float(tail.waiting_s.mean()),
        "itl_tail_behind_prefill": float((gtail.prefill_tokens > 0).mean()),
        "itl_tail_prefill_tokens": float(gtail.prefill_tokens.mean()),
    }


def goal_verdicts(row: Mapping[str, Any], reference: Mapping[str, Any], against: str = "mlx-lm") -> list[str]:
    """The latency goals of one scenario as Markdown list items: per measure (TTFT, ITL) the
    engine's p95 over ``reference``'s (an mlx-lm engine, named ``against`` in the lines), met
    or missed, and for a missed one its floor's ratio (``ttft_floor_p95_s``, ``itl_floor_s``
    over the reference's p95: above the goal, out of reach of any schedule) and where the
    engine's time went (:data:`PART_COLUMNS`, NaN parts left out); then whether both were
    met at once.

    ``row`` and ``reference``: a scenario's summary rows (``scenario``, ``engine``,
    ``ttft_p95_s``, ``itl_p95_s``, the floors and the parts; seconds)."""
    out, met_all = [], True
    who = f"{row['scenario']}, {row['engine']}"
    for measure, goal in GOALS.items():
        ratio = row[f"{measure}_p95_s"] / reference[f"{measure}_p95_s"]
        met = bool(ratio <= goal)
        met_all &= met
        line = (
            f"- {who}: {measure.upper()} p95 {ratio:.2f}x {against} "
            f"({row[f'{measure}_p95_s'] * 1e3:.1f} against {reference[f'{measure}_p95_s'] * 1e3:.1f} ms; "
            f"goal <= {goal}x): {'met' if met else 'missed'}"
        )
        if not met:
            line += _floor_text(measure, row, reference, goal) + _parts_text(measure, row)
        out.append(line)
    out.append(f"- {who}: both goals at once: {'met' if met_all else 'missed'}")
    return out


def _floor_text(measure: str, row: Mapping[str, float], reference: Mapping[str, float], goal: float) -> str:
    floor_s = row.get("ttft_floor_p95_s" if measure == "ttft" else "itl_floor_s", float("nan"))
    if floor_s is None or np.isnan(floor_s):
        return "; no floor measured"
    ratio = floor_s / reference[f"{measure}_p95_s"]
    what = "each prompt's pure prefill, p95" if measure == "ttft" else "the decode step at the batch size"
    verdict = "out of reach of any schedule here" if ratio > goal else "not ruled out by the floor"
    return f"; floor {ratio:.2f}x ({what}: {floor_s * 1e3:.1f} ms): {verdict}"


def _parts_text(measure: str, row: Mapping[str, float]) -> str:
    if measure == "ttft":
        parts = [row.get(c, float("nan")) for c in PART_COLUMNS[:3]]
        if any(np.isnan(p) for p in parts):
            return ""
        q, p, w = (x * 1e3 for x in parts)
        return (
            f"; the tail (TTFT >= p90) went to queue {q:.1f} ms, its own prefill forwards {p:.1f} ms, "
            f"waiting on other rows' forwards {w:.1f} ms"
        )
    share, tokens = (
        row.get("itl_tail_behind_prefill", float("nan")),
        row.get("itl_tail_prefill_tokens", float("nan")),
    )
    if np.isnan(share):
        return ""
    return (
        f"; {share:.0%} of the gaps >= p95 waited on a forward carrying prefill "
        f"({tokens:.0f} prefill tokens on average)"
    )
