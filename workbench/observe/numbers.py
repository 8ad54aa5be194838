"""Numbers written for people: small magnitudes as ``m×10ⁿ`` rather than e-notation.

Knows: nothing of the engine. Used by the oracle's verdict lines and (re-exported by
:mod:`workbench.views.style`) by the views.
"""

from __future__ import annotations

import math

SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def scientific(x: float, digits: int = 2) -> str:
    """``x`` with ``digits`` significant digits as ``m×10ⁿ``, for magnitudes far from 1 (a
    log-prob difference of a few ulps) without e-notation; ``0`` and non-finite values as
    ``:g`` writes them.

    >>> scientific(2.9e-06), scientific(-1.25e-7, 3), scientific(0.0)
    ('2.9×10⁻⁶', '-1.25×10⁻⁷', '0')
    """
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa}×10{str(int(exponent)).translate(SUPERSCRIPT)}"
