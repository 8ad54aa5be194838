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


def test_an_engine_without_runs_is_refused():
    with pytest.raises(ValueError, match="need runs of 'nobody'"):
        step_cost_table(*frames(), engine="nobody")


def test_the_figures_labels_clear_the_bound_tick_and_the_per_row_marker_and_kv_is_the_views_blue():
    """00's picture: B=1's tok/s label sat on the bound's tick (12 vs 10 here), its step label on
    the per-row marker (the same value at B = 1), and the KV slice was a colour of its own."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import to_hex

    from workbench.bench.step_cost import BOUND_MARKER_PT
    from workbench.views import style

    fig = render_step_cost(step_cost_table(*frames()))
    FigureCanvasAgg(fig).draw()
    step, rate, read = fig.axes[:3]
    to_px = rate.transData.transform
    label = next(t for t in rate.texts if t.get_text() == "10").get_window_extent()
    tick_top = to_px((0, 12.0))[1] + 2.5 / 2 * fig.dpi / 72
    assert label.y0 > tick_top  # above the tick, not crossed by it
    marker = step.transData.transform((0, 100.0))  # B=1: per row == the step
    step_label = next(t for t in step.texts if t.get_text() == "100").get_window_extent()
    assert not step_label.expanded(1.0, 1.0).contains(*marker) and step_label.y1 < marker[1] - 6
    legend = rate.get_legend()
    tick = next(h for h in legend.legend_handles if h.get_label() == "memory bound")
    assert tick.get_markersize() <= legend.handlelength * legend.prop.get_size_in_points()
    assert tick.get_markersize() == pytest.approx(0.6 * BOUND_MARKER_PT)
    assert to_hex(read.patches[-1].get_facecolor()) == style.ATTENDED  # the KV slice
