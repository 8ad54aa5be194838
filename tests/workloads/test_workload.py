"""Workloads: exact-length prompts, seeded synthetic generators, shared prefixes."""

import pandas as pd
import pytest

import workbench as wb
from workbench.workloads.distributions import Uniform
from workbench.workloads.workload import (
    WORKLOAD_COLUMNS,
    Workload,
    prompt_maker,
    prompt_of_length,
    source_ids,
    synthesize_prompts,
    synthetic,
)


@pytest.fixture(scope="module")
def tok(bundled):
    return bundled[1]


def test_a_seeded_synthetic_workload_is_identical_run_to_run(tok):
    a = synthetic(
        tok, 30, rate_per_s=3.0, seed=11, prompt_tokens=Uniform(2, 90), output_tokens=Uniform(1, 20)
    )
    b = synthetic(
        tok, 30, rate_per_s=3.0, seed=11, prompt_tokens=Uniform(2, 90), output_tokens=Uniform(1, 20)
    )
    assert a == b
    assert a != synthetic(
        tok, 30, rate_per_s=3.0, seed=12, prompt_tokens=Uniform(2, 90), output_tokens=Uniform(1, 20)
    )


def test_synthetic_prompts_have_exactly_the_sampled_lengths_and_requests_never_stop_early(tok):
    w = synthetic(
        tok,
        25,
        rate_per_s=1.0,
        seed=2,
        arrivals="gamma",
        cv=2.0,
        prompt_tokens=Uniform(1, 300),
        output_tokens=7,
    )
    f = w.frame()
    assert list(f.columns) == WORKLOAD_COLUMNS and len(f) == 25
    assert f.prompt_tokens.between(1, 300).all() and (f.max_tokens == 7).all()
    assert f.arrival_s.is_monotonic_increasing
    assert all(r.stop_ids == [] for _, r in w)
    assert w.name == "gamma cv 2 1 req/s"


def test_shared_prefixes_are_shared_and_tails_differ(tok):
    prompts = synthesize_prompts(tok, [12, 12, 12, 12, 3], 5, shared_prefix_tokens=8, n_prefixes=1)
    assert all(p[:8] == prompts[0][:8] for p in prompts[:4])
    assert len({tuple(p[8:]) for p in prompts[:4]}) > 1
    assert prompts[4] == prompts[0][:3]  # shorter than the prefix: the prefix's first tokens
    two = synthesize_prompts(tok, [10] * 20, 1, shared_prefix_tokens=6, n_prefixes=2)
    assert len({tuple(p[:6]) for p in two}) == 2


def test_prompts_are_cut_from_the_prompt_set_tokenized_once(tok):
    ids = source_ids(tok)
    assert prompt_of_length(tok, 5, start=len(ids) - 2) == [ids[-2], ids[-1], ids[0], ids[1], ids[2]]
    assert source_ids(tok) is ids


def test_a_prompt_maker_cuts_the_same_prompts_as_prompt_of_length(tok):
    prompt = prompt_maker(tok)
    assert prompt(5) == prompt_of_length(tok, 5)
    assert prompt(4, 80) == prompt(4, start=80) == prompt_of_length(tok, 4, 80)
    with pytest.raises(ValueError, match="n_tokens must be >= 1"):
        prompt(0)


def test_a_workload_sorts_by_arrival_keeps_ties_in_order_and_refuses_bad_items():
    a, b, c = (wb.Request(prompt=[i + 1], max_tokens=2) for i in range(3))
    w = Workload(((2.0, a), (0.5, b), (0.5, c)), name="w")
    assert [r for _, r in w] == [b, c, a] and w.duration_s == 2.0 and len(w.head(2)) == 2
    assert (
        w.text() == "w: 3 requests over 2.0 s (1.50 req/s), prompt tokens p50 1 max 1, max_tokens p50 2 max 2"
    )
    assert [r.priority for _, r in w.with_priorities([3, 1, 2])] == [3, 1, 2]
    with pytest.raises(ValueError, match="arrival_s"):
        Workload(((-1.0, a),))
    with pytest.raises(ValueError, match="Request"):
        Workload(((0.0, "hello"),))
    with pytest.raises(ValueError, match="Poisson arrivals have cv 1"):
        synthetic(None, 3, 1.0, 0, cv=2.0)


def test_text_prompts_have_unknown_length_in_the_frame():
    w = Workload(((0.0, wb.Request(prompt="def f():", max_tokens=3)),))
    assert w.frame().prompt_tokens.tolist() == [-1]
    assert "text prompts" in w.text()
    assert isinstance(w.frame(), pd.DataFrame)
