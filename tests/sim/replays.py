"""Hand-built replays on the cost clock, for the comparison-table tests."""

from __future__ import annotations

import pandas as pd

from workbench.observe.report import build_report
from workbench.sim.replay import SAMPLE_COLUMNS, Replay


def hand_replay(events=(), samples=(), name: str = "hand", **fields) -> Replay:
    """A :class:`Replay` (mode ``"cost"``, no config) whose report is built from ``events`` and
    whose samples are ``samples``, rows of :data:`SAMPLE_COLUMNS`; ``fields`` such as ``layouts``
    pass through."""
    frame = pd.DataFrame(list(samples), columns=SAMPLE_COLUMNS)
    return Replay(
        name=name, config={}, mode="cost", report=build_report(list(events)), samples=frame, **fields
    )
