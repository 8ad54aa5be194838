"""The paged-KV counterfactual figure: a pure function of the paged table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex

from tests.observe.test_paged import TB, full_group, snapshot
from workbench.observe.paged import paged_table
from workbench.views.paged import MIB, render_paged
from workbench.views.style import figure_png, smallest_text_px


def _table(budget=True):
    snaps = [
        snapshot([full_group([5, 37], width=37, capacity=256)], 2, step=0),
        snapshot([full_group([6, 38, 3], width=38, capacity=256)], 3, step=1),
        snapshot([full_group([39], width=39, capacity=256, free=1)], 1, free=1, step=2),
    ]
    table = paged_table(snaps, blocks=(16, 64))
    return (
        table if budget else table[[c for c in table.columns if "max_batch" not in c and c != "budget_bytes"]]
    )


def test_the_figure_draws_the_table_bytes_waste_and_largest_batch():
    table = _table()
    fig = render_paged(table, title="t")
    bytes_ax, waste_ax, batch_ax = fig.axes
    lines = bytes_ax.get_lines()
    assert [ln.get_linestyle() for ln in lines] == ["-", "--"]  # one line per block size
    np.testing.assert_allclose(lines[0].get_ydata(), table.paged_bytes_b16 / MIB)
    # the stacked padded parts end at the padded bytes (the cache's nbytes) at every step
    top = bytes_ax.collections[-1].get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(table.padded_bytes.max() / MIB)
    assert table.padded_bytes.tolist() == [2 * 256 * TB, 3 * 256 * TB, 2 * 256 * TB]
    padded_waste = waste_ax.get_lines()[0].get_ydata()
    np.testing.assert_allclose(padded_waste, 100 * (1 - table.padded_data_bytes / table.padded_bytes))
    np.testing.assert_allclose(batch_ax.get_lines()[0].get_ydata(), table.padded_max_batch.astype(float))
    assert batch_ax.get_lines()[-1].get_ydata().tolist() == [2, 3, 1]  # rows running


def test_the_legend_sits_below_the_panels_and_covers_no_data():
    fig = render_paged(_table())
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    assert all(not legend.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)
    assert min(t.get_fontsize() for t in fig.legends[0].get_texts()) >= 9
    assert fig.get_figwidth() * 100 <= 968  # fits a JupyterLab output area at the inline 100 dpi, unscaled
    assert fig.get_figheight() * 100 <= 700  # and its height, legend included, a 1400 x 900 window's
    assert smallest_text_px(fig, 100) >= 12.5  # 9 pt and more


def test_without_budget_columns_there_are_two_panels_and_a_bad_x_is_named():
    assert len(render_paged(_table(budget=False)).axes) == 2
    with pytest.raises(KeyError, match="time_s"):
        render_paged(_table(), x="time_s")


def test_the_figure_is_a_pure_function_of_the_table():
    table = _table()
    before = table.copy()
    first = figure_png(render_paged(table, title="t"))
    pd.testing.assert_frame_equal(table, before)  # the table is not changed
    assert figure_png(render_paged(table.copy(), title="t")) == first


def test_one_steps_layouts_are_bars_of_kib_with_only_the_parts_present_in_the_legend():
    from workbench.observe.paged import step_layout
    from workbench.views import style
    from workbench.views.paged import render_step_layout

    layout = step_layout(snapshot([full_group([5, 37], width=37, capacity=256)], 2), blocks=(1, 16))
    fig = render_step_layout(layout, title="two rows")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["padded (mlx-lm)", "paged, b=1", "paged, b=16"]
    # each bar ends in its total in KiB: 2 rows x 256 positions; 42 tokens; (1 + 3) blocks of 16
    assert [t.get_text() for t in ax.texts] == ["1,024 KiB", "84 KiB", "128 KiB"]
    outlines = [p for p in ax.patches if not p.get_fill()]
    assert [p.get_width() for p in outlines] == pytest.approx(
        [512 * TB / 1024, 42 * TB / 1024, 64 * TB / 1024]
    )
    assert [to_hex(p.get_edgecolor()) for p in outlines] == [style.PADDED_LAYOUT] + [style.PAGED_LAYOUT] * 2
    # no free slot in this step: no "free slots" entry; b=16 wastes 11 + 11 positions: hatched entry
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "tokens",
        "padded: left padding",
        "padded: growth step",
        "paged: last block's unused part",
    ]
    with pytest.raises(KeyError, match="padded_bytes and paged_bytes"):
        render_step_layout({"step": 0})
