"""The child process of ``test_sigint.py``: ``sched.run()`` on a long workload, interrupted
by real SIGINTs from the parent, as "Kernel → Interrupt" interrupts a notebook.

Protocol (one line each, on stdout): ``READY <seconds>`` once the uninterrupted reference
run is done (its duration, so the parent can time its signals), then for every
KeyboardInterrupt that lands in ``run()``: ``INTERRUPTED <json>`` (``check()`` report,
step index); when ``run()`` completes: ``RESULT <json>`` (tokens by uid of the interrupted
and the reference run, finish reasons, the final check).

Run: ``python -m tests.engine.interrupted_run``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

os.environ.setdefault("WORKBENCH_BLAS", "off")

import workbench as wb  # noqa: E402
from workbench.runtime.loading import DATA_DIR  # noqa: E402
from workbench.workloads.workload import prompt_of_length  # noqa: E402

N_REQUESTS = 24


def submit_workload(sched, tok) -> list[int]:
    """Prompts of 3..70 tokens, 24..60 new tokens each, greedy, no stop ids."""
    return [
        sched.submit(
            wb.Request(
                prompt=prompt_of_length(tok, 3 + (17 * i) % 68, 41 * i),
                max_tokens=24 + (7 * i) % 37,
                stop_ids=[],
            )
        )
        for i in range(N_REQUESTS)
    ]


def say(line: str) -> None:
    print(line, flush=True)


def main() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt, as in a kernel
    model, tok = wb.load(DATA_DIR / "models" / "tiny-llama")
    options = dict(max_batch=4, prefill_step_size=16, prompt_cache=4)
    reference = wb.Scheduler(model, tok, **options)
    submit_workload(reference, tok)
    started_s = time.perf_counter()
    reference.run()
    say(f"READY {time.perf_counter() - started_s:.3f}")

    sched = wb.Scheduler(model, tok, **options)
    uids = submit_workload(sched, tok)
    while True:
        try:
            sched.run()
            break
        except KeyboardInterrupt:
            report = sched.check()
            say(
                "INTERRUPTED "
                + json.dumps({"ok": report.ok, "report": str(report), "step": sched.step_index})
            )
    report = sched.check()
    say(
        "RESULT "
        + json.dumps(
            {
                "tokens": {u: sched.tokens(u) for u in uids},
                "reference": {u: reference.tokens(u) for u in uids},
                "finish": {u: sched.finish_reason(u) for u in uids},
                "ok": report.ok,
                "report": str(report),
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
