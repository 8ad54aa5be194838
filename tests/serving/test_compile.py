"""MLX's compile is off while any server's engine thread runs (a compiled function on a second
thread can abort the interpreter at exit, docs/serve.md) and on again after the last stops."""

from __future__ import annotations

import mlx.core as mx

import workbench as wb


def test_compile_stays_off_until_the_last_server_stops(bundled):
    traces = []

    @mx.compile
    def double(x):
        traces.append(1)  # runs at each trace: every call when compile is off, once when on
        return x * 2

    def traced_calls() -> int:
        before = len(traces)
        for _ in range(2):
            mx.eval(double(mx.ones(2)))
        return len(traces) - before

    first = wb.serve(wb.Scheduler(*bundled), port=0)
    second = wb.serve(wb.Scheduler(*bundled), port=0)
    second.stop()
    assert traced_calls() == 2  # the first server still runs: compile off
    first.stop()
    first.stop()  # idempotent: stopping twice does not count twice
    traced_calls()
    assert traced_calls() == 0  # compiled and cached again
