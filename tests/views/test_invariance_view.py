"""The batch-invariance views: text forms are counts and verdicts, the figure has a panel per grid."""

import numpy as np

from workbench.verify.invariance import ChunkFinding, OpFinding, StepGrid
from workbench.views import invariance as view


def _grids():
    default = StepGrid("default", 3, np.array([[1, 1, 1], [1, 0, 0], [0, 1, -1]], dtype=np.int8))
    mode = StepGrid("invariant", 3, np.array([[1, 1, 1], [1, 1, 1], [1, 1, -1]], dtype=np.int8))
    return [default, mode]


def test_grids_text_counts_equal_rows_and_where_the_others_first_differ():
    assert view.grids_text(_grids()).splitlines() == [
        "default   B =  3: 1/3 rows bit-equal to alone at every token;",
        "                  first differing token: token 0 for 1 row, token 1 for 1",  # a second line: no wrap
        "invariant B =  3: 3/3 rows bit-equal to alone at every token",
    ]


def test_grids_text_counts_rows_per_first_differing_token_in_words():
    grid = StepGrid("default", 8, np.array([[0, 1]] * 4 + [[1, 0]] * 3 + [[1, 1]], dtype=np.int8))
    assert view.grids_text([grid]).splitlines()[1].strip() == (
        "first differing token: token 0 for 4 rows, token 1 for 3"
    )


def test_render_grids_draws_one_panel_per_grid():
    fig = view.render_grids(_grids(), "t")
    assert len(fig.axes) == 2 and "1/3 rows equal" in fig.axes[0].get_title()


def test_render_grids_tells_a_changed_token_from_a_last_bit_log_prob_and_lists_only_what_it_draws():
    grids = [StepGrid("default", 2, np.array([[1, 0, 2], [0, 0, 1]], dtype=np.int8))]
    fig = view.render_grids(grids, "t")
    ax = fig.axes[0]
    pixels = ax.images[0].get_array()
    assert tuple(pixels[0, 1]) != tuple(pixels[0, 2]) != tuple(pixels[0, 0])  # three colours
    hatched = [(p.get_x(), p.get_y()) for p in ax.patches if p.get_hatch()]
    assert hatched == [(1.5, -0.5)]  # only the changed token (row 0, token 2)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["bit-equal to alone", "same token, log-prob differs (last bits)", "another token"]


def test_ops_and_chunks_text_give_verdicts_and_magnitudes_only_when_asked():
    ops = [
        OpFinding(
            "lm_head Linear 8->16 mlx.core.float32", (2, 8), 2.9e-6, 0.0, "blocks of 8 rows (padded to 8)"
        ),
        OpFinding("rms_norm 8 mlx.core.float32", (2,), 0.0, None, "unchanged"),
    ]
    text = view.ops_text(ops).splitlines()
    assert text[1].split() == [
        "lm_head",
        "Linear",
        "8->16",
        "float32",
        "differs",
        "bit-equal",
        "blocks",
        "of",
        "8",
        "rows",
        "(padded",
        "to",
        "8)",
    ]
    assert "bit-equal   unchanged" in text[2]
    assert "2.9×10⁻⁶" in view.ops_text(ops, magnitudes=True)  # no e-notation
    chunks = [ChunkFinding(8, 2048, True, 9.5e-7), ChunkFinding(16, 2048, False, 0.0)]
    assert view.chunks_text(chunks).splitlines() == [
        "prefill_step_size     8 vs 2048: tokens equal, log-probs differ",
        "prefill_step_size    16 vs 2048: tokens DIFFER, log-probs bit-equal",
    ]
    assert "9.5×10⁻⁷ nats" in view.chunks_text(chunks, magnitudes=True)


def test_the_ops_summary_counts_what_the_table_shows_so_prose_needs_no_stored_number():
    ops = [
        OpFinding(
            "lm_head Linear 8->16 mlx.core.float32", (2, 8), 0.0, 0.0, "blocks of 8 rows (padded to 8)"
        ),
        OpFinding("up_proj Linear 8->12 mlx.core.float32", (2, 8), 1.1e-6, 0.0, "one row per call"),
        OpFinding("down_proj Linear 12->8 mlx.core.float32", (2, 8), 2.9e-6, 0.0, "one row per call"),
        OpFinding(
            "attention, one query over 300 keys, float32", (2,), 1.5e-8, 0.0, "each row on its own keys"
        ),
        OpFinding("rms_norm 8 mlx.core.float32", (2,), 0.0, None, "unchanged"),
    ]
    assert view.ops_summary(ops).splitlines() == [
        "projections: 2 of 3 differ among others (largest |diff| 2.9×10⁻⁶)",
        "attention behind left padding: 1.5×10⁻⁸",
        "row-wise operations: 1 of 1 bit-equal",
        "the mode's choice: blocks of 8 rows (padded to 8) for 1 projection(s), one row per call for 2 projection(s)",
    ]
    assert view.ops_summary(ops[:1]).splitlines()[0] == "projections: 0 of 1 differ among others"
