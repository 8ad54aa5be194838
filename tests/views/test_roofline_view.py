"""The full roofline (workbench.views.roofline): both roofs and the KV term fitted back from
the frames workbench.bench.roofline writes, and the measured points' gap explained by
numbers that add up (issue 43)."""

import numpy as np
import pandas as pd
import pytest

from workbench.bench.files import read_frame
from workbench.bench.roofline import DecodeCost, bounds_tok_per_s
from workbench.views.roofline import RooflineModel, render_roofline, roofline_text

COST = DecodeCost(
    weight_bytes=400 * 2**20,
    weight_params=100_000_000,
    kv_bytes_per_token=8192,
    attention_flops_per_token=20_000,
)
BANDWIDTH, FLOPS = 10e9, 100e9


def frames(measured=(10.0, 60.0, 150.0)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """roofline.csv and meta.csv as the benchmark writes them, for ``COST`` on a machine of
    ``BANDWIDTH`` bytes/s and ``FLOPS`` flop/s: decode rows at 28 tokens, one row at 1024."""
    rows = []
    for case, B, C, tok in [
        ("decode B=1", 1, 28, measured[0]),
        ("decode B=8", 8, 28, measured[1]),
        ("decode B=32", 32, 28, measured[2]),
        ("bare forward B=32", 32, 1024, 50.0),
    ]:
        rows.append(
            {
                "case": case,
                "B": B,
                "context_tokens": float(C),
                **bounds_tok_per_s(COST, B, C, BANDWIDTH, FLOPS),
                "workbench_tok_per_s": tok,
            }
        )
    meta = pd.DataFrame(
        {"key": ["copy_bandwidth_bytes_per_s", "matmul_flops_per_s"], "value": [str(BANDWIDTH), str(FLOPS)]}
    )
    return pd.DataFrame(rows), meta


def test_the_fit_recovers_the_weights_the_kv_term_and_both_roofs():
    m = RooflineModel(*frames())
    assert m.weight_bytes == pytest.approx(COST.weight_bytes) and m.kv_bytes_per_token == pytest.approx(8192)
    assert m.flops_per_row == pytest.approx(2 * COST.weight_params) and m.attention_flops == pytest.approx(
        20_000
    )
    B = np.array([1, 64, 512])
    for C in (28, 4096):
        expected = [bounds_tok_per_s(COST, b, C, BANDWIDTH, FLOPS) for b in B]
        assert m.memory_tok_per_s(B, C) == pytest.approx([e["memory_tok_per_s"] for e in expected])
        assert m.compute_tok_per_s(B, C) == pytest.approx([e["compute_tok_per_s"] for e in expected])
    assert m.kv_equals_weights_tokens() == pytest.approx(400 * 2**20 / 8192)  # B x C where KV = weights


def test_the_ridge_is_where_the_roofs_meet_and_a_long_context_never_reaches_it():
    m = RooflineModel(*frames())
    ridge = m.ridge_batch(28)
    assert m.memory_tok_per_s(ridge, 28) == pytest.approx(m.compute_tok_per_s(ridge, 28))
    assert m.ridge_batch(100_000) == float("inf")  # the KV term caps the memory roof below compute
    assert m.memory_tok_per_s(1e9, 100_000) == pytest.approx(BANDWIDTH / (100_000 * 8192), rel=1e-3)


def test_the_gap_table_adds_up_and_the_sentences_print_its_numbers():
    m = RooflineModel(*frames())
    t = m.table()
    assert t.measured_ms.tolist() == pytest.approx((t.memory_ms + t.compute_ms + t.rest_ms).tolist())
    assert t.share_of_roof.tolist() == pytest.approx(
        (t.measured_tok_per_s / np.minimum(t.memory_tok_per_s, t.compute_tok_per_s)).tolist()
    )
    text = roofline_text(m)
    last = t.iloc[-1]
    assert f"{last.memory_ms:.1f} ms and the compute {last.compute_ms:.1f} ms" in text
    assert (
        f"{(last.memory_ms + last.compute_ms) / last.measured_ms:.0%} of the measured {last.measured_ms:.1f} ms"
        in text
    )
    assert f"B x context > {m.kv_equals_weights_tokens():,.0f} tokens" in text


def test_the_documented_run_fits_its_own_rows_exactly():
    roofline, meta = read_frame("roofline.csv"), read_frame("meta.csv")
    m = RooflineModel(roofline, meta)
    fitted = m.bytes_per_step(roofline.B, roofline.context_tokens.to_numpy(float))
    assert fitted == pytest.approx(roofline.bytes_per_step.to_numpy(float))
    assert m.memory_tok_per_s(roofline.B, roofline.context_tokens.to_numpy(float)) == pytest.approx(
        roofline.memory_tok_per_s.to_numpy(float)
    )


def test_the_figure_draws_both_roofs_per_context_and_marks_each_kv_crossing():
    m = RooflineModel(*frames())
    rates, bytes_ = render_roofline(m).axes
    labels = [line.get_label() for line in rates.lines]
    assert {"memory roof, C=28", "compute roof, C=28", "memory roof, C=4096", "compute roof, C=4096"} <= set(
        labels
    )
    crossings = [line.get_xdata()[0] for line in bytes_.lines if line.get_marker() == "o"]
    assert crossings == pytest.approx(
        [m.kv_equals_weights_tokens() / C for C in (1024, 4096)]
    )  # C=28 crosses past B=512


def test_frames_without_two_decode_rows_or_the_rates_are_refused():
    roofline, meta = frames()
    with pytest.raises(ValueError, match="two roofline decode rows"):
        RooflineModel(roofline.iloc[:1], meta)
    with pytest.raises(ValueError, match="matmul_flops_per_s"):
        RooflineModel(roofline, meta.iloc[:1])
