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
    chunks = events[events.kind == "prefill"]
    done = chunks.n_tokens.astype(int).groupby(chunks.uid).cumsum()  # each chunk's total so far
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
            keep[i] = u in joined or (u in prefilled and done.loc[events.index[i]] <= prefilled[u])
        elif e.kind == "join":
            keep[i] = u in joined
    return keep


def events_seen_by(events: pd.DataFrame, snap) -> pd.DataFrame:
    """The rows of ``events`` that :func:`seen_by` keeps for ``snap``."""
    return events[seen_by(events, snap)]
