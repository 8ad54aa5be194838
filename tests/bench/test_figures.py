"""Benchmark figures: drawn from hand-built frames with the stored files' columns, in the
views' colours."""

import pandas as pd

from workbench.bench.figures import (
    ENGINE_COLOURS,
    PREFILL_COLOUR,
    WORKBENCH_COLOUR,
    render_frontier,
    render_head_of_line,
    render_join,
    render_throughput,
    render_ttft_itl,
)
from workbench.views import style


def test_the_figures_use_the_views_colours():
    assert WORKBENCH_COLOUR == style.ATTENDED == ENGINE_COLOURS["workbench"]
    assert PREFILL_COLOUR == style.PREFILL


def test_throughput_draws_one_bar_per_engine_and_batch_size():
    runs = pd.DataFrame(
        {
            "engine": ["workbench", "mlx-lm"] * 4,
            "B": [1, 1, 8, 8] * 2,
            "tok_per_s": [18.0, 19.0, 100.0, 98.0, 18.5, 18.8, 103.0, 101.0],
        }
    )
    roofline = pd.DataFrame(
        {
            "case": ["decode B=1", "decode B=8", "bare forward B=8"],
            "B": [1, 8, 8],
            "attainable_tok_per_s": [50.0, 400.0, 300.0],
        }
    )
    (ax,) = render_throughput(runs, roofline).axes
    assert len(ax.patches) == 4  # 2 engines x 2 batch sizes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["B = 1", "B = 8"]


def test_ttft_itl_draws_one_cdf_per_engine_on_each_axis():
    requests = pd.DataFrame({"engine": ["workbench", "workbench", "mlx-lm"], "ttft_s": [0.3, 0.5, 0.4]})
    gaps = pd.DataFrame({"engine": ["workbench", "mlx-lm", "mlx-lm"], "gap_s": [0.08, 0.07, 0.09]})
    axes = render_ttft_itl(requests, gaps).axes
    for ax in axes:  # per engine a CDF, then the p50 and p95 levels
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["workbench", "mlx-lm"]
        assert len(ax.get_lines()) == 2 + 2
    assert [ax.get_xlabel() for ax in axes] == ["TTFT (ms, log)", "ITL (ms, log)"]


def test_join_skips_methods_it_did_not_measure():
    join = pd.DataFrame(
        {"method": ["step", "step", "extend", "re-merge"], "seconds": [0.01, 0.012, 0.02, 0.05]}
    )
    (ax,) = render_join(join, rows=8, context_tokens=1024).axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "one decode step",
        "join by extend",
        "join by re-merge",
    ]
    assert ax.get_title() == "Joining 1 row into B=8 rows of 1024 tokens"


def test_head_of_line_draws_one_panel_per_engine():
    rows = []
    for engine in ("workbench", "mlx-lm"):
        rows += [
            (engine, "joiner", "submit", 9, 1.0),
            (engine, "joiner", "prefill", 9, 1.5),
            (engine, "joiner", "token", 9, 2.0),
            (engine, "running", "token", 0, 0.9),
            (engine, "running", "token", 0, 2.1),
        ]
    hol = pd.DataFrame(rows, columns=["engine", "role", "kind", "uid", "time_s"])
    axes = render_head_of_line(hol).axes
    assert [ax.get_title(loc="left") for ax in axes] == ["workbench", "mlx-lm"]


def _frontier_frames():
    engines = {
        "mlx-lm": (1.0, 0.2),
        "workbench": (0.9, 0.27),
        "workbench, paced 2x step": (1.43, 0.222),
        "workbench, paced 4x step": (1.40, 0.226),  # 4 ms right of t = 2: two markers touch
    }
    requests = pd.DataFrame([{"engine": e, "ttft_s": t} for e, (t, _) in engines.items()])
    gaps = pd.DataFrame([{"engine": e, "gap_s": g} for e, (_, g) in engines.items()])
    return requests, gaps


def test_the_frontier_labels_each_paced_point_at_its_own_marker_and_outlines_the_goal():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = render_frontier({"staggered": _frontier_frames()})
    (ax,) = fig.axes
    labels = {t.get_text(): t for t in ax.texts if t.get_text().startswith("t = ")}
    assert set(labels) == {"t = 2", "t = 4"}
    assert labels["t = 2"].xy == (222.0, 1430.0) and labels["t = 4"].xy == (226.0, 1400.0)
    FigureCanvasAgg(fig).draw()
    a, b = (labels[k].get_window_extent() for k in ("t = 2", "t = 4"))
    assert not a.overlaps(b)  # one label per marker, not both on one side
    assert any(t.get_text() == "goal" for t in ax.texts)
    # the goal box is outlined: a dashed line along ITL = mlx-lm's, TTFT = 0.6 x mlx-lm's
    outline = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert len(outline) == 1 and list(outline[0].get_xdata()) == [0, 200.0, 200.0]
    assert list(outline[0].get_ydata()) == [600.0, 600.0, 0]
    assert "gap target in decode steps" in ax.get_legend().get_texts()[0].get_text()
