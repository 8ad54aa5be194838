"""The mistake-against-engine gap view (workbench.views.gaps): verdicts against the
oracle's tolerance in text, bars on a log axis without e-notation in the figure."""

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex

from workbench.views import style
from workbench.views.gaps import gaps_text, render_gaps

GAPS = {"stale state": 0.59, "engine: fresh state": 0.0, "engine: neighbour": 4.8e-7}


def test_the_text_form_says_which_case_is_within_the_tolerance_and_no_float_noise():
    assert gaps_text(GAPS, 1e-5).splitlines() == [
        "stale state          over the tolerance (1×10⁻⁵ nats)",
        "engine: fresh state  within the tolerance (1×10⁻⁵ nats)",
        "engine: neighbour    within the tolerance (1×10⁻⁵ nats)",
    ]


def test_the_bars_read_against_the_dashed_tolerance_with_the_verdict_not_by_hue_alone():
    fig = render_gaps(GAPS, 1e-5, "rule 1")
    (ax,) = fig.axes
    FigureCanvasAgg(fig).draw()
    bars = ax.patches
    assert [to_hex(b.get_facecolor(), keep_alpha=False) for b in bars] == [style.BAD, style.GOOD, style.GOOD]
    assert bars[0].get_hatch() == style.BAD_HATCH and not bars[1].get_hatch()
    assert bars[1].get_width() == 0 and bars[0].get_x() + bars[0].get_width() == pytest.approx(0.59)
    assert [t.get_text() for t in ax.texts] == ["0.59 nats", "0 (identical)", "4.8×10⁻⁷ nats"]
    (tol,) = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert list(tol.get_xdata()) == [1e-5, 1e-5] and ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "10⁻⁶" in labels and not any("e" in t for t in labels)  # no e-notation
    assert ax.get_xlim()[0] < 4.8e-7 and ax.get_xlim()[1] > 0.59 * 10


def test_the_gap_view_refuses_no_cases_negative_gaps_and_a_zero_tolerance():
    with pytest.raises(ValueError, match="at least one case"):
        render_gaps({}, 1e-5, "t")
    with pytest.raises(ValueError, match="finite and >= 0"):
        render_gaps({"a": -1.0}, 1e-5, "t")
    with pytest.raises(ValueError, match="tolerance > 0"):
        render_gaps({"a": 1.0}, 0.0, "t")
