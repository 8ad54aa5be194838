"""Optimized BLAS on Linux: load one before MLX so MLX's CPU matmuls use it.

Knows: where OpenBLAS / MKL shared libraries live, ``ctypes``. Must not know: models.

MLX's Linux CPU wheel links a slow reference BLAS (measured on this project's 2-core
machine: a 1024x1024 float32 matmul in 0.36-0.70 s, versus 0.014-0.03 s with OpenBLAS).
Loading an optimized ``libblas``-compatible library with ``RTLD_GLOBAL`` *before* ``mlx``
is imported makes the dynamic linker bind MLX's ``cblas_*`` calls to it (the same effect
as ``LD_PRELOAD``). ``import workbench`` does this first thing; set ``WORKBENCH_BLAS`` to
a library path to choose one, or to ``off`` to keep MLX's own.

A start-up hook makes this independent of import order (``import mlx.core`` first is the
usual first line of a notebook): ``workbench blas --install-hook`` writes
``workbench-blas.pth`` into the environment's site-packages (:func:`install_hook`), and
Python then loads that library at every interpreter start of this environment — scripts,
pytest and Jupyter kernels — before anything imports MLX; ``workbench blas --remove-hook``
takes it out (:func:`remove_hook`). Importing ``workbench`` never writes it: import only
loads. The hook reads ``WORKBENCH_BLAS`` and ``WORKBENCH_BLAS_HOOK`` at start-up (``off``
keeps MLX's own). Where neither the hook nor import order gave MLX the library,
:data:`STATUS` says so and ``import workbench`` warns once, naming the command.

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
import sysconfig
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

SEARCH_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
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


HOOK_NAME = "workbench-blas.pth"
INSTALL_HOOK_COMMAND = "workbench blas --install-hook"
INSTALL_HINT = 'apt-get install libopenblas0-pthread, or pip install -e ".[mkl]" (MKL from PyPI, about 1 GB)'


def loaded(path: str) -> bool:
    """True when the shared library ``path`` is mapped into this process (``/proc/self/maps``)."""
    try:
        real = os.path.realpath(path)
        with open("/proc/self/maps") as maps:
            return any(line.rstrip().endswith(real) for line in maps)
    except OSError:
        return False


def hook_line(path: str) -> str:
    """The one ``.pth`` line that loads ``path`` globally at interpreter start unless
    ``WORKBENCH_BLAS`` or ``WORKBENCH_BLAS_HOOK`` is ``off``/``none``/``0`` (a ``.pth``
    line starting with ``import`` is executed by ``site``)."""
    off = "('off', 'none', '0')"
    return (
        f"import os, ctypes; os.environ.get('WORKBENCH_BLAS', '').strip().lower() in {off} "
        f"or os.environ.get('WORKBENCH_BLAS_HOOK', '').strip().lower() in {off} "
        f"or not os.path.exists({path!r}) or ctypes.CDLL({path!r}, mode=ctypes.RTLD_GLOBAL)\n"
    )


def hook_path() -> Path:
    """Where :func:`install_hook` writes the hook: this environment's site-packages
    (``sysconfig``'s ``purelib``) / :data:`HOOK_NAME`."""
    return Path(sysconfig.get_paths()["purelib"]) / HOOK_NAME


def install_hook(path: str) -> Path:
    """Write :data:`HOOK_NAME` loading ``path`` into this environment's site-packages
    (``workbench blas --install-hook``); returns the hook's path.

    Raises:
        OSError: site-packages is not writable."""
    target = hook_path()
    if not target.exists() or target.read_text() != hook_line(path):
        target.write_text(hook_line(path))
    return target


def remove_hook() -> Path | None:
    """Delete the hook :func:`install_hook` wrote (``workbench blas --remove-hook``); returns
    its path, or ``None`` when there was none.

    Raises:
        OSError: site-packages is not writable."""
    target = hook_path()
    if not target.exists():
        return None
    target.unlink()
    return target


def activate() -> BlasStatus:
    """Load an optimized BLAS globally if on Linux, one is found and MLX is not loaded yet
    (or the start-up hook loaded it already). Writes nothing."""
    if not sys.platform.startswith("linux"):
        return BlasStatus(None, "not Linux: MLX uses the platform's BLAS (Accelerate on macOS)")
    if os.environ.get("WORKBENCH_BLAS", "").strip().lower() in ("off", "none", "0"):
        return BlasStatus(None, "WORKBENCH_BLAS=off: MLX's bundled reference BLAS")
    path = find_blas()
    if path is None:
        return BlasStatus(
            None, f"no optimized BLAS found ({INSTALL_HINT}); using MLX's bundled reference BLAS"
        )
    if loaded(path):
        hook = hook_path()
        how = f"start-up hook {hook}" if hook.exists() else "LD_PRELOAD or an earlier import"
        return BlasStatus(path, f"{path} loaded at interpreter start ({how})")
    if "mlx.core" in sys.modules:
        return BlasStatus(
            None,
            f"mlx was imported before workbench, so MLX keeps its slow reference BLAS in "
            f"this process: import workbench first, or run `{INSTALL_HOOK_COMMAND}` once (a "
            f"start-up hook that loads {path} in every new process of this environment), "
            "then restart the kernel or interpreter",
        )
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        return BlasStatus(None, f"could not load {path}: {exc}")
    return BlasStatus(path, f"loaded {path} before mlx")


STATUS = activate()
if STATUS.library is None and STATUS.note.startswith("mlx was imported"):
    warnings.warn(f"workbench: {STATUS.note}", RuntimeWarning, stacklevel=2)


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
