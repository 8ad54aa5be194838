"""The quantized-KV section (workbench.bench.quantized) and its view: exact bytes, the
step-time table's shape, admission under one budget, the figure and text forms."""

import pytest

from workbench.bench.model import QUICK, make_model
from workbench.bench.quantized import (
    ADMISSION_COLUMNS,
    STEP_COLUMNS,
    admission_under_budget,
    bytes_per_token,
    step_cost,
)
from workbench.views.quantized import quantized_text, render_quantized

pytestmark = pytest.mark.model

TINY = [(None, 32), (8, 32), (4, 32)]


def test_bytes_per_token_are_the_packed_scales_and_biases(bundled):
    model, _ = bundled
    table = bytes_per_token(model, TINY)
    # 5 layers x (K, V) x 2 heads x (32 float32 = 128 B | 32 B + 8 B | 16 B + 8 B)
    assert table.bytes_per_token.tolist() == [2560, 800, 480]
    assert table.vs_float.tolist() == [1.0, 0.3125, 0.1875]


@pytest.mark.quantized_kv
def test_step_cost_measures_each_setting_over_the_same_geometry():
    model = make_model(QUICK)
    table = step_cost(
        model, rows=2, context_tokens=16, settings=[(None, 32), (4, 32)], repeats=1, warm_steps=0
    )
    assert tuple(table.columns) == STEP_COLUMNS and table.setting.tolist() == ["float", "q4/g32"]
    assert (table.step_s > 0).all() and table.vs_float.iloc[0] == 1.0
    assert table.kv_bytes.iloc[1] * 128 == table.kv_bytes.iloc[0] * 24  # head dim 32: 24 of 128 bytes


@pytest.mark.quantized_kv
def test_a_quantized_cache_runs_more_rows_under_the_same_budget(bundled):
    model, tokenizer = bundled
    table = admission_under_budget(model, tokenizer, TINY, n_requests=8, prompt_tokens=24, max_tokens=6)
    assert tuple(table.columns) == ADMISSION_COLUMNS and table.kv_budget_bytes.nunique() == 1
    assert (
        table.request_bytes.iloc[0] == table.kv_budget_bytes.iloc[0] // 2
    )  # budget_requests=2 float requests
    rows, steps = table.max_rows.tolist(), table.decode_steps.tolist()
    assert rows[0] == 2 and rows[0] < rows[1] < rows[2]
    assert steps[0] > steps[1] > steps[2]


@pytest.mark.quantized_kv
def test_the_view_draws_three_panels_and_prints_the_tables(bundled):
    import pandas as pd

    model, tokenizer = bundled
    sizes = bytes_per_token(model, TINY)
    # one row per setting, as the tables print
    steps = pd.DataFrame(
        [("float", 8, 256, 100, 0.010, 1.0), ("q4/g64", 8, 256, 16, 0.012, 1.2)], columns=STEP_COLUMNS
    )
    admission = pd.DataFrame(
        [("float", 10, 5, 2, 9, 2.0), ("q4/g32", 10, 1, 9, 3, 6.0)], columns=ADMISSION_COLUMNS
    )
    fig = render_quantized(sizes, steps, admission, "tiny-code", "llama-155m")
    assert len(fig.axes) == 3
    assert [round(b.get_height()) for b in fig.axes[0].patches] == [2560, 800, 480]
    assert [round(b.get_height(), 1) for b in fig.axes[1].patches] == [10.0, 12.0]  # ms
    text = quantized_text(sizes, steps, admission)
    assert "q4/g32" in text and "0.1875" in text and "12" in text
