"""Running one request alone through the engine: the "same request run alone" oracle of the
top-k, submit_n and on-disk checkpoint tests (every field the engine records for a row)."""

from __future__ import annotations

import workbench as wb


def row_record(sched: wb.Scheduler, uid: int) -> tuple:
    """What a row produced: tokens, log-probs, top-k log-probs, finish reason."""
    view = sched.request(uid)
    return view.tokens, view.logprobs, view.top_logprobs, view.finish_reason


def run_alone(model, tokenizer, request: wb.Request, **settings) -> tuple:
    """``request`` alone on a fresh scheduler (``settings``), run to the end: its
    :func:`row_record`."""
    sched = wb.Scheduler(model, tokenizer, **settings)
    uid = sched.submit(request)
    sched.run()
    return row_record(sched, uid)
