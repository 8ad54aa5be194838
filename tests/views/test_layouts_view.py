"""The layout comparison views (workbench.views.layouts) on hand-built snapshot and event
stand-ins: KV bytes held per step with a packed history's token bytes, per-request TTFT
and largest ITL from event times, and their bars."""

from types import SimpleNamespace

import pytest

from workbench.views import style
from workbench.views.layouts import KIB, render_layout_bytes, render_layout_latency, request_latency_ms


def snap(step, kv_kib, prefill_kib=0, held_tokens=None):
    packed = None if held_tokens is None else SimpleNamespace(held_tokens=held_tokens)
    return SimpleNamespace(
        step=step, kv_bytes=kv_kib * KIB, prefill_kv_bytes=prefill_kib * KIB, packed=packed
    )


def event(uid, kind, time_s):
    return SimpleNamespace(uid=uid, kind=kind, time_s=time_s)


def test_layout_bytes_draw_each_layout_in_kib_and_a_packed_layouts_token_bytes_dashed():
    padded = [snap(0, 256, 64), snap(1, 512)]
    packed = [snap(0, 8, held_tokens=[(0, 3), (1, 2)]), snap(1, 12, held_tokens=[(0, 4), (1, 3)])]
    fig = render_layout_bytes({"padded": padded, "packed": packed}, token_bytes=KIB)
    (ax,) = fig.axes
    assert [list(line.get_ydata()) for line in ax.lines] == [[320, 512], [8, 12], [5, 7]]
    # the padded / packed pair of style.py, the same two colours as 12's padded / paged
    assert [line.get_color() for line in ax.lines[:2]] == [style.PADDED_LAYOUT, style.PAGED_LAYOUT]
    assert ax.lines[2].get_linestyle() == "--" and not ax.get_legend()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "padded: KV bytes held",
        "packed: KV bytes held",
        "bytes of the tokens held (packed)",
    ]
    with pytest.raises(ValueError, match="at least one layout"):
        render_layout_bytes({"padded": []}, KIB)


def test_request_latency_is_ttft_and_the_largest_token_gap_in_ms_from_the_events():
    events = [
        event(0, "submit", 1.0),
        event(0, "token", 1.5),
        event(1, "submit", 1.2),
        event(0, "token", 1.6),
        event(0, "token", 2.0),
        event(1, "token", 1.7),
    ]
    got = request_latency_ms(events, [0, 1])
    assert [v for row in got for v in row] == pytest.approx([500.0, 400.0, 500.0, 0.0])
    with pytest.raises(ValueError, match="uid 7 has no submit or no token event"):
        request_latency_ms(events, [7])


def test_layout_latency_draws_one_bar_per_request_and_layout_in_two_panels():
    fig = render_layout_latency({"padded": [(10.0, 4.0), (20.0, 5.0)], "packed": [(8.0, 3.0), (30.0, 2.0)]})
    ttft, itl = fig.axes
    assert [p.get_height() for p in ttft.patches] == [10.0, 20.0, 8.0, 30.0]
    assert [p.get_height() for p in itl.patches] == [4.0, 5.0, 3.0, 2.0]
    assert ttft.get_ylabel() == "TTFT (ms)" and itl.get_ylabel() == "largest ITL (ms)"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["padded", "packed"]
    with pytest.raises(ValueError, match="different numbers of requests"):
        render_layout_latency({"padded": [(1.0, 1.0)], "packed": []})


def test_the_layouts_share_the_padded_and_paged_colours_with_the_paged_view():
    from matplotlib.colors import to_hex

    from workbench.views import paged

    assert (paged.PADDED_COLOUR, paged.PAGED_COLOUR) == (style.PADDED_LAYOUT, style.PAGED_LAYOUT)
    fig = render_layout_latency({"padded": [(10.0, 4.0)], "packed": [(8.0, 3.0)], "other": [(1.0, 1.0)]})
    ttft = fig.axes[0]
    assert [to_hex(p.get_facecolor()) for p in ttft.patches] == [
        style.PADDED_LAYOUT,
        style.PAGED_LAYOUT,
        style.SERIES[2],  # a name with no layout colour: the series colour of its place
    ]


def test_layout_latency_names_the_requests_by_uid_when_given():
    fig = render_layout_latency({"padded": [(10.0, 4.0), (20.0, 5.0)]}, uids=[3, 7])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["uid 3", "uid 7"]
    with pytest.raises(ValueError, match="different numbers of requests"):
        render_layout_latency({"padded": [(1.0, 1.0)]}, uids=[0, 1])
