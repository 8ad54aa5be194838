"""Optimized BLAS on Linux: load one before MLX so MLX's CPU matmuls use it.

Knows: where OpenBLAS / MKL shared libraries live, ``ctypes``. Must not know: models.

MLX's Linux CPU wheel links a slow reference BLAS (measured on this project's 2-core
machine: a 1024x1024 float32 matmul in 0.36-0.70 s, versus 0.014-0.03 s with OpenBLAS).
Loading an optimized ``libblas``-compatible library with ``RTLD_GLOBAL`` *before* ``mlx``
is imported makes the dynamic linker bind MLX's ``cblas_*`` calls to it (the same effect
as ``LD_PRELOAD``). ``import workbench`` does this first thing; set ``WORKBENCH_BLAS`` to
a library path to choose one, or to ``off`` to keep MLX's own.

Candidates, in order: ``$WORKBENCH_BLAS``; Debian/Ubuntu's ``libopenblas.so.0``
(``apt-get install libopenblas0-pthread``); PyPI's ``mkl`` (``libmkl_rt.so``, about 1 GB;
``pip install -e ".[mkl]"``). PyPI's ``scipy-openblas32`` cannot be used: its symbols are
prefixed. On macOS MLX uses Accelerate and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SEARCH_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
               "/usr/local/lib")
NAMES = ("libopenblas.so.0", "libopenblas.so", "libmkl_rt.so.2", "libmkl_rt.so.3", "libmkl_rt.so")


@dataclass(frozen=True)
class BlasStatus:
    """What :func:`activate` did: ``library`` loaded (or ``None``) and a one-line ``note``."""

    library: str | None
    note: str


def find_blas() -> str | None:
    """Path of an optimized BLAS to load, or ``None`` (see the module docstring)."""
    env = os.environ.get("WORKBENCH_BLAS", "").strip()
    if env.lower() in ("off", "none", "0"):
        return None
    if env:
        return env
    dirs = [Path(sys.prefix) / "lib", *map(Path, SEARCH_DIRS)]
    for name in NAMES:
        for d in dirs:
            if (d / name).exists():
                return str(d / name)
    found = ctypes.util.find_library("openblas")
    return found


def activate() -> BlasStatus:
    """Load an optimized BLAS globally if on Linux, one is found and MLX is not loaded yet."""
    if not sys.platform.startswith("linux"):
        return BlasStatus(None, "not Linux: MLX uses the platform's BLAS (Accelerate on macOS)")
    if os.environ.get("WORKBENCH_BLAS", "").strip().lower() in ("off", "none", "0"):
        return BlasStatus(None, "WORKBENCH_BLAS=off: MLX's bundled reference BLAS")
    if "mlx.core" in sys.modules and "LD_PRELOAD" not in os.environ:
        return BlasStatus(None, "mlx was imported before workbench: its bundled reference BLAS stays "
                                "(import workbench first, or set LD_PRELOAD)")
    path = find_blas()
    if path is None:
        return BlasStatus(None, "no optimized BLAS found (apt-get install libopenblas0-pthread, or "
                                "pip install mkl); using MLX's bundled reference BLAS")
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        return BlasStatus(None, f"could not load {path}: {exc}")
    return BlasStatus(path, f"loaded {path} before mlx")


STATUS = activate()


def matmul_seconds(n: int = 1024, repeats: int = 3, dtype: str = "float32") -> float:
    """Measured seconds of one ``[n, n] @ [n, n]`` matmul in MLX on the default device
    (mean of ``repeats`` after one untimed; ``dtype`` an ``mlx.core`` dtype name, e.g.
    ``"bfloat16"``)."""
    import mlx.core as mx

    a = mx.random.normal((n, n)).astype(getattr(mx, dtype))
    mx.eval(a @ a)
    start = time.perf_counter()
    for _ in range(repeats):
        mx.eval(a @ a)
    return (time.perf_counter() - start) / repeats
