"""Execute notebooks in place so their stored outputs are fresh (nbval compares them).

Usage: ``python scripts/execute_notebooks.py notebooks/01_tour.ipynb [...]``
Run it after editing a notebook, review the output diff, commit. Kernels run with
``WORKBENCH_BLAS=off`` like the test suite, except a notebook whose metadata asks for the
users' BLAS (``"workbench": {"blas": "optimized"}``; ``notebooks/conftest.py`` gives nbval
the same rule), and every kernel gets ``OPENBLAS_NUM_THREADS=1`` unless it is set (as under
nbval: one BLAS thread per kernel). Widget state is not stored, so a static HTML export of a notebook loads no
widget script from a CDN. Each executed notebook's cover (``scripts/notebook_covers.py``) is
rewritten from its first figure of this run.
"""

import os
import sys
from pathlib import Path

from notebook_covers import write_cover  # scripts/ is sys.path[0] when this script runs

import nbformat
from nbclient import NotebookClient

# the same numerics as the test suite (tests/conftest.py): MLX's own BLAS, bit-exact oracles
os.environ.setdefault("WORKBENCH_BLAS", "off")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread per kernel, as under nbval

for name in sys.argv[1:]:
    path = Path(name)
    nb = nbformat.read(path, as_version=4)
    optimized = nb.metadata.get("workbench", {}).get("blas") == "optimized"
    env = {k: v for k, v in os.environ.items() if not (optimized and k == "WORKBENCH_BLAS")}
    NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        store_widget_state=False,
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    ).execute(env=env)
    nbformat.write(nb, path)
    write_cover(path)  # its cover is its first figure of this run (docs/covers/)
    print(f"executed {path}" + (" (with the users' BLAS)" if optimized else ""))
