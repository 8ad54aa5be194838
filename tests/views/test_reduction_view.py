"""The reduction-order view: float32 sums in the stated blocked order, and two orders of the
same products giving other bits."""

import numpy as np
import pytest
from matplotlib.figure import Figure

from workbench.views.reduction import blocked_sum, reduction_text, render_reduction, ulps_apart


def test_blocked_sum_is_the_stated_float32_order():
    x = np.array([1e8, 1, -1e8, 1], np.float32)
    w = np.ones(4, np.float32)
    partials, total = blocked_sum(x, w, 4)  # ((1e8 + 1) - 1e8) + 1: 1e8 + 1 rounds to 1e8
    assert partials.tolist() == [1.0] and total == np.float32(1.0)
    partials, total = blocked_sum(x, w, 2)  # (1e8 + 1) + (-1e8 + 1): each rounds, then 0
    assert partials.tolist() == [1e8, -1e8] and total == np.float32(0.0)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=100).astype(np.float32), rng.normal(size=100).astype(np.float32)
    running = np.float32(0)
    for p in a * b:
        running = np.float32(running + p)
    assert blocked_sum(a, b, 100)[1] == running  # one block: the plain left-to-right sum


def test_ulps_and_text():
    assert ulps_apart(np.float32(1.0), np.nextafter(np.float32(1.0), np.float32(2), dtype=np.float32)) == 1
    assert ulps_apart(np.float32(0.5), np.float32(0.5)) == 0
    x = np.array([1e8, 1, -1e8, 1], np.float32)
    assert reduction_text(x, np.ones(4, np.float32), [4, 2]) == "\n".join(
        [
            "K = 4 products, summed in float32 in 2 orders:",
            "  one running sum (block 4)  1 block(s)  sum 1.00000000 (bits 3f800000)",
            "  blocks of 2                2 block(s)  sum 0.00000000 (bits 00000000)  1065353216 ulp from the first",
        ]
    )
    assert isinstance(render_reduction(x, np.ones(4, np.float32), [4, 2]), Figure)


def test_refusals():
    with pytest.raises(ValueError, match="block >= 1"):
        blocked_sum(np.ones(3), np.ones(3), 0)
    with pytest.raises(ValueError, match=r"two \[K\] vectors"):
        blocked_sum(np.ones(3), np.ones(4), 1)
