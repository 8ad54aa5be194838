"""``workbench invariance --cost``: the batch-invariant mode's decode step and prefill against
the default path, alternating, in one run (issue 39's cost table)."""

import json

import pytest

import workbench as wb
from workbench.bench import invariance_cost
from workbench.cli import main
from workbench.verify import invariant_coverage

ISSUE = invariant_coverage.ISSUE_FEATURES

pytestmark = pytest.mark.model


def test_measure_times_each_b_in_alternating_pairs_and_the_prefill():
    model, tok = wb.load()
    report = invariance_cost.measure(
        model, tok, batch_sizes=(1, 3), pairs=3, prefill_batch=2, prefill_range=(20, 40)
    )
    assert [s.B for s in report.steps] == [1, 3]
    for s in report.steps:
        assert s.pairs == 3 and s.default_ms > 0 and s.invariant_ms > 0 and s.ratio > 0
        assert len(s.quartiles) == 3 and s.quartiles[0] <= s.ratio <= s.quartiles[2]
    assert len(report.prefill.lengths) == 2 and all(20 <= n <= 40 for n in report.prefill.lengths)
    assert len(report.prefill.rounds) == 3 and report.prefill.ratio > 0
    text = report.text().splitlines()
    assert text[0].startswith("B =   1: decode step ") and "ms by default: " in text[0]
    assert "alternating rounds, middle half" in text[1] and text[2].startswith("B =   3: ")
    assert text[4].startswith("prefill of 2 prompts of ") and "1-min load average" in text[5]
    assert [r.get("B") for r in report.records()] == [1, 3, None]


def test_measure_names_a_bad_setting():
    model, tok = wb.load()
    with pytest.raises(ValueError, match="pairs"):
        invariance_cost.measure(model, tok, pairs=0)
    with pytest.raises(ValueError, match="prefill_range"):
        invariance_cost.measure(model, tok, batch_sizes=(1,), pairs=1, prefill_range=(50, 10))


def test_the_command_prints_the_step_ratios_and_the_prefill_ratio(capsys, tmp_path):
    out = tmp_path / "cost.jsonl"
    args = ["invariance", "--cost", "--bench-shape", "quick", "--batch-sizes", "1", "2", "--pairs", "2"]
    assert (
        main(
            [
                *args,
                "--prefill-batch",
                "1",
                "--prefill-range",
                "8",
                "16",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    header, *lines = capsys.readouterr().out.strip().splitlines()
    # what was measured on what: the model, its weights' dtype, the device, mlx, the CPU's BLAS
    assert header.startswith(
        "the batch-invariant mode against the default path: --bench-shape quick, weights float32, "
    )
    assert "Device(cpu, 0), mlx " in header and ", BLAS " in header
    heads = [line.split(":")[0] for line in lines if not line.startswith(" ")]
    assert heads == ["B =   1", "B =   2", heads[2]] and len(lines) == 6
    assert lines[4].startswith("prefill of 1 prompts of ") and "s by default: " in lines[4]
    assert [json.loads(x).get("B") for x in out.read_text().splitlines()] == [1, 2, None]


def test_rotated_steps_turns_the_order_by_one_every_round_and_times_each_engine():
    order = []

    class Engine:
        def __init__(self, name):
            self.name = name

        def step(self):
            order.append(self.name)

    ms, cpu = invariance_cost.rotated_steps({n: Engine(n) for n in "abc"}, 4)
    assert order == list("abcbcacababc")  # each engine first, second and last alike
    assert {n: len(t) for n, t in ms.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(t >= 0 for ts in ms.values() for t in ts) and set(cpu) == set("abc")
    order.clear()
    invariance_cost.rotated_steps({n: Engine(n) for n in "de"}, 3, before=lambda n: order.append(n.upper()))
    assert order == list("DdEeEeDdDdEe")  # two engines: swapped every round; each set up before its step


def test_the_command_prints_the_cost_and_the_coverage_from_the_same_run(capsys):
    args = ["invariance", "--cost", "--bench-shape", "quick", "--batch-sizes", "1", "--pairs", "1"]
    assert main([*args, "--prefill-batch", "0", "--device", "cpu", "--coverage"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[1:]  # after the header line
    assert lines[0].startswith("B =   1: decode step ") and lines[2].startswith("the mode's coverage on ")
    assert lines[3].split() == ["with", "the", "mode", "result"]
    table = dict(
        line.split("  ", 1) for line in lines[4:] if not line.startswith(" ")
    )  # reasons are indented
    assert [k.strip() for k in table] == [" + ".join(s) for s in invariant_coverage.combinations(ISSUE)]
    for features, verdict in table.items():  # the engine's own: rows == alone, or its refusal
        assert verdict.strip().startswith(
            ("every row equal to its run alone (", "refused at construction:")
        ), features


def test_summary_gives_each_engines_median_step_and_its_ratios_to_the_default():
    ms = {"default": [10.0, 20.0, 10.0, 20.0], "mode": [11.0, 22.0, 12.0, 24.0]}
    out = invariance_cost.summary(ms, {"default": 2.0, "mode": 3.0})
    assert out["default_ms"] == 15.0 and out["mode_ms"] == 17.0 and "default_ratio" not in out
    assert out["mode_ratio"] == 1.15 and out["mode_cpu_ratio"] == 1.5  # ratios 1.1, 1.1, 1.2, 1.2
    assert out["mode_quartiles"][0] <= out["mode_ratio"] <= out["mode_quartiles"][2]


def test_summary_of_one_round_gives_its_ratio_as_its_quartiles():
    out = invariance_cost.summary({"default": [10.0], "mode": [12.0]}, {"default": 1.0, "mode": 1.0})
    assert out["mode_ratio"] == 1.2 and out["mode_quartiles"] == [1.2]  # as step_cost's StepCost at one pair
