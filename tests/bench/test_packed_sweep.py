"""The token-budget sweep of the packed layout's hybrid schedule (Sarathi-Serve's lever):
its engines and its table."""

import pandas as pd
import pytest

from workbench.bench.packed_sweep import sweep_factories, sweep_table


@pytest.mark.model
def test_the_sweep_runs_the_hybrid_schedule_at_each_budget_and_decode_first_beside_it(bundled):
    model, tok = bundled
    fac = sweep_factories(model, tok, (64, 256))
    assert list(fac) == ["hybrid, 64", "hybrid, 256", "decode-first, 512"]
    configs = [fac[name]().sched.config for name in fac]
    assert [(c.layout, c.token_budget, c.packed_schedule) for c in configs] == [
        ("packed", 64, "hybrid"),
        ("packed", 256, "hybrid"),
        ("packed", 512, "decode-first"),
    ]


def test_the_sweep_table_gives_each_engines_median_over_rounds():
    summary = pd.DataFrame(
        [
            dict(engine="hybrid, 64", ttft_p50_s=1.0, ttft_p95_s=3.0, itl_p50_s=0.010, itl_p95_s=0.05)
            | dict(itl_p99_s=0.2, throughput_tok_per_s=40.0),
            dict(engine="hybrid, 64", ttft_p50_s=2.0, ttft_p95_s=5.0, itl_p50_s=0.020, itl_p95_s=0.07)
            | dict(itl_p99_s=0.4, throughput_tok_per_s=50.0),
        ]
    )
    assert sweep_table(summary).splitlines()[2] == "| hybrid, 64 | 1.5 | 4.0 | 15.0 | 60 | 300 | 45.0 |"
