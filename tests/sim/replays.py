"""Hand-built replays on the cost clock, for the comparison-table tests, and the small
synthetic workload the replay and sweep tests run."""

from __future__ import annotations

import pandas as pd

from workbench.observe.report import build_report
from workbench.sim.replay import SAMPLE_COLUMNS, Replay
from workbench.workloads.distributions import Uniform
from workbench.workloads.workload import Workload, synthetic


def hand_replay(events=(), samples=(), name: str = "hand", **fields) -> Replay:
    """A :class:`Replay` (mode ``"cost"``, no config) whose report is built from ``events`` and
    whose samples are ``samples``, rows of :data:`SAMPLE_COLUMNS`; ``fields`` such as ``layouts``
    pass through."""
    frame = pd.DataFrame(list(samples), columns=SAMPLE_COLUMNS)
    return Replay(
        name=name, config={}, mode="cost", report=build_report(list(events)), samples=frame, **fields
    )


def small_workload(tokenizer, n: int = 10, seed: int = 4) -> Workload:
    """``n`` Poisson arrivals at 8 a second, prompts of 2..40 tokens, 1..9 output tokens."""
    return synthetic(
        tokenizer, n, rate_per_s=8.0, seed=seed, prompt_tokens=Uniform(2, 40), output_tokens=Uniform(1, 9)
    )
