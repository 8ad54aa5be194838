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
