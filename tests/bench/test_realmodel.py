"""The benchmark's second shape, the real model (``workbench.bench.realmodel``): its decode
rows are produced like the random llama's (workbench and mlx-lm alternating, one table row
per batch size), and without the model the section is skipped, saying why. No timing
thresholds: speed claims come from the documented run (docs/benchmarks.md)."""

import math

import pytest

from tests.real_model import NAME, real_model_folder
from workbench.bench.model import parameter_count
from workbench.bench.realmodel import real_decode_runs, real_model_missing
from workbench.bench.report import TABLE_COLUMNS, real_model_line, real_table, row_ids
from workbench.bench.run import FULL_CONFIG, QUICK_CONFIG
from workbench.bench.scenarios import MLX_LM, WORKBENCH


@pytest.mark.realmodel
def test_real_model_decode_runs_give_one_ratio_row_per_batch_size():
    real_model_folder()
    lines = []
    runs, meta = real_decode_runs(
        (1, 2), prompt_tokens=4, decode_tokens=3, pairs=1, prefill_step_size=64, echo=lines.append
    )
    assert (
        meta["real_model"].startswith(f"{NAME}: llama, hidden 576, 30 layers")
        and "4-bit" in meta["real_model"]
    )
    assert meta["real_parameters"] == 134_515_008  # SmolLM2-135M, the packed 4-bit weights counted unpacked
    assert sorted(zip(runs.B, runs.engine)) == [(1, MLX_LM), (1, WORKBENCH), (2, MLX_LM), (2, WORKBENCH)]
    assert all(math.isfinite(v) and v > 0 for v in runs.tok_per_s)
    assert runs[runs.engine == MLX_LM].same_tokens.tolist() == [1.0, 1.0]  # mlx-lm's greedy tokens are ours
    table = real_table(runs)
    assert list(table.columns) == TABLE_COLUMNS
    assert table.row.tolist() == ["real_decode_B1", "real_decode_B2"]
    assert table.metric.tolist() == [f"decode tok/s, B={b}, {NAME} (4-bit)" for b in (1, 2)]
    assert all(v > 0 for v in table.value) and (table.value_is == "median of pairs: workbench / mlx-lm").all()
    assert (table.goal == "").all() and (table.met == "").all()
    assert any("B=2" in line and "mlx-lm" in line for line in lines)


def test_without_the_real_model_the_section_is_skipped_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_MODELS_DIR", str(tmp_path))  # an empty model cache
    lines = []
    runs, meta = real_decode_runs((1,), 4, 3, 1, 64, echo=lines.append)
    reason = real_model_missing()
    assert reason is not None and f"workbench models fetch {NAME}" in reason
    assert runs.empty and meta == {"real_model_skipped": reason}
    assert lines == [f"  skipped: {reason}"]
    assert real_table(runs).empty and "skipped" in real_model_line(QUICK_CONFIG, meta)


def test_the_table_lists_real_model_rows_last_and_only_when_they_ran():
    assert row_ids((1, 8)) == row_ids((1, 8), ())
    assert row_ids((1, 8), (1, 4))[-2:] == ["real_decode_B1", "real_decode_B4"]
    assert FULL_CONFIG.real.batch_sizes == (1, 8, 32) and QUICK_CONFIG.real.batch_sizes


def test_a_float_models_parameter_count_is_its_arrays_sizes():
    from mlx.utils import tree_flatten

    from workbench.bench.model import QUICK, make_model

    model = make_model(QUICK)
    assert parameter_count(model) == sum(v.size for _, v in tree_flatten(model.parameters()))
