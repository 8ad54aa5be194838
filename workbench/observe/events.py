"""Events: the typed log of everything the scheduler did.

Knows: the event kinds and their fields. Must not know: MLX, caches, metrics.
Every metric (TTFT, TPOT, E2E, queue time, throughput) is computed from this log by
:mod:`workbench.observe.metrics`, so no counter can drift from what happened.

Kinds (``Event.kind``):

============  ==============================================================
``submit``    request accepted into the queue; ``n_tokens`` = prompt tokens
``admit``     request left the queue to be prefilled; ``n_tokens`` = tokens to
              run (prompt, plus generated tokens when resuming), ``n_cached`` =
              those found in the prompt cache
``prefill``   one prefill chunk of ``uid``; ``n_tokens`` = its real (non-pad)
              prompt tokens in the chunk
``join``      the prefilled row entered the running batch at ``row``;
              ``join_mode`` says how: ``new batch`` (no batch was running),
              ``free slot`` (written into an evicted row's cache row) or
              ``extend`` (appended by the caches' ``extend``) or ``packed`` (the
              packed layout: its last prompt chunk gave its first token)
``token``     one generated token for ``uid`` at ``row``; ``logprob`` of it;
              ``top_logprobs`` its request's ``k`` best ``((id, log-prob), ...)``,
              best first (``()`` when it asked none)
``finish``    the request is done; ``finish_reason`` is ``stop``, ``length``,
              ``error`` (``message`` says why) or ``abort``
``evict``     the finished row left the batch at ``filter`` (was ``row``)
``preempt``   the running row's cache was dropped and the request re-queued;
              ``n_tokens`` = tokens generated so far (kept; it resumes)
``draft``     a speculative step verified ``n_tokens`` draft tokens of ``uid`` at
              ``row`` and accepted ``n_accepted`` of them (logged before that step's
              token events; ``Scheduler(speculative=...)``)
============  ==============================================================

``message`` carries error text only (a ``finish`` with reason ``error``).

``step`` is the scheduler's decode-step index at the time of the event (the number of
decode steps completed before it); ``time_s`` is the injected clock in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter

import pandas as pd

EVENT_KINDS = ("submit", "admit", "prefill", "join", "token", "finish", "evict", "preempt", "draft")
JOIN_MODES = ("new batch", "extend", "free slot", "packed")


@dataclass(frozen=True)
class Event:
    """One record of the event log (see the module docstring for the kinds)."""

    kind: str
    uid: int
    step: int
    time_s: float
    row: int = -1
    token: int = -1
    logprob: float = float("nan")
    n_tokens: int = 0
    n_cached: int = 0
    finish_reason: str = ""
    join_mode: str = ""
    message: str = ""
    top_logprobs: tuple = ()
    n_accepted: int = 0

    def __post_init__(self):
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"Event.kind must be one of {EVENT_KINDS}, got {self.kind!r}")
        if self.join_mode and (self.kind != "join" or self.join_mode not in JOIN_MODES):
            raise ValueError(
                f"Event.join_mode must be one of {JOIN_MODES} (join events only) or '', "
                f"got {self.join_mode!r} for kind {self.kind!r}"
            )


EVENT_COLUMNS = [f.name for f in fields(Event)]


def events_frame(events: list[Event]) -> pd.DataFrame:
    """The events as a DataFrame with one row per event and columns ``EVENT_COLUMNS``."""
    row = attrgetter(*EVENT_COLUMNS)  # an Event's fields hold no dataclass: asdict's deep copy only cost time
    return pd.DataFrame([row(e) for e in events], columns=EVENT_COLUMNS)
