"""The benchmark's stored CSV files read back: empty cells stay text, meta is text per key."""

import pandas as pd
import pytest

from workbench.bench.files import CSV_FILES, DOCS_BENCHMARKS, read_frame, read_meta


def test_a_frame_reads_back_as_written_with_empty_cells_as_empty_text(tmp_path):
    pd.DataFrame({"row": ["decode_B1", "ttft_p50"], "goal": [">= 1.10", ""], "value": [0.95, 0.65]}).to_csv(
        tmp_path / "table.csv", index=False
    )
    table = read_frame("table.csv", tmp_path)
    assert table.goal.tolist() == [">= 1.10", ""]
    assert table.value.tolist() == [0.95, 0.65]


def test_meta_reads_back_as_text_per_key(tmp_path):
    pd.DataFrame({"key": ["join_rows", "cpu", "load_1min_min"], "value": ["8", "AMD EPYC", "0.97"]}).to_csv(
        tmp_path / "meta.csv", index=False
    )
    meta = read_meta(tmp_path)
    assert meta == {"join_rows": "8", "cpu": "AMD EPYC", "load_1min_min": "0.97"}
    assert int(meta["join_rows"]) == 8


def test_an_unknown_or_missing_file_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark file 'runs.txt'"):
        read_frame("runs.txt", tmp_path)
    with pytest.raises(FileNotFoundError):
        read_frame("runs.csv", tmp_path)


def test_the_documented_run_has_every_file():
    assert all((DOCS_BENCHMARKS / name).is_file() for name in CSV_FILES)
    assert int(read_meta()["join_rows"]) > 0


def test_every_documented_value_is_what_its_label_says_the_ratio_of_the_columns_or_a_median_of_pairs():
    # notebook 07 and docs/benchmarks.md print `value` under its `value_is`: a label "workbench / mlx-lm"
    # over a median of per-pair ratios read 1.008 beside 62.7 against 65.84 tok/s (issue 43)
    table = read_frame("table.csv")
    ratio_of_columns = table.measured / table.reference
    pairs = table.value_is.str.startswith("median of pairs: ")
    plain = table[~pairs]
    assert len(plain) >= 10 and pairs.sum() >= 9
    wrong = plain[(plain.value - ratio_of_columns[~pairs]).abs() > 1e-9 * plain.value.abs().clip(lower=1)]
    assert wrong.empty, wrong[["row", "measured", "reference", "value", "value_is"]].to_string()
    timed = table[
        pairs & table.value_is.str.contains("time ")
    ]  # tok/s columns, a time ratio: reference / measured
    assert (timed.unit == "tok/s").all() and len(timed) == 3
