"""Issue 40's decode goals read from a step profile: the floor's verdict on hand-built frames,
and the profile of live engines on the bundled model."""

import pandas as pd
import pytest

from workbench.bench.decode_profile import PROFILE_COLUMNS, decode_goal_lines, decode_profiles
from workbench.bench.packed import MLX_LM, PACKED, PADDED, factories
from workbench.bench.scenarios import equal_prompts

REFS = {PADDED: ("packed_vs_padded", "the padded layout"), MLX_LM: ("packed_vs_mlx_lm", "mlx-lm")}


def profile(packed_mlx_ms, padded_step_ms=2.0):
    rows = [
        (
            PACKED,
            8,
            3,
            packed_mlx_ms + 0.5,
            0.5,
            packed_mlx_ms,
            120,
            "Gather:8",
            "Matmul:20 Gather:8 Scatter:8",
        ),
        (
            PADDED,
            8,
            3,
            padded_step_ms,
            0.4,
            padded_step_ms - 0.4,
            100,
            "Matmul:20",
            "Matmul:20 SliceUpdate:8",
        ),
        (MLX_LM, 8, 3, 1.0, 1.0, 0.0, 90, "Matmul:20", "Matmul:20"),
    ]
    return pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))


def test_a_missed_goal_says_its_floor_and_where_the_time_went():
    decode = pd.DataFrame([dict(B=8, packed_vs_padded=0.9, packed_vs_mlx_lm=1.2)])
    # the packed graph alone (2.1 ms) costs more than the padded layout's whole step (2.0 ms)
    padded, mlx = decode_goal_lines(decode, profile(2.1), PACKED, REFS)
    assert padded.startswith("- decode B=8: packed 0.90x the padded layout's tok/s (goal >= 1): missed")
    assert "MLX work alone 2.10 ms against the padded layout's whole step 2.00 ms: out of reach" in padded
    assert "packed 2.60 = Python 0.50 + MLX 2.10, 120 graph nodes (Gather:8)" in padded
    assert padded.endswith(
        "; node kinds the packed step has beyond the padded layout's: Gather +8, Scatter +8, SliceUpdate -8"
    )
    assert mlx == "- decode B=8: packed 1.20x mlx-lm's tok/s (goal >= 1): met"
    # below it: cutting the packed layout's Python could still reach the goal
    (padded, _) = decode_goal_lines(decode, profile(1.5), PACKED, REFS)
    assert "1.50 ms against the padded layout's whole step 2.00 ms: not ruled out" in padded
    # a B the profile did not measure
    other = pd.DataFrame([dict(B=32, packed_vs_padded=0.9, packed_vs_mlx_lm=0.8)])
    assert all(
        line.endswith("no profile at this B") for line in decode_goal_lines(other, profile(1.5), PACKED, REFS)
    )


def test_bad_arguments_are_refused_naming_them():
    with pytest.raises(ValueError, match="decode_tokens >= 4"):
        decode_profiles({"x": lambda: None}, [[1, 2]], 3)


@pytest.mark.model
def test_the_profile_of_live_engines_splits_each_step(bundled):
    model, tok = bundled
    got = decode_profiles(
        factories(model, tok, (PADDED, PACKED, MLX_LM)), equal_prompts(tok, 3, 8), 8, repeats=1
    )
    assert list(got.engine) == [PADDED, PACKED, MLX_LM] and set(got.B) == {3}
    for row in got.itertuples():
        assert row.runs == 1 and row.nodes > 0 and row.step_ms > 0, row
        # medians of the parts: they add up to about the median step (each is a median over the steps)
        assert row.python_ms + row.mlx_ms == pytest.approx(row.step_ms, rel=0.3), row


@pytest.mark.model
def test_the_packed_bench_decode_sections_give_runs_and_a_profile_per_batch_size(bundled):
    from workbench.bench.packed import _decode_sections

    model, tok = bundled
    decode, prof = _decode_sections(model, tok, (9,), pairs=1, repeats=1)
    # B = 9 is above max_batch 8: the engines get 9 rows, so every request decodes at once
    assert set(decode.B) == set(prof.B) == {9}
    assert set(decode.engine) == set(prof.engine) == {PADDED, PACKED, MLX_LM}
    assert decode.same_tokens.dropna().all()  # the layouts and mlx-lm agree on every token
    assert (prof.runs == 1).all() and (prof.nodes > 0).all()
    kinds = prof.set_index("engine").node_kinds  # every kind, counted: they add up to the nodes
    assert all(
        sum(int(x.rsplit(":", 1)[1]) for x in kinds[e].split()) == n for e, n in zip(prof.engine, prof.nodes)
    )
    # the packed step reads its rows' keys and values from the pools (gathers); the padded one slices
    gathers = {
        e: dict(x.rsplit(":", 1) for x in kinds[e].split()).get("Gather", "0") for e in (PACKED, PADDED)
    }
    assert int(gathers[PACKED]) > int(gathers[PADDED]), gathers
