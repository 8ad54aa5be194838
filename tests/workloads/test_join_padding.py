"""The padding a mid-decode join adds, measured on the engine against the formula
``max(0, w - n) + (B - 1) max(0, n - w)``, and its figure."""

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

import workbench as wb
from workbench.views.join import render_join_padding
from workbench.workloads.join_padding import join_padding_formula, join_padding_table
from workbench.workloads.workload import prompt_maker


@pytest.fixture(scope="module")
def table(bundled):
    model, tokenizer = bundled
    prompt = prompt_maker(tokenizer)
    return join_padding_table(
        lambda B: wb.Scheduler(model, tokenizer, max_batch=B),
        prompt,
        batch_sizes=(2, 5),
        prompt_tokens=(3, 14, 30),
    )


def test_the_engine_pads_a_join_as_the_formula_says_on_both_sides_of_the_running_width(table):
    assert set(table.kv_width_tokens) == {14}  # 10 prompt tokens + 4 decode steps
    assert table.added_padding.tolist() == table.formula.tolist()
    short, long_ = table[table.prompt_tokens == 3], table[table.prompt_tokens == 30]
    assert short.added_padding.tolist() == [11, 11]  # the joiner pads itself, whatever B
    assert long_.added_padding.tolist() == [16, 64]  # every running row: (B - 1)(n - w)
    assert table[table.prompt_tokens == 14].added_padding.tolist() == [0, 0]


def test_the_formula_and_bad_batch_sizes():
    assert join_padding_formula(8, 44, 14) == 7 * 30 and join_padding_formula(8, 1, 14) == 13
    with pytest.raises(ValueError, match="batch_sizes must be >= 2"):
        join_padding_table(lambda B: None, lambda n, s: [1] * n, batch_sizes=(1,))


def test_the_figure_draws_a_line_per_batch_size_through_the_measured_points(table):
    fig = render_join_padding(table, title="join")
    ax = fig.axes[0]
    lines = [line for line in ax.lines if line.get_linestyle() == "-"]
    dots = [line for line in ax.lines if line.get_marker() == "o"]
    assert [line.get_label() for line in lines] == ["B = 2 rows", "B = 5 rows"]
    for line, dot in zip(lines, dots):
        np.testing.assert_array_equal(line.get_ydata(), dot.get_ydata())  # measured == formula
    label = next(t for t in ax.texts if "KV width w = 14" in t.get_text())
    FigureCanvasAgg(fig).draw()
    assert label.get_window_extent().y1 <= ax.get_window_extent().y1 - 3  # clear of the frame (it touched it)
    with pytest.raises(ValueError, match="at least one"):
        render_join_padding(table.iloc[:0])
