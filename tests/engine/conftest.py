"""Fixtures of the engine tests (the shared ones live in ``tests/conftest.py``)."""

import pytest

import workbench as wb

# (prompt tokens, max_tokens) of five requests: a 1-token prompt, short and long ones
MIXED_SPECS = ((3, 12), (60, 9), (17, 14), (1, 5), (33, 10))


@pytest.fixture
def run_specs(make_sched, prompt):
    """``run_specs(specs=MIXED_SPECS, **scheduler_options)`` submits one request per
    ``(prompt tokens, max_tokens)``, runs to idle and returns ``(tokens by request,
    logprobs by request, report, scheduler)``."""

    def run(specs=MIXED_SPECS, **kwargs):
        sched = make_sched(**kwargs)
        uids = [
            sched.submit(wb.Request(prompt=prompt(n, 13 * i), max_tokens=m)) for i, (n, m) in enumerate(specs)
        ]
        report = sched.run()
        return [sched.tokens(u) for u in uids], [sched.logprobs(u) for u in uids], report, sched

    return run
