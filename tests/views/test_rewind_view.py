"""The continuations view (views/rewind.py) from hand-made token lists: which cells are the
checkpoint's, equal, or another token, in text and in the figure."""

import numpy as np
import pytest
from matplotlib.colors import to_hex

from workbench.views import style
from workbench.views.rewind import FIRST, KEPT, continuations_text, render_continuations, same_tokens

RUNS = {"first": {0: [5, 6, 7, 8], 1: [9, 10]}, "again": {0: [5, 6, 7, 1], 1: [9, 10, 11]}}
KEPT_TOKENS = {0: 2}  # uid 0 had 2 tokens at the checkpoint; uid 1 was queued


def test_same_tokens_counts_a_token_only_one_run_has_as_different():
    assert same_tokens([5, 6, 7], [5, 9]) == [True, False, False]
    assert same_tokens([5], [5, 6]) == [True, False]


def test_the_text_form_marks_the_checkpoint_and_each_token_after_it():
    assert continuations_text(RUNS, KEPT_TOKENS).splitlines() == [
        "again uid 0 | 5 6 | = x  1/2 after the checkpoint equal",
        "again uid 1 | = = x  2/3 after the checkpoint equal",  # again's third token: past first's end
    ]
    with pytest.raises(KeyError):
        continuations_text({"first": {0: [1]}, "again": {}}, {})


def test_the_figure_colours_kept_first_equal_and_other_tokens_and_writes_each_id():
    fig = render_continuations(RUNS, KEPT_TOKENS, title="t")
    ax = fig.axes[0]
    rgba = ax.images[0].get_array()
    hexes = np.vectorize(to_hex, signature="(n)->()")(np.asarray(rgba))
    assert hexes[0].tolist() == [KEPT, KEPT, FIRST, FIRST]  # first run, uid 0
    assert hexes[2].tolist() == [KEPT, KEPT, style.GOOD, style.BAD]  # again, uid 0: the last token differs
    assert hexes[1].tolist() == [FIRST, FIRST, style.LATER, style.LATER]  # uid 1: white past its end
    assert [t.get_text() for t in ax.texts] == [
        "5",
        "6",
        "7",
        "8",
        "9",
        "10",
        "5",
        "6",
        "7",
        "1",
        "9",
        "10",
        "11",
    ]
    assert hexes[3].tolist() == [style.GOOD, style.GOOD, style.BAD, style.LATER]  # a third token first lacks
    hatched = [p for p in ax.patches if p.get_hatch() == style.BAD_HATCH]
    assert [(p.get_x() + 0.5, p.get_y() + 0.5) for p in hatched] == [(3.0, 2.0), (2.0, 3.0)]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "first: uid 0",
        "first: uid 1",
        "again: uid 0",
        "again: uid 1",
    ]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [
        "before the checkpoint (in it)",
        "first",
        "same token as first",
        "another token (or none)",
    ]
    equal = render_continuations({"first": RUNS["first"], "again": RUNS["first"]}, KEPT_TOKENS)
    assert "another token (or none)" not in [
        t.get_text() for t in equal.legends[0].get_texts()
    ]  # only kinds drawn
