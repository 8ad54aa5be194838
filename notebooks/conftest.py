"""nbval runs these notebooks in kernels that inherit this process's environment: give
them the test suite's numerics (``WORKBENCH_BLAS=off``, see ``tests/conftest.py``) also
when only the notebooks are collected (``pytest notebooks``)."""

import os

os.environ.setdefault("WORKBENCH_BLAS", "off")
