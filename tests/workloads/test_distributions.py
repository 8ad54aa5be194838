"""Seeded arrival processes and length distributions (pure numpy, exact expectations)."""

import numpy as np
import pytest

from workbench.workloads.distributions import (
    Fixed,
    LogNormal,
    Uniform,
    gamma_arrivals_s,
    generator,
    lengths_from,
    poisson_arrivals_s,
)


def test_the_same_seed_gives_the_same_arrivals_and_a_generator_is_used_as_given():
    assert np.array_equal(poisson_arrivals_s(50, 2.0, 7), poisson_arrivals_s(50, 2.0, 7))
    assert not np.array_equal(poisson_arrivals_s(50, 2.0, 7), poisson_arrivals_s(50, 2.0, 8))
    expected = np.cumsum(np.random.default_rng(7).exponential(0.5, size=50))
    assert np.array_equal(poisson_arrivals_s(50, 2.0, np.random.default_rng(7)), expected)


def test_arrivals_are_sorted_and_have_the_asked_mean_rate():
    t = poisson_arrivals_s(20_000, 4.0, 0)
    assert np.all(np.diff(t) >= 0) and t[0] > 0
    assert 20_000 / t[-1] == pytest.approx(4.0, rel=0.03)


def test_gamma_gaps_have_the_asked_rate_and_coefficient_of_variation():
    for cv in (0.5, 1.0, 3.0):
        gaps = np.diff(gamma_arrivals_s(40_000, 2.0, cv, 1), prepend=0.0)
        assert gaps.mean() == pytest.approx(0.5, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_lengths_stay_in_their_bounds_and_a_fixed_length_draws_nothing():
    rng = np.random.default_rng(3)
    u = Uniform(4, 6).sample(1000, rng)
    assert set(u.tolist()) == {4, 5, 6} and u.dtype == np.int64
    ln = LogNormal(median_tokens=100, sigma=1.0, low=10, high=300).sample(5000, rng)
    assert ln.min() >= 10 and ln.max() <= 300 and np.median(ln) == pytest.approx(100, rel=0.1)
    state = rng.bit_generator.state
    assert Fixed(9).sample(3, rng).tolist() == [9, 9, 9]
    assert rng.bit_generator.state == state
    assert lengths_from(12) == Fixed(12) and lengths_from(Uniform(1, 2)) == Uniform(1, 2)


@pytest.mark.parametrize(
    "make",
    [
        lambda: poisson_arrivals_s(3, 0.0, 0),
        lambda: poisson_arrivals_s(-1, 1.0, 0),
        lambda: gamma_arrivals_s(3, 1.0, 0.0, 0),
        lambda: generator(None),
        lambda: Fixed(0),
        lambda: Uniform(5, 4),
        lambda: LogNormal(0, 1.0),
        lambda: LogNormal(10, 1.0, low=5, high=4),
        lambda: lengths_from(2.5),
    ],
)
def test_bad_parameters_are_refused_with_a_value_error(make):
    with pytest.raises(ValueError):
        make()
