"""Notebooks that need data from outside the repository are skipped, with a clear
message, when that data is absent (nbval would otherwise fail on their first cell)."""

import pytest

from workbench.traces import TRACE_DIR_ENV, trace_path

NEEDS_TRACE = {"06_policies_on_a_real_trace.ipynb": "conv"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = NEEDS_TRACE.get(item.path.name)
        if name is None:
            continue
        try:
            trace_path(name)
        except FileNotFoundError as e:
            item.add_marker(pytest.mark.skip(reason=f"needs the shared Azure trace ({e}); set ${TRACE_DIR_ENV}"))
