"""The quantized-KV effect view (workbench.views.quantized): token agreement with the float
run position by position, its text form, and the figure's bars and token grid."""

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from workbench.views import style
from workbench.views.quantized import quantized_tokens_text, render_quantized_effect, token_agreement

TOKENS = {
    "float": {0: [5, 6, 7, 8], 1: [1, 2]},
    "q8/g32": {0: [5, 6, 7, 8], 1: [1, 2]},
    "q4/g32": {0: [5, 6, 9, 9], 1: [1]},  # uid 0 differs from position 2, uid 1 stops early
}
BYTES = pd.DataFrame({"setting": ["float", "q8/g32", "q4/g32"], "bytes_per_token": [2560, 800, 480]}).assign(
    vs_float=lambda t: t.bytes_per_token / 2560
)


def test_agreement_is_per_position_of_the_reference_row_and_a_shorter_row_differs_past_its_end():
    assert token_agreement(TOKENS) == {
        "q8/g32": {0: [True] * 4, 1: [True, True]},
        "q4/g32": {0: [True, True, False, False], 1: [True, False]},
    }
    with pytest.raises(KeyError):
        token_agreement({"q4/g32": {0: [1]}})


def test_the_text_form_marks_each_position_and_counts_the_equal_ones():
    assert quantized_tokens_text(TOKENS).splitlines() == [
        "q8/g32  uid  0 | = = = =  4/4 equal",
        "q8/g32  uid  1 | = =      2/2 equal",
        "q4/g32  uid  0 | = = x x  2/4 equal",
        "q4/g32  uid  1 | = x      1/2 equal",
    ]


def test_the_figure_draws_the_bytes_bars_and_one_grid_line_per_setting_and_uid():
    fig = render_quantized_effect(BYTES, TOKENS, "tiny-code")
    ax_bytes, ax_tok = fig.axes
    assert [round(b.get_height()) for b in ax_bytes.patches] == [2560, 800, 480]
    assert [t.get_text() for t in ax_bytes.texts] == ["x1", "x0.312", "x0.188"]
    grid = ax_tok.images[0].get_array()
    assert grid.shape == (4, 4) and grid.mask[1, 2:].all() and not grid.mask[0].any()
    assert grid[2].tolist() == [1, 1, 0, 0] and grid[3, 1] == 0
    assert [t.get_text() for t in ax_tok.get_yticklabels()] == [
        "q8/g32 uid 0",
        "q8/g32 uid 1",
        "q4/g32 uid 0",
        "q4/g32 uid 1",
    ]
    cmap = ax_tok.images[0].get_cmap()
    assert [tuple(np.round(cmap(v), 3)) for v in (0.0, 1.0)] == [
        tuple(np.round(to_rgba(c), 3)) for c in (style.BAD, style.GOOD)
    ]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["same token as float", "different token"]
