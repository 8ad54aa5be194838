"""Readings of speculative decoding, from the event log only: per row, draft tokens
verified and accepted, acceptance rate, tokens per verify forward.

Knows: events (``draft``, ``token``; :mod:`workbench.observe.events`), pandas. Must not
know: MLX, the scheduler.

A ``draft`` event says how many draft tokens of a row one verify forward checked
(``n_tokens``) and how many it accepted (``n_accepted``); every step is one forward over
all rows, so a row's *tokens per verify forward* is its tokens divided by the steps in
which it produced one (1.0 without speculation; at most ``1 + num_draft_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .events import Event, events_frame

ACCEPTANCE_COLUMNS = [
    "uid",
    "draft_steps",
    "drafted_tokens",
    "accepted_tokens",
    "acceptance_rate",
    "tokens",
    "token_steps",
    "tokens_per_forward",
]


def _frame(events: Sequence[Event] | pd.DataFrame) -> pd.DataFrame:
    return events if isinstance(events, pd.DataFrame) else events_frame(list(events))


def acceptance(events: Sequence[Event] | pd.DataFrame) -> pd.DataFrame:
    """One row per uid that produced a token: ``draft_steps`` (verify forwards with drafts
    of it), ``drafted_tokens``, ``accepted_tokens``, ``acceptance_rate`` (accepted /
    drafted, NaN where nothing was drafted), ``tokens``, ``token_steps`` (steps in which it
    produced a token), ``tokens_per_forward`` (tokens / token_steps).

    Args:
        events: the event log (a list of :class:`Event` or its ``events_frame``).
    """
    ev = _frame(events)
    tok = ev[ev.kind == "token"].groupby("uid").agg(tokens=("step", "size"), token_steps=("step", "nunique"))
    dr = (
        ev[ev.kind == "draft"]
        .groupby("uid")
        .agg(
            draft_steps=("step", "size"),
            drafted_tokens=("n_tokens", "sum"),
            accepted_tokens=("n_accepted", "sum"),
        )
    )
    out = tok.join(dr, how="left").fillna({"draft_steps": 0, "drafted_tokens": 0, "accepted_tokens": 0})
    for name in ("draft_steps", "drafted_tokens", "accepted_tokens"):
        out[name] = out[name].astype(int)
    drafted = out.drafted_tokens.where(out.drafted_tokens > 0)
    out["acceptance_rate"] = out.accepted_tokens / drafted
    out["tokens_per_forward"] = out.tokens / out.token_steps
    return out.reset_index()[ACCEPTANCE_COLUMNS]


def batch_tokens_per_forward(events: Sequence[Event] | pd.DataFrame) -> float:
    """Tokens of all rows per decode step that produced any (each step is one forward
    over the batch): the batch's tokens per verify forward (NaN with no tokens)."""
    tok = _frame(events)
    tok = tok[tok.kind == "token"]
    return float(len(tok) / tok.step.nunique()) if len(tok) else float("nan")


def draft_grid(events: Sequence[Event] | pd.DataFrame) -> tuple[list[int], np.ndarray, np.ndarray]:
    """``(uids, drafted [U, T], accepted [U, T])`` int: per uid (sorted) and decode step
    (``T`` = last draft step + 1) the draft tokens verified and accepted (0 where none)."""
    ev = _frame(events)
    ev = ev[ev.kind == "draft"]
    uids = sorted(int(u) for u in ev.uid.unique())
    T = int(ev.step.max()) + 1 if len(ev) else 0
    drafted, accepted = np.zeros((len(uids), T), np.int64), np.zeros((len(uids), T), np.int64)
    where = {u: i for i, u in enumerate(uids)}
    for e in ev.itertuples():
        drafted[where[e.uid], e.step] += e.n_tokens
        accepted[where[e.uid], e.step] += e.n_accepted
    return uids, drafted, accepted
