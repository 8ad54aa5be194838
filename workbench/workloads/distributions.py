"""Random arrival times and lengths for synthetic workloads: pure numpy, explicitly seeded.

Knows: numpy's ``Generator``. Must not know: tokenizers, requests, the scheduler.

Arrival processes (times in seconds from 0, sorted):

- Poisson at ``rate_per_s``: exponential inter-arrival gaps with mean ``1 / rate_per_s``
  (coefficient of variation, CV, 1).
- Gamma at ``rate_per_s`` with ``cv``: gamma gaps with shape ``k = 1 / cv**2`` and scale
  ``1 / (rate_per_s * k)``, so the mean gap is still ``1 / rate_per_s`` and the gaps'
  CV is ``cv``. ``cv > 1`` is bursty (clusters and lulls), ``cv == 1`` is Poisson,
  ``cv < 1`` is more regular; ``cv -> 0`` tends to a fixed gap.

Lengths (tokens, ints ``>= 1``): :class:`Fixed`, :class:`Uniform` (both ends included),
:class:`LogNormal` (given its median and the sigma of its log, clipped to
``[low, high]``). Each has ``sample(n, rng) -> int64 [n]``.

Every function takes ``rng``: a ``numpy.random.Generator`` or an int seed (see
:func:`generator`), never the global numpy state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def generator(seed: int | np.random.Generator) -> np.random.Generator:
    """``seed`` itself when it is a ``Generator``, else ``np.random.default_rng(seed)``.

    Raises:
        ValueError: for anything but an int or a Generator (``None`` included: seeds are
            explicit).
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return np.random.default_rng(int(seed))
    raise ValueError(f"seed must be an int or a numpy.random.Generator, got {seed!r}")


def _positive(name: str, value: float) -> float:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _count(n: int) -> int:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    return int(n)


def poisson_arrivals_s(n: int, rate_per_s: float, rng: int | np.random.Generator) -> np.ndarray:
    """``[n]`` float64 arrival times (s) of a Poisson process at ``rate_per_s``; the
    first arrival is one gap after 0.

    Raises:
        ValueError: for ``n < 0`` or a rate that is not a finite number > 0.
    """
    rate = _positive("rate_per_s", rate_per_s)
    return np.cumsum(generator(rng).exponential(1.0 / rate, size=_count(n)))


def gamma_arrivals_s(n: int, rate_per_s: float, cv: float, rng: int | np.random.Generator) -> np.ndarray:
    """``[n]`` float64 arrival times (s) with gamma gaps of mean ``1 / rate_per_s`` and
    coefficient of variation ``cv`` (see the module docstring).

    Raises:
        ValueError: for ``n < 0``, or a rate or cv that is not a finite number > 0.
    """
    rate = _positive("rate_per_s", rate_per_s)
    shape = 1.0 / _positive("cv", cv) ** 2
    return np.cumsum(generator(rng).gamma(shape, 1.0 / (rate * shape), size=_count(n)))


def _tokens(name: str, value: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1 (tokens), got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Fixed:
    """Every length is ``tokens``."""

    tokens: int

    def __post_init__(self):
        _tokens("Fixed.tokens", self.tokens)

    def sample(self, n: int, rng: int | np.random.Generator) -> np.ndarray:
        """``[n]`` int64, all ``tokens`` (``rng`` is not drawn from)."""
        return np.full(_count(n), self.tokens, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Lengths uniform over ``low..high`` tokens, both included."""

    low: int
    high: int

    def __post_init__(self):
        if _tokens("Uniform.low", self.low) > _tokens("Uniform.high", self.high):
            raise ValueError(f"Uniform needs low <= high, got low={self.low}, high={self.high}")

    def sample(self, n: int, rng: int | np.random.Generator) -> np.ndarray:
        """``[n]`` int64 in ``[low, high]``."""
        return generator(rng).integers(self.low, self.high + 1, size=_count(n), dtype=np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Lengths ``round(exp(N(log(median_tokens), sigma)))`` clipped to ``[low, high]``
    (``high=None``: no upper clip). Long-tailed, like real prompt and output lengths."""

    median_tokens: float
    sigma: float
    low: int = 1
    high: int | None = None

    def __post_init__(self):
        _positive("LogNormal.median_tokens", self.median_tokens)
        _positive("LogNormal.sigma", self.sigma)
        _tokens("LogNormal.low", self.low)
        if self.high is not None and _tokens("LogNormal.high", self.high) < self.low:
            raise ValueError(f"LogNormal needs low <= high, got low={self.low}, high={self.high}")

    def sample(self, n: int, rng: int | np.random.Generator) -> np.ndarray:
        """``[n]`` int64 in ``[low, high]``."""
        x = generator(rng).lognormal(math.log(self.median_tokens), self.sigma, size=_count(n))
        return np.clip(np.rint(x), self.low, self.high).astype(np.int64)


Lengths = Fixed | Uniform | LogNormal


def lengths_from(spec: "int | Lengths") -> Lengths:
    """A length distribution from an int (:class:`Fixed`) or a distribution itself.

    Raises:
        ValueError: for anything else.
    """
    if isinstance(spec, (Fixed, Uniform, LogNormal)):
        return spec
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return Fixed(int(spec))
    raise ValueError(f"lengths must be an int or a Fixed / Uniform / LogNormal, got {spec!r}")
