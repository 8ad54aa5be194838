"""Top-2 margins: the near-tie count is exact on hand-built traces, and the bundled
trained model rarely nearly ties over the demo workload (so its oracle checks are sharp)."""

import numpy as np
import pytest

from workbench.verify.margins import NEAR_TIE_MARGIN, demo_margins, margin_report
from workbench.verify.oracle import TokenTrace


def test_margins_below_the_threshold_count_as_near_ties_pooled_over_traces():
    a = TokenTrace(tokens=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3], margins=[0.5, 0.0009, 2.0])
    b = TokenTrace(tokens=[4, 5], logprobs=[-0.1, -0.1], margins=[0.001, 0.0])
    report = margin_report([a, b])
    assert report.n_steps == 5 and report.n_near_ties == 2  # 0.0009 and 0.0; 0.001 is not below
    assert report.near_tie_rate == pytest.approx(0.4)
    assert report.text().startswith("near-ties (top-2 margin < 1e-03): 2 of 5 decode steps (40.00%)")


def test_no_traces_give_a_zero_rate():
    report = margin_report([])
    assert report.n_steps == 0 and report.near_tie_rate == 0.0 and "no decode steps" in report.text()


@pytest.mark.model
def test_bundled_model_nearly_ties_in_under_one_percent_of_demo_decode_steps(bundled):
    report = demo_margins(*bundled)
    assert report.n_steps >= 300
    assert report.near_tie_rate < 0.01, report.text()
    assert np.isfinite(report.margins).all() and report.threshold == NEAR_TIE_MARGIN
