"""Every pair of the twelve features of docs/compose.md: refused at construction naming both
features' settings, or running with every row equal to its run alone (a seeded random sample
of the pairs that run: WORKBENCH_COMPOSE_SEED, WORKBENCH_COMPOSE_PAIRS)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from workbench.verify.compose import NAMED_BY, all_pairs, check_pair, refusal, refused_in

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def refusals(bundled):
    """pair -> the engine's refusal at construction ("" where it builds), over all 66 pairs."""
    model, tok = bundled
    return {pair: refusal(model, tok, pair) for pair in all_pairs()}


def test_a_refused_pair_is_refused_at_construction_naming_both_settings(refusals):
    assert len(refusals) == 66
    for (a, b), message in refusals.items():
        if message:
            assert NAMED_BY[a] in message and NAMED_BY[b] in message, (a, b, message)


def test_the_documented_table_is_the_engines_refusals(refusals):
    """docs/compose.md (``workbench compose --out docs``) lists exactly the pairs the engine refuses."""
    documented = refused_in((ROOT / "docs" / "compose.md").read_text())
    assert documented == {frozenset(p) for p, m in refusals.items() if m}


def test_a_random_sample_of_the_pairs_that_run_gives_every_row_equal_alone(bundled, refusals):
    model, tok = bundled
    seed = int(os.environ.get("WORKBENCH_COMPOSE_SEED", "0"))
    running = [p for p, m in refusals.items() if not m]
    sample = random.Random(seed).sample(running, int(os.environ.get("WORKBENCH_COMPOSE_PAIRS", "4")))
    for pair in sample:
        result = check_pair(model, tok, pair)
        assert result.result == "runs" and result.rows == 8 == result.equal, (seed, pair, result)
        assert not result.submit_refused, (pair, result.submit_refused)
