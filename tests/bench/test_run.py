"""``workbench bench --quick``, as CI runs it: every row of the table, finite positive
numbers, the files it writes. No timing thresholds: speed claims come from the full run
(docs/benchmarks.md), not from tests."""

import math
import os

import pandas as pd
import pytest

from tests.cli_process import run_workbench
from workbench.bench.files import read_meta
from workbench.bench.report import (
    CSV_FILES,
    FIGURES,
    GOAL_MEANINGS,
    GOALS,
    GPU_GOALS,
    NOTES_MARKER,
    TABLE_COLUMNS,
    goal_text,
    goals_text,
    row_ids,
    table_text,
)
from workbench.bench.run import QUICK_CONFIG

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One quick run in a subprocess with the optimized BLAS (the suite pins MLX's own
    BLAS for bit-exact oracles; the benchmark runs as a user runs it), without the real-model
    rows: their 4-bit CPU kernels took most of the run, and tests/bench/test_realmodel.py
    runs that section's code (rows, table, skip) on the fetched model."""
    out = tmp_path_factory.mktemp("bench")
    (out / "benchmarks.md").write_text(f"old text\n{NOTES_MARKER}\nhand-written diagnosis\n")
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_BLAS"}
    proc = run_workbench("bench", "--quick", "--no-real-model", "--out", str(out), timeout_s=600, env=env)
    return proc, out


def test_quick_bench_prints_a_table_with_every_row(quick_run):
    proc, _ = quick_run
    assert proc.returncode == 0, proc.stderr
    for label in (
        "decode tok/s, B=1",
        "decode tok/s, B=8",
        "instrumentation overhead, B=8",
        "TTFT p95",
        "ITL p50",
        "join by extend",
        "join by re-merge",
        "head-of-line, workbench:",
        "roofline, decode B=8",
    ):
        assert label in proc.stdout
    assert "load average (1 min) during the run" in proc.stdout
    assert "real-model rows: skipped: --no-real-model was given" in proc.stdout
    assert (
        "goals this machine can reach: " in proc.stdout and "(value is the row's value column" in proc.stdout
    )
    assert "goal: the workbench decodes" in proc.stdout
    from workbench.runtime.device import on_gpu

    if not on_gpu():  # the CPU run lists the GPU goals apart; on a GPU they are goals like the others
        assert "goals set for a GPU (out of reach on this CPU" in proc.stdout
    assert "median of pairs: workbench / mlx-lm" in proc.stdout  # what the decode rows' value is


def test_quick_bench_table_has_finite_positive_numbers_and_goals(quick_run):
    _, out = quick_run
    table = pd.read_csv(out / "benchmarks" / "table.csv", keep_default_na=False)
    real = () if "real_model_skipped" in read_meta(out / "benchmarks") else QUICK_CONFIG.real.batch_sizes
    assert table.row.tolist() == row_ids(QUICK_CONFIG.decode.batch_sizes, real)
    for col in ("measured", "reference", "value"):
        values = table[col].astype(float)
        assert all(math.isfinite(v) and v > 0 for v in values), (col, values.tolist())
    for _, r in table.iterrows():
        assert r.goal == goal_text(r.row)
        assert r.met == ("" if not r.goal else r.met) and r.met in ("", "yes", "no")


def test_quick_bench_writes_every_file_and_keeps_hand_written_notes(quick_run):
    _, out = quick_run
    for name in [*CSV_FILES, *FIGURES]:
        assert (out / "benchmarks" / name).stat().st_size > 0, name
    md = (out / "benchmarks.md").read_text()
    assert md.startswith("# Benchmarks") and "old text" not in md
    assert md.endswith(f"{NOTES_MARKER}\n\nhand-written diagnosis\n")
    assert "## Goals" in md and "mlx-lm" in md and "load average" in md


def test_the_sizes_flatten_into_meta_keys_one_prefix_a_scenario():
    sizes = QUICK_CONFIG.sizes()
    assert (sizes["join_rows"], sizes["join_context_tokens"]) == (8, 256)  # what the join figure reads
    assert (
        sizes["latency_requests"] == 6 and sizes["hol_chunk_tokens"] == 64 and sizes["real_max_tokens"] == 6
    )
    assert sizes["decode_batch_sizes"] == (1, 8) and sizes["prefill_step_size"] == 128
    assert "name" not in sizes and "shape" not in sizes and len(sizes) == 2 + 4 + 5 + 2 + 3 + 3 + 4


