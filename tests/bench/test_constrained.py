"""The structured-output cost command (``python -m workbench.bench.constrained``) measures what
it says: one row's mask per step for each constraint kind over a real constrained output,
and decode steps with k constrained rows of B in which every row ran every step."""

import pytest

from workbench.bench import constrained as bench

pytestmark = pytest.mark.model


def test_mask_cost_times_every_step_of_each_kinds_output(bundled, prompt):
    model, tok = bundled
    rows = bench.mask_cost(model, tok, prompt(8), max_tokens=12)
    assert [r["kind"] for r in rows] == list(bench.KINDS)
    for r in rows:
        assert 1 <= r["steps"] <= 12 and 0 < r["mask_us_median"] <= r["mask_us_p95"]
    assert (
        next(r for r in rows if r["kind"] == "long regex")["steps"] == 12
    )  # it cannot complete in 12 tokens


def test_step_cost_reports_each_k_against_the_free_step(bundled, prompt):
    model, tok = bundled
    rows = bench.step_cost(model, tok, [prompt(8, 30 * i) for i in range(3)], ks=[0, 3], steps=4, rounds=1)
    assert [(r["B"], r["k"]) for r in rows] == [(3, 0), (3, 3)]
    assert rows[0]["vs_free"] == 1.0 and rows[0]["mask_ms"] == 0  # no constrained row: no mask
    assert (
        0 < rows[1]["mask_ms"] < rows[1]["step_ms"]
        and rows[1]["mask_share"] == rows[1]["mask_ms"] / rows[1]["step_ms"]
    )
