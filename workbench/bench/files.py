"""The benchmark's stored data: the CSV files ``workbench bench`` writes, and reading them back.

Knows: the file names (:data:`CSV_FILES`), where the documented run keeps them
(:data:`DOCS_BENCHMARKS`), how :func:`workbench.bench.report.write_outputs` writes them
(``DataFrame.to_csv(index=False)``; ``meta.csv`` as ``key,value`` rows, non-text values
JSON-encoded). Must not know: engines, MLX, figures; reading runs nothing.

Empty cells read back as ``""`` (not NaN), so text columns such as the table's ``goal``
and ``met`` compare as strings::

    runs = read_frame("runs.csv")                  # docs/benchmarks/runs.csv
    meta = read_meta(tmp / "benchmarks")           # {"join_rows": "8", "cpu": "...", ...}
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

DOCS_BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
CSV_FILES = {
    "table.csv": "the table",
    "runs.csv": "every decode run",
    "requests.csv": "latency workload, per request",
    "gaps.csv": "latency workload, per inter-token gap",
    "loaded_requests.csv": "loaded latency workload, per request",
    "loaded_gaps.csv": "loaded latency workload, per inter-token gap",
    "join.csv": "join-cost measurements",
    "head_of_line.csv": "head-of-line events",
    "roofline.csv": "roofline per case",
    "checkpoint.csv": "checkpoint cost measurements",
    "session.csv": "every call of the long session",
    "real_runs.csv": "every decode run on the real model (the second shape)",
    "meta.csv": "model, machine, load, bandwidth",
}


def read_frame(name: str, folder: str | Path = DOCS_BENCHMARKS) -> pd.DataFrame:
    """One stored frame, ``folder / name``, with empty cells as ``""``.

    Args:
        name: one of :data:`CSV_FILES` (``"runs.csv"``, ...).
        folder: the ``benchmarks`` folder of a run (default: the documented run's).

    Returns:
        The frame as written: one row per measurement, the writer's columns (times in
        seconds, rates in tok/s, as the column names say).

    Raises:
        ValueError: for a name not in :data:`CSV_FILES`.
        FileNotFoundError: when the file is missing.
    """
    if name not in CSV_FILES:
        raise ValueError(f"unknown benchmark file {name!r}; expected one of {sorted(CSV_FILES)}")
    return pd.read_csv(Path(folder) / name, keep_default_na=False)


def read_meta(folder: str | Path = DOCS_BENCHMARKS) -> dict[str, str]:
    """``meta.csv`` of ``folder`` as ``{key: value}``, every value the stored text
    (convert with ``int(...)`` / ``float(...)``, e.g. ``int(meta["join_rows"])``).

    Raises:
        FileNotFoundError: when the file is missing.
    """
    return {str(k): str(v) for k, v in read_frame("meta.csv", folder).values}


def print_json_line(line: dict, out: str | Path | None = None) -> None:
    """Print ``line`` as one JSON line (flushed, for a lab script's progress) and, with ``out``,
    append it to that file (JSON lines, one reading per line; no mlx-lm counterpart).

    Raises:
        TypeError: a value ``json.dumps`` cannot write; OSError: ``out`` cannot be opened."""
    import json

    text = json.dumps(line)
    print(text, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n")