def test_goal_text_names_issue_6_bounds():
    assert goal_text("decode_B32") == ">= 1.10"
    assert goal_text("overhead_B1") == "<= 1.03"
    assert goal_text("join_extend") == "<= 1.00"
    assert goal_text("hol_workbench") == "<= 1.50"
    assert goal_text("hol_mlx_lm") == "" and goal_text("roofline_B8") == ""


def test_goals_text_says_what_each_goal_asks_and_what_a_miss_means():
    assert set(GOAL_MEANINGS) == set(GOALS)
    table = pd.DataFrame(
        [
            {
                "row": "decode_B8",
                "metric": "decode tok/s, B=8",
                "value": 0.93,
                "value_is": "workbench / mlx-lm",
                "goal": goal_text("decode_B8"),
                "met": "no",
            },
            {
                "row": "overhead_B8",
                "metric": "instrumentation overhead, B=8",
                "value": 1.01,
                "value_is": "on / off",
                "goal": goal_text("overhead_B8"),
                "met": "yes",
            },
            {
                "row": "hol_mlx_lm",
                "metric": "head-of-line, mlx-lm",
                "value": 3.0,
                "value_is": "x",
                "goal": "",
                "met": "",
            },
        ]
    )
    lines = goals_text(table, device="gpu").splitlines()
    assert len(lines) == 3  # a header and one line per row with a goal
    assert lines[1].startswith("- decode tok/s, B=8: MISSED (workbench / mlx-lm = 0.930, goal >= 1.10)")
    assert (
        GOAL_MEANINGS["decode"][0] in lines[1] and "a miss means: " + GOAL_MEANINGS["decode"][1] in lines[1]
    )
    assert lines[2].startswith("- instrumentation overhead, B=8: met") and "a miss means" not in lines[2]


def test_on_a_cpu_the_gpu_goals_are_listed_apart_with_why_this_machine_does_not_reach_them():
    rows = [
        ("decode_B8", 0.93, "no"),
        ("paced_ttft_p95", 1.09, "no"),
        ("paced_ttft_p95_loaded", 0.5, "yes"),
        ("overhead_B8", 1.01, "yes"),
    ]
    table = pd.DataFrame(
        [
            {"row": r, "metric": r, "value": v, "value_is": "x / y", "goal": goal_text(r), "met": m}
            for r, v, m in rows
        ]
    )
    lines = goals_text(table, device="cpu").splitlines()
    assert lines[0].startswith("goals this machine can reach: 2 of 2 met")
    assert [ln.split(":")[0] for ln in lines[1:3]] == ["- paced_ttft_p95_loaded", "- overhead_B8"]
    assert lines[3] == "goals set for a GPU (out of reach on this CPU; 0 of 2 met):"
    assert lines[4].startswith("- decode_B8: MISSED") and lines[4].endswith(
        "why not here: " + GPU_GOALS["decode"]
    )
    assert lines[5].startswith("- paced_ttft_p95: MISSED") and GPU_GOALS["paced_ttft_p95"] in lines[5]
    assert "goals set for a GPU" not in goals_text(table, device="gpu")


def test_a_value_that_is_a_median_of_pair_ratios_says_so_where_it_differs_from_measured_over_reference():
    from workbench.bench.report import DECODE_ROWS, _adder, _pair_rows
    from workbench.bench.scenarios import MLX_LM, WORKBENCH

    runs = pd.DataFrame(
        {
            "engine": [WORKBENCH, MLX_LM] * 3,
            "B": 8,
            "pair": [0, 0, 1, 1, 2, 2],
            "tok_per_s": [100.0, 95.0, 60.0, 50.0, 80.0, 100.0],
        }
    )
    rows = []
    _pair_rows(_adder(rows), runs, [8], DECODE_ROWS)
    ((_, metric, unit, measured, reference, _, value, value_is, *_rest),) = rows
    assert (measured, reference) == (80.0, 95.0) and value == pytest.approx(100 / 95)  # pairs 1.05, 1.2, 0.8
    table = pd.DataFrame(
        rows,
        columns=TABLE_COLUMNS,
    )
    assert (
        value_is == "median of pairs: workbench / mlx-lm"
        and "median of pairs: workbench / mlx-lm" in table_text(table)
    )
