"""Shared fixtures: the bundled model (loaded once), a fake clock, prompt helpers."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.workloads import prompt_of_length


class FakeClock:
    """A clock that advances by ``tick_s`` seconds on every read."""

    def __init__(self, tick_s: float = 0.5):
        self.now_s = 0.0
        self.tick_s = tick_s

    def __call__(self) -> float:
        self.now_s += self.tick_s
        return self.now_s


@pytest.fixture(scope="session")
def bundled():
    """``(model, tokenizer)`` of the bundled tiny-llama, loaded through mlx_lm.load."""
    return wb.load()


@pytest.fixture
def make_sched(bundled):
    """``make_sched(**kwargs)`` -> a Scheduler on the bundled model."""
    model, tokenizer = bundled

    def make(**kwargs):
        return wb.Scheduler(model, tokenizer, **kwargs)

    return make


@pytest.fixture
def prompt(bundled):
    """``prompt(n, start=0)`` -> n token ids from the bundled prompt set."""
    _, tokenizer = bundled
    return lambda n, start=0: prompt_of_length(tokenizer, n, start)


# Notebooks that read data from outside the repository are skipped, with a clear message,
# when it is absent (nbval would fail on their first cell). This hook lives here, not in a
# notebooks/conftest.py, because a second conftest module would shadow ``from conftest import``.
NOTEBOOKS_NEEDING_TRACES = {"06_policies_on_a_real_trace.ipynb": "conv"}


def pytest_collection_modifyitems(config, items):
    from workbench.traces import trace_path

    for item in items:
        name = NOTEBOOKS_NEEDING_TRACES.get(item.path.name)
        if name is None:
            continue
        try:
            trace_path(name)
        except FileNotFoundError as e:
            item.add_marker(pytest.mark.skip(reason=f"needs the shared Azure trace: {e}"))
