"""The paged-KV counterfactual in replays and in the comparison table."""

from __future__ import annotations

import math

import pandas as pd
import pytest

import workbench as wb
from tests.cost_models import SIM_COST as COST
from workbench.observe.events import Event
from workbench.observe.paged import layout_columns
from workbench.sim.compare import COMPARE_COLUMNS, summary_row

from .replays import hand_replay


def test_a_summary_row_takes_the_paged_peak_and_the_padding_tax_from_the_layouts():
    layouts = pd.DataFrame([{c: 0 for c in layout_columns()} for _ in range(2)])
    layouts["padded_bytes"] = [1000, 3000]
    layouts["paged_bytes_b16"] = [200, 800]
    samples = [(0.0, 0, 1, 0, 0, 1000, 4, 4, 0), (1.0, 1, 2, 0, 0, 3000, 6, 12, 3)]
    run = hand_replay([Event("submit", 0, 0, 0.0, n_tokens=1)], samples, layouts=layouts)
    row = summary_row(run)
    assert list(row) == COMPARE_COLUMNS
    assert row["paged_peak_bytes_b16"] == 800 and row["peak_kv_bytes"] == 3000
    assert row["padding_tax"] == pytest.approx(1 - 1000 / 4000)


def test_a_run_without_layouts_has_no_paged_numbers():
    run = hand_replay(name="empty")
    row = summary_row(run)
    assert math.isnan(row["paged_peak_bytes_b16"]) and math.isnan(row["padding_tax"])


@pytest.mark.model
def test_a_replay_records_both_layouts_of_the_batch_it_measured():
    standin = wb.ModelRef(standin=True)
    model, tok = standin.load()
    work = wb.synthetic(
        tok,
        10,
        rate_per_s=30.0,
        seed=2,
        prompt_tokens=wb.workloads.distributions.Uniform(2, 60),
        output_tokens=6,
    )
    run = wb.replay(work, model, tok, {"max_batch": 4}, cost_model=COST)
    lay, s = run.layouts, run.samples
    assert list(lay.columns) == layout_columns() and len(lay) == len(s)
    assert (
        lay.padded_bytes.tolist() == s.kv_bytes.tolist()
    )  # the counterfactual sees the batch the replay measured
    assert lay.rows.tolist() == s.batch_size.tolist()
    parts = lay.padded_data_bytes + lay.padded_padding_bytes + lay.padded_growth_bytes + lay.padded_free_bytes
    assert parts.tolist() == lay.padded_bytes.tolist()
    busy = lay[lay.rows > 0]
    assert (busy.paged_bytes_b16 < busy.padded_bytes).all()  # short rows in 256-token growth steps
    assert (busy.paged_bytes_b16 <= busy.paged_bytes_b32).all() and (
        busy.paged_bytes_b32 <= busy.paged_bytes_b64
    ).all()
    table = wb.compare(work, {"b4": {"max_batch": 4}}, standin, cost_model=COST)
    assert table.paged_peak_bytes_b16.iloc[0] == lay.paged_bytes_b16.max()
    assert table.padding_tax.iloc[0] == pytest.approx(1 - lay.paged_bytes_b16.sum() / lay.padded_bytes.sum())
    assert 0 < table.padding_tax.iloc[0] < 1
