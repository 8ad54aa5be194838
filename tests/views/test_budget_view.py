"""The budget views (workbench.views.budget) on hand-built snapshot stand-ins: stacked held
bytes in MiB with the projection, the budget and a per-request sum, and the measured
against computed memory moves."""

from types import SimpleNamespace

import numpy as np
import pytest

from workbench.views.budget import MIB, render_budget_bytes, render_memory_moves


def snap(kv, prefill, prompt_cache, projected):
    return SimpleNamespace(
        kv_bytes=kv * MIB,
        prefill_kv_bytes=prefill * MIB,
        prompt_cache_bytes=prompt_cache * MIB,
        kv_projected_bytes=projected * MIB,
    )


HISTORY = [snap(1, 0, 0, 1.5), snap(2, 1, 0.5, 3), snap(1, 0, 1, 1.5)]


def test_the_held_bytes_stack_in_mib_under_the_projection_and_the_budget_with_the_legend_off_the_axes():
    fig = render_budget_bytes(HISTORY, 4 * MIB, per_request_bytes=[MIB, MIB, MIB])
    (ax,) = fig.axes
    tops = [path.vertices[:, 1].max() for path in (c.get_paths()[0] for c in ax.collections)]
    assert np.allclose(tops, [2, 3, 3.5])  # cumulative: batch, + prefill, + prompt cache
    lines = {tuple(line.get_ydata()) for line in ax.lines}
    assert (1.5, 3.0, 1.5) in lines and (1.0, 1.0, 1.0) in lines and (4.0, 4.0) in lines
    assert not ax.get_legend() and [t.get_text() for t in fig.legends[0].get_texts()] == [
        "batch caches",
        "prefilling group",
        "prompt cache",
        "projected by admission (rows only)",
        "kv_budget_bytes",
        "per-request sum",
    ]
    assert ax.get_ylabel() == "MiB"


def test_the_prompt_cache_is_no_second_yellow_and_the_budget_is_a_dashed_limit_not_a_verdict():
    from matplotlib.colors import to_hex

    from tests.views.test_style import lab
    from workbench.views import style

    (ax,) = render_budget_bytes(HISTORY, 4 * MIB).axes
    prefill, prompt_cache = (to_hex(c.get_facecolor()[0], keep_alpha=False) for c in ax.collections[1:3])
    assert prefill == style.PREFILL  # SERIES[2] (#bcbd22) was 17 CIE76 units from it: two yellows
    assert np.linalg.norm(lab(prompt_cache) - lab(style.PREFILL)) >= 45 and ax.collections[2].get_hatch()
    (budget,) = [line for line in ax.lines if tuple(line.get_ydata()) == (4.0, 4.0)]
    assert budget.get_linestyle() == "--" and to_hex(budget.get_color()) == "#000000"


def test_the_budget_view_refuses_no_history_and_a_per_request_sum_of_another_length():
    with pytest.raises(ValueError, match="at least one snapshot"):
        render_budget_bytes([], MIB)
    with pytest.raises(ValueError, match="per_request_bytes has 1 values for 3 snapshots"):
        render_budget_bytes(HISTORY, MIB, [MIB])


def test_memory_moves_put_one_point_per_call_in_mib_beside_the_diagonal():
    fig = render_memory_moves([(MIB, MIB + 1000), (-2 * MIB, -2 * MIB)])
    (ax,) = fig.axes
    assert np.allclose(ax.collections[0].get_offsets(), [[1, 1 + 1000 / MIB], [-2, -2]])
    diagonal = ax.lines[0]
    assert np.allclose(diagonal.get_xdata(), diagonal.get_ydata()) and diagonal.get_xdata()[
        1
    ] == pytest.approx(2.2)
    with pytest.raises(ValueError, match="at least one"):
        render_memory_moves([])
