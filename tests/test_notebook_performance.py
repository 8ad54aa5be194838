"""Notebook 07 teaches from ratios measured in its own cells, each with its spread, and
explains the real model's flat decode by a matmul it times; notebook 10 says what it loads
before the long first call and how long the first token took (issue 43: a 39-row goal table
of another run, real-model tok/s with no word on why, ~40 s of silence before a first word)."""

import re
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SPREAD = re.compile(r"= (\d+\.\d+) \((\d+\.\d+)\.\.(\d+\.\d+)\)")  # "median (lowest..highest)"


def cells(name: str) -> list:
    return [c for c in nbformat.read(NOTEBOOKS / name, as_version=4).cells if c.cell_type == "code"]


def printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_notebook_07_prints_each_engine_ratio_it_measures_with_its_spread_and_no_goal_table():
    code = cells("07_performance.ipynb")
    measuring = [c for c in code if "run_once(" in c.source or "decode_runs(" in c.source]
    assert measuring, "no cell of notebook 07 runs the engines it compares"
    lines = [line for c in measuring for line in printed(c).splitlines() if " / " in line]
    assert {"B=1: workbench / mlx-lm", "B=8: workbench / mlx-lm"} <= {
        line.split(" tok/s")[0] for line in lines
    }
    for line in lines:  # every ratio: median (lowest..highest) over the alternating rounds
        median, low, high = map(float, SPREAD.search(line).groups())
        assert 0 < low <= median <= high, line
    every = "".join(printed(c) for c in code)
    assert not re.search(r"\bgoal\b", every), "the goal table of the documented run is docs/benchmarks.md's"
    notes = "".join(c.source for c in nbformat.read(NOTEBOOKS / "07_performance.ipynb", as_version=4).cells)
    assert "docs/benchmarks.md" in notes


def test_notebook_07_times_the_4bit_matmul_that_keeps_the_real_models_decode_flat():
    code = cells("07_performance.ipynb")
    timing = [c for c in code if "quantized_matmul" in c.source]
    assert len(timing) == 1, "the real model's tok/s is explained by a 4-bit matmul timed in the notebook"
    out = printed(timing[0])
    grows = {
        form: tuple(map(float, m.groups()))
        for form, m in (
            (f, re.search(rf"{f}.*32 rows cost (\d+\.\d)x one row \((\d+\.\d)\.\.(\d+\.\d)\)", out))
            for f in ("4-bit", "float32")
        )
        if m
    }
    assert set(grows) == {"4-bit", "float32"}, out
    assert all(low <= median <= high for median, low, high in grows.values()), grows
    assert re.search(r"the 4-bit matmuls of one B=1 step: .* at most \d+\.\d tok/s at B=1", out), out
    assert "the documented B=1 step" in out


def test_notebook_10_says_what_it_loads_before_the_load_and_when_the_first_token_landed():
    code = cells("10_chat_batching.ipynb")
    load = next(c for c in code if "wb.load(" in c.source)
    before = load.source.split("wb.load(")[0]
    assert re.search(r"print\(.*loading.*flush=True\)", before, re.S), "nothing printed before the load"
    out = printed(load)
    assert out.startswith("loading SmolLM2-135M-Instruct") and re.search(r"\nloaded in \d+\.\d s\n", out), out
    build = next(c for c in code if "wb.Scheduler(" in c.source)
    assert re.fullmatch(r"Scheduler built in \d+\.\d s: .*\n", printed(build)), printed(build)
    first = next(c for c in code if "the first token landed" in c.source)
    landed = re.search(
        r"the first token landed (\d+\.\d+) s after .* the last (\d+\.\d) s after it", printed(first)
    )
    assert landed and 0 < float(landed.group(1)) <= float(landed.group(2)), printed(first)


def test_notebook_15_measures_the_modes_cost_in_a_cell_and_prints_its_coverage_from_the_engine():
    nb = nbformat.read(NOTEBOOKS / "15_batch_invariance.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    timing = [c for c in code if "invariance_cost.measure(" in c.source]
    assert len(timing) == 1, "the mode's cost is measured in the notebook, not quoted"
    assert "nbval-ignore-output" in timing[0].metadata.get("tags", [])  # timings vary by machine and load
    ratios = re.findall(
        r"B = +(\d+): decode step [\d.]+ ms in the mode, [\d.]+ ms by default: (\d+\.\d+)x",
        printed(timing[0]),
    )
    assert [int(b) for b, _ in ratios] == [1, 8] and all(float(r) > 0 for _, r in ratios)
    covering = [c for c in code if "invariant_coverage.coverage(" in c.source]
    assert len(covering) == 1 and "nbval-ignore-output" not in covering[0].metadata.get("tags", [])
    header, *table = printed(covering[0]).splitlines()
    verdicts = [line for line in table if not line.startswith(" ")]  # a refusal's reason is indented below it
    from workbench.verify import invariant_coverage

    assert header.split() == ["with", "the", "mode", "result"]
    assert [line.split("  ")[0].strip() for line in verdicts] == [
        " + ".join(s) for s in invariant_coverage.combinations(invariant_coverage.ISSUE_FEATURES)
    ]
    assert all(
        ("every row equal to its run alone (" in v) or v.endswith("refused at construction:")
        for v in verdicts
    )
    prose = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "still refuses, at construction: the packed layout" not in prose  # it composes (the cell says)
    assert not re.search(r"\d\.\d+x", prose), "the cost is the cell's, not a number typed in the prose"
