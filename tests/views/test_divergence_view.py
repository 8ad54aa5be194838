"""The divergence-by-layer view: exact text of a hand-built table, and a figure whose
markers, colours and labels follow the table."""

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from workbench.verify.layers import layer_table
from workbench.verify.rerun import StepRecord
from workbench.views.divergence import OVER, WITHIN, divergence_text, render_divergence
from workbench.views.style import figure_png


def table():
    """3 layers, P = 2: layer 1's output and its cache at position 1 over tolerance."""
    solo = StepRecord(
        np.array([[1.0, -2.0], [4.0, 0.0], [10.0, 1.0]], np.float32),
        [np.array([[1.0], [1.0], [2.0]], np.float32), np.array([[3.0], [1.0], [1.0]], np.float32), None],
        np.zeros(2, np.float32),
    )
    batched = StepRecord(
        np.array([[1.0, -2.0], [4.0, 0.5], [10.5, 1.0]], np.float32),
        [np.array([[1.0], [1.0], [2.0]], np.float32), np.array([[3.0], [1.5], [1.0]], np.float32), None],
        np.zeros(2, np.float32),
    )
    return layer_table(batched, solo, position=2, rtol=0.1)


def test_the_text_form_lists_each_layers_verdict_and_positions():
    assert divergence_text(table()) == "\n".join(
        [
            "layer  over  first position  positions",
            "    0    no               -  -",
            "    1   YES               1  1-2",
            "    2    no               -  -",
        ]
    )


def test_the_figure_colours_over_tolerance_markers_and_names_the_first_layer():
    fig = render_divergence(table(), title="uid 0")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    dots, crosses, squares, hollow_crosses = ax.collections[:4]
    to_hex = lambda rgba: "#" + "".join(f"{round(c * 255):02x}" for c in rgba[:3])
    assert {to_hex(c) for c in dots.get_facecolors()} == {WITHIN}
    assert {to_hex(c) for c in crosses.get_facecolors()} == {OVER}
    assert {to_hex(c) for c in squares.get_edgecolors()} == {WITHIN}
    assert {to_hex(c) for c in hollow_crosses.get_edgecolors()} == {OVER}
    assert dots.get_offsets()[:, 0].tolist() == [0, 2] and crosses.get_offsets()[:, 0].tolist() == [1]
    # the verdict is in the shape too, not only the colour (a cross, not a circle)
    assert len(crosses.get_paths()[0].vertices) != len(dots.get_paths()[0].vertices)
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["first over tolerance: layer 1\npositions 1-2"]
    assert ax.get_yscale() == "log" and ax.get_title(loc="left") == "uid 0"
    assert min(t.get_fontsize() for t in ax.texts + ax.get_xticklabels() + [ax.xaxis.label]) >= 9
    assert figure_png(fig)[:4] == b"\x89PNG"


def test_a_table_within_tolerance_says_so_and_an_empty_one_is_refused():
    t = table()
    t["over"] = False
    assert [x.get_text() for x in render_divergence(t).axes[0].texts] == ["every layer within tolerance"]
    with pytest.raises(ValueError, match="empty"):
        render_divergence(pd.DataFrame(columns=t.columns))


def _legend_labels(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def test_the_legend_lists_only_the_verdicts_drawn():
    assert {"within tolerance", "over tolerance"} <= set(_legend_labels(render_divergence(table())))
    t = table()
    t["tolerance"], t["kv_tolerance"], t["over"] = 1e9, 1e9, False  # every layer far within
    labels = _legend_labels(render_divergence(t))
    assert "within tolerance" in labels and "over tolerance" not in labels
