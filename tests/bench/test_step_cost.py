"""The decode step-cost table from hand-built benchmark frames: exact values."""

import pandas as pd
import pytest

from workbench.bench.step_cost import MIB, render_step_cost, step_cost_table, step_cost_text


def frames():
    runs = pd.DataFrame(
        {
            "engine": ["workbench"] * 4 + ["mlx-lm"],
            "B": [1, 1, 4, 4, 1],
            "step_s": [0.09, 0.11, 0.12, 0.12, 1.0],
            "tok_per_s": [10.0, 9.0, 33.0, 33.0, 1.0],
        }
    )
    roofline = pd.DataFrame(
        {
            "case": ["decode B=1", "decode B=4", "bare forward B=4"],
            "B": [1, 4, 4],
            "bytes_per_step": [101 * MIB, 104 * MIB, 999 * MIB],
            "context_tokens": [8, 8, 99],
            "memory_tok_per_s": [12.0, 40.0, 5.0],
        }
    )
    return runs, roofline


def test_the_table_splits_bytes_into_weights_and_kv_and_takes_medians():
    table = step_cost_table(*frames())
    assert table.B.tolist() == [1, 4]
    assert table.step_ms.tolist() == pytest.approx([100.0, 120.0])
    assert table.step_ms_per_row.tolist() == pytest.approx([100.0, 30.0])
    assert table.weights_mib.tolist() == pytest.approx([100.0, 100.0])
    assert table.kv_mib.tolist() == pytest.approx([1.0, 4.0])
    assert table.step_vs_B1.tolist() == pytest.approx([1.0, 1.2])
    assert table.bound_tok_per_s.tolist() == pytest.approx([12.0, 40.0])  # the decode rows' bound
    lines = step_cost_text(table).splitlines()
    assert lines[0] == "B  step (ms)  per row (ms)  tok/s  bound tok/s  read (MiB)  KV (MiB)  step / B=1"
    assert lines[2] == "4      120.0          30.0   33.0         40.0       104.0       4.0        1.20"
    step, rate, read = render_step_cost(table).axes[:3]
    assert rate.get_ylabel() == "tokens / s" and list(rate.get_lines()[0].get_ydata()) == [12.0, 40.0]
    # each tok/s number sits right of its bar, clear of the bound's tick above the bar
    assert [t.xy[0] for t in rate.texts] == pytest.approx([0.3, 1.3]) and rate.get_xlim()[1] > 1.5


def test_an_engine_without_runs_is_refused():
    with pytest.raises(ValueError, match="need runs of 'nobody'"):
        step_cost_table(*frames(), engine="nobody")
