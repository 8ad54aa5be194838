"""The rollouts view: each sampled rollout's log-probs against its positions' top-k, as text
and as one panel per rollout in the palette's colour of generated tokens."""

from types import SimpleNamespace

import pytest
from matplotlib.colors import to_hex

from workbench.views import style
from workbench.views.rollouts import render_rollouts, rollouts_text


def rollout(logprobs, tops):
    return SimpleNamespace(logprobs=tuple(logprobs), top_logprobs=tuple(tuple(t) for t in tops))


A = rollout([-0.5, -2.0, -0.25], [[(1, -0.5), (2, -1.0)], [(3, -0.75), (4, -2.0)], [(5, -0.25), (6, -3.0)]])
B = rollout([-1.5, -0.5], [[(7, -0.5), (8, -1.5)], [(9, -0.5), (1, -4.0)]])


def test_the_text_counts_top_1_samples_and_gives_mean_and_lowest_log_prob_in_nats():
    assert rollouts_text({"uid 0 (seed 7)": A, "uid 1 (seed 8)": B}).splitlines() == [
        "rollout         tokens  sampled the top-1  mean log-prob  lowest log-prob",
        "uid 0 (seed 7)       3              2 / 3     -0.92 nats       -2.00 nats",
        "uid 1 (seed 8)       2              1 / 2     -1.00 nats       -1.50 nats",
    ]


def test_a_rollout_without_top_k_says_so_and_uneven_top_k_lists_are_refused():
    assert rollouts_text({"r": rollout([-1.0], [])}).splitlines()[1].split()[1:4] == ["1", "-", "/"]
    with pytest.raises(ValueError, match="top_logprobs must give one equally long list per token"):
        rollouts_text({"r": rollout([-1.0, -2.0], [[(1, -1.0)]])})


def test_the_figure_draws_one_panel_per_rollout_in_the_generated_tokens_colour_with_whole_ticks():
    fig = render_rollouts({"a": A, "b": B}, title="two rollouts")
    axes = fig.axes
    assert len(axes) == 2 and [ax.get_title() for ax in axes] == ["a", "b"]
    line = axes[0].lines[0]
    assert list(line.get_ydata()) == [-0.5, -2.0, -0.25] and to_hex(line.get_color()) == style.ATTENDED
    band = axes[0].collections[0]
    assert to_hex(band.get_facecolor()[0][:3]) == style.ATTENDED  # the band: the same hue, lighter
    assert all(float(t).is_integer() for t in axes[0].get_xticks())
    assert fig.get_size_inches()[0] <= 9.6  # unscaled in a JupyterLab output area at 100 dpi
    with pytest.raises(ValueError, match="at least one rollout"):
        render_rollouts({})
