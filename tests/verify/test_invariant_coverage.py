"""What composes with the batch-invariant mode, checked by the engine (issue 39: notebook 15
and ``workbench invariance`` show the coverage from their own run, not typed prose)."""

import pytest

import workbench as wb
from workbench.verify import compose, invariant_coverage

pytestmark = pytest.mark.model


def test_the_sets_are_every_other_feature_and_the_packed_layout_with_each_three_way_one():
    sets = invariant_coverage.combinations()
    assert [s[0] for s in sets if len(s) == 1] == [n for n in compose.FEATURES if n != "batch_invariant"]
    assert [s for s in sets if len(s) == 2] == [("packed", x) for x in invariant_coverage.PACKED_WITH]


def test_coverage_runs_the_rows_against_alone_or_prints_the_engines_refusal():
    model, tok = wb.load()
    runs, refused = invariant_coverage.coverage(
        model, tok, sets=[("speculative",), ("packed", "no_reuse_slots")]
    )
    assert runs.pair == ("batch_invariant", "speculative") and runs.result == "runs"
    assert runs.rows >= 8 and runs.equal == runs.rows  # every row of the mixed workload == alone
    assert refused.result == "refused" and "reuse_slots" in refused.refused
    text = invariant_coverage.coverage_text([runs, refused]).splitlines()
    assert text[0].split() == ["with", "the", "mode", "result"]  # the table's header
    assert text[1].startswith("speculative ") and text[1].endswith(
        f"every row equal to its run alone ({runs.rows} of {runs.rows})"
    )
    assert text[2].startswith("packed + no_reuse_slots  refused at construction:")
    assert text[3].startswith(" " * 8) and text[3].strip().startswith(
        "reuse_slots=False"
    )  # the reason, indented
    wrong = compose.PairResult(
        ("batch_invariant", "kv_bits"), rows=3, equal=2, wrong={"seeded (uid 1)": "log-probs differ"}
    )
    assert "1 of 3 rows differ from their runs alone" in invariant_coverage.coverage_text([wrong])


def test_an_unknown_feature_is_named():
    with pytest.raises(KeyError, match="sets: \\['fast'\\] not among the features"):
        invariant_coverage.coverage(None, None, sets=[("fast",)])


def test_the_sets_can_be_the_features_issue_39_names():
    sets = invariant_coverage.combinations(invariant_coverage.ISSUE_FEATURES)
    assert sets[:4] == [("packed",), ("speculative",), ("kv_bits",), ("kv_budget",)] and len(sets) == 7
    assert all(n in compose.FEATURES for s in sets for n in s)
