"""Top-2 margins of greedy decoding: how often a model nearly ties over a workload.

Knows: the oracle's solo reference (mlx-lm's ``generate_step``), which records at every
generated token the top-1 minus top-2 log-probability; that equals the top-2 *logit*
margin, since log-softmax shifts all logits of a step by the same amount. Uses request
validation and the demo workload. Must not know: the scheduler's internals.

A *near-tie* is a decode step whose margin is below ``NEAR_TIE_MARGIN`` (1e-3): there,
float rounding that differs between a batched and a solo run may flip the argmax, so a
token-for-token oracle is only a sharp test on a model whose near-ties are rare. A
random-weight model ties often; a trained one rarely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.request import validate
from ..engine.scheduler import vocab_size
from ..workloads.workload import demo_workload
from .oracle import TokenTrace, ref_request, solo_reference

NEAR_TIE_MARGIN = 1e-3


@dataclass(frozen=True)
class MarginReport:
    """Margins ``[T]`` (logprob units, nats) of every generated token of every trace, and
    the near-tie count below ``threshold``."""

    margins: np.ndarray
    threshold: float

    @property
    def n_steps(self) -> int:
        """Decode steps pooled (tokens)."""
        return int(self.margins.size)

    @property
    def n_near_ties(self) -> int:
        """Steps whose top-2 margin is below ``threshold``."""
        return int((self.margins < self.threshold).sum())

    @property
    def near_tie_rate(self) -> float:
        """Fraction of steps with a margin below ``threshold`` (0.0 for no steps)."""
        return self.n_near_ties / self.n_steps if self.n_steps else 0.0

    def text(self) -> str:
        """One line for humans, e.g. ``near-ties (top-2 margin < 1e-03): 0 of 452 decode
        steps (0.00%); margin min 0.0123, median 1.87``."""
        if not self.n_steps:
            return "near-ties: no decode steps"
        return (
            f"near-ties (top-2 margin < {self.threshold:.0e}): {self.n_near_ties} of {self.n_steps} "
            f"decode steps ({100 * self.near_tie_rate:.2f}%); margin min {self.margins.min():.4g}, "
            f"median {np.median(self.margins):.3g}"
        )


def margin_report(traces: Sequence[TokenTrace], threshold: float = NEAR_TIE_MARGIN) -> MarginReport:
    """Pool the reference margins of ``traces`` (each from :func:`oracle.solo_reference`)."""
    margins = np.array([m for t in traces for m in t.margins], dtype=np.float64)
    return MarginReport(margins, threshold)


def demo_margins(model: Any, tokenizer: Any, threshold: float = NEAR_TIE_MARGIN) -> MarginReport:
    """Run every request of the demo workload (:func:`workloads.demo_workload`) alone and
    greedily through mlx-lm and pool the top-2 margins of all its decode steps."""
    vocab = vocab_size(model, tokenizer)
    refs = [ref_request(validate(req, tokenizer, vocab)) for _, req in demo_workload(tokenizer)]
    return margin_report([solo_reference(model, r) for r in refs], threshold)
