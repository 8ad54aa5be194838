"""A long session: does a step cost the same at step 30,000 as at step 3?

Knows: the scheduler's public calls, the bundled tokenizer's prompts. Must not know: the
engine's internals.

One scheduler runs a steady stream of requests (``max_batch`` rows busy, a short queue
kept topped up) through ``run(max_steps=1)`` — the call a notebook or the Panel's "Run N
steps" makes — for ``steps`` decode steps; each call is timed. The event log, the
request map and the history grow all session; the cost of a call must not.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd

from ..engine.request import Request
from ..engine.scheduler import Scheduler
from ..workloads.workload import prompt_of_length


def session_cost(
    model: Any, tokenizer: Any, steps: int, max_batch: int = 4, prompt_tokens: int = 8, max_tokens: int = 16
) -> pd.DataFrame:
    """Seconds of every ``run(max_steps=1)`` call over a session of ``steps`` decode steps.

    Returns one row per call: ``step`` (the step index after it), ``seconds``,
    ``events`` (events logged so far)."""
    sched = Scheduler(model, tokenizer, max_batch=max_batch)
    prompts = [prompt_of_length(tokenizer, prompt_tokens, 37 * i) for i in range(16)]
    rows, submitted = [], 0
    while sched.step_index < steps:
        while len(sched.queue) < 2:
            sched.submit(
                Request(prompt=prompts[submitted % len(prompts)], max_tokens=max_tokens, stop_ids=[])
            )
            submitted += 1
        start = time.perf_counter()
        sched.run(max_steps=1)
        rows.append((sched.step_index, time.perf_counter() - start, len(sched.events)))
    return pd.DataFrame(rows, columns=["step", "seconds", "events"])


def window_medians(session: pd.DataFrame, window: int = 200) -> tuple[float, float]:
    """Median seconds per call over the first and the last ``window`` steps."""
    first = session[session.step <= window].seconds.median()
    last = session[session.step > session.step.max() - window].seconds.median()
    return float(first), float(last)
