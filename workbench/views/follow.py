"""The events a snapshot had seen: what the panel's prefill and timeline panes draw for the
snapshot its history slider shows, so they follow the slider call by call, not step by step.

Knows: the event log frame (:func:`workbench.observe.events.events_frame`) and a
:class:`~workbench.observe.snapshot.Snapshot`'s ``step``, ``uids``, ``queue`` and
``prefilling``. Must not know: the engine. A pure function of both.

Three snapshots of one ``run()`` iteration share a step index ``s``: after ``step()``
(its tokens were logged with step ``s - 1``), after ``filter()`` (its evictions carry step
``s``) and after ``admit()`` (its submits, admissions, prefill chunks and joins carry step
``s``). Cutting the log at ``step <= s`` would show the later admit's prefill on the two
earlier snapshots; :func:`seen_by` keeps an event of step ``s`` only where the snapshot shows
its effect::

    evict   u   its row is gone (u not among the snapshot's rows)
    submit  u   u is in the snapshot: queued, prefilling or a row
    preempt u   u is queued again, prefilling or a row that joined at step s (re-admitted)
    admit   u   u is prefilling or a row that joined at step s
    prefill u   u is a row that joined at step s, or prefilling with this chunk's tokens done
                (a chunk with no real token of u, ``n_tokens=0``: u rode in a batched group's
                later chunk on a GPU, docs/gpu.md; kept where that chunk of the group is done,
                i.e. a member's real-token event of the same chunk is kept)
    join    u   u is a row (it joined at step s)
    token, finish, draft   never (a step's tokens land in the next step's snapshots)
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def seen_by(events: pd.DataFrame, snap) -> np.ndarray:
    """Boolean mask over ``events`` (a frame in log order): True for the events logged
    before ``snap`` was recorded (module docstring): every event of an earlier step, and
    those of step ``snap.step`` whose effect the snapshot shows."""
    rows = set(snap.uids)
    prefilled = {int(u): int(done) for u, done, *_ in snap.prefilling}
    present = rows | set(snap.queue) | set(prefilled)
    here = (events.step == snap.step).to_numpy()
    keep = (events.step < snap.step).to_numpy().copy()
    done, nth = _prefill_chunks(events)
    joined = rows & set(
        events.uid[here & (events.kind == "join").to_numpy()]
    )  # rows that joined at this step
    queued = set(snap.queue)
    for i in np.flatnonzero(here):
        e = events.iloc[i]
        u = int(e.uid)
        if e.kind == "evict":
            keep[i] = u not in rows
        elif e.kind == "submit":
            keep[i] = u in present
        elif e.kind in ("admit", "preempt"):
            keep[i] = u in joined or u in prefilled or (e.kind == "preempt" and u in queued)
        elif e.kind == "prefill":
            keep[i] = u in joined or (u in prefilled and _chunk_done(events, i, done, nth, prefilled))
        elif e.kind == "join":
            keep[i] = u in joined
    return keep


def _prefill_chunks(events: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per ``prefill`` event (indexed as ``events``): its uid's real prompt tokens prefilled
    so far in this admission (a re-admitted row prefills again from 0), and the chunk's
    ordinal in that admission (1, 2, ...: a batched group's members log one event per chunk)."""
    admission = (events.kind == "admit").astype(int).groupby(events.uid).cumsum()
    chunks = events[events.kind == "prefill"]
    by = [chunks.uid, admission[chunks.index]]
    return chunks.n_tokens.astype(int).groupby(by).cumsum(), chunks.groupby(by).cumcount() + 1


def _chunk_done(events: pd.DataFrame, i: int, done: pd.Series, nth: pd.Series, prefilled: dict) -> bool:
    """Whether the prefill event at position ``i`` (its uid prefilling in the snapshot, whose
    real prompt tokens done per uid are ``prefilled``) ran before the snapshot: its tokens
    are done; for a chunk with none of its uid's tokens (``n_tokens=0``), a member of the
    group with real tokens in the same chunk (same step and ordinal) has them done."""
    label = events.index[i]
    if events.n_tokens.iloc[i] > 0:
        return bool(done.loc[label] <= prefilled[int(events.uid.iloc[i])])
    same = nth.index[(nth == nth.loc[label]).to_numpy()]
    for j in same:
        e = events.loc[j]
        if e.step == events.step.iloc[i] and e.n_tokens > 0 and int(e.uid) in prefilled:
            return bool(done.loc[j] <= prefilled[int(e.uid)])
    return False


def events_seen_by(events: pd.DataFrame, snap) -> pd.DataFrame:
    """The rows of ``events`` that :func:`seen_by` keeps for ``snap``."""
    return events[seen_by(events, snap)]
