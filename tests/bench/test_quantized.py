"""The quantized-KV section (workbench.bench.quantized) and its view: exact bytes, the
step-time table's shape, admission under one budget, the figure and text forms."""

import pytest

from workbench.bench.model import QUICK, make_model
from workbench.bench.quantized import (
    ADMISSION_COLUMNS,
    STEP_COLUMNS,
    _quartiles,
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
        model, rows=2, context_tokens=16, settings=[(None, 32), (4, 32)], repeats=3, warm_steps=0
    )
    assert tuple(table.columns) == STEP_COLUMNS and table.setting.tolist() == ["float", "q4/g32"]
    assert (table.step_s > 0).all() and table.vs_float.iloc[0] == 1.0
    assert ((table.step_s_p25 <= table.step_s) & (table.step_s <= table.step_s_p75)).all()
    assert table.load_1min.nunique() == 1 and table.load_1min.iloc[0] >= 0  # one load for the run
    assert table.kv_bytes.iloc[1] * 128 == table.kv_bytes.iloc[0] * 24  # head dim 32: 24 of 128 bytes


def test_quartiles_of_the_repeats():
    assert _quartiles([5.0, 1.0, 3.0, 2.0, 4.0]) == (3.0, 2.0, 4.0)  # median, 25th, 75th
    assert _quartiles([0.5]) == (0.5, 0.5, 0.5)


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


def frames(step_group: int):
    """A step table at ``kv_group_size=step_group`` (median 12 ms, quartiles 11 and 15,
    load 1.5) and an admission table at group 32 under a 1.25 MiB budget."""
    import pandas as pd

    steps = pd.DataFrame(
        [
            ("float", 8, 256, 100, 0.010, 0.009, 0.011, 1.5, 1.0),
            (f"q4/g{step_group}", 8, 256, 16, 0.012, 0.011, 0.015, 1.5, 1.2),
        ],
        columns=STEP_COLUMNS,
    )
    admission = pd.DataFrame(
        [("float", 1310720, 5, 2, 9, 2.0), ("q4/g32", 1310720, 1, 9, 3, 6.0)], columns=ADMISSION_COLUMNS
    )
    return steps, admission


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


@pytest.mark.quantized_kv
def test_the_view_draws_three_panels_and_prints_the_tables(bundled):
    model, tokenizer = bundled
    sizes = bytes_per_token(model, TINY)
    steps, admission = frames(64)  # one row per setting, as the tables print
    fig = render_quantized(
        steps, admission, bytes_table=sizes, model_name="tiny-code", step_model_name="llama-155m"
    )
    assert len(fig.axes) == 3
    assert [round(b.get_height()) for b in fig.axes[0].patches] == [2560, 800, 480]
    assert [round(b.get_height(), 1) for b in fig.axes[1].patches] == [10.0, 12.0]  # ms
    text = quantized_text(sizes, steps, admission)
    assert "q4/g32" in text and "0.1875" in text and "12" in text


def test_without_the_bytes_table_two_panels_name_every_setting_with_its_group():
    steps, admission = frames(64)
    fig = render_quantized(steps, admission, step_model_name="llama-155m")
    step, rows = fig.axes
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["float", "q4/g64 = 4-bit, group 64", "q4/g32 = 4-bit, group 32"]
    steps32, _ = frames(32)
    legend32 = [t.get_text() for t in render_quantized(steps32, admission).legends[0].get_texts()]
    assert legend32 == ["float", "q4/g32 = 4-bit, group 32"]  # one group: one entry per bits


def test_the_step_panel_draws_the_spread_and_the_load():
    steps, admission = frames(32)
    step, _ = render_quantized(steps, admission, step_model_name="llama-155m").axes
    whiskers = [seg for c in step.collections for seg in c.get_segments()]  # one per bar
    assert sorted(tuple(round(y, 1) for y in seg[:, 1]) for seg in whiskers) == [
        (9.0, 11.0),
        (11.0, 15.0),
    ]
    assert "load average 1.5" in step.get_title() and "middle half" in step.get_title()
    assert texts(step) == ["x1.20"]  # the quantized bar's ratio, above its whisker
    assert step.texts[0].xy[1] == pytest.approx(15.0)


def test_the_rows_panel_writes_the_budget_in_mib_and_names_tokens_per_step():
    steps, admission = frames(32)
    _, rows = render_quantized(steps, admission).axes
    assert "1.25 MiB" in rows.get_title() and "1310720" not in rows.get_title().replace(",", "")
    assert texts(rows) == ["mean 2 tok/step", "mean 6 tok/step"]
