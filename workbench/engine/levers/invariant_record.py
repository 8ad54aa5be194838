"""The batch-invariant mode's calibrated row blocks, recorded per (mlx version, BLAS) so that
a version bump that moves a kernel boundary fails ``tests/engine/test_invariant_blocks.py``
loudly rather than the mode silently (issue 39).

Knows: the BLAS behind MLX's CPU matmuls (:mod:`workbench.runtime.blas`, OpenBLAS's
``openblas_get_config`` / ``openblas_get_corename``), :mod:`.invariant_blocks`'s sweep.
Must not know: the scheduler.

    WORKBENCH_BLAS=off python -m workbench.engine.levers.invariant_record   # MLX's reference BLAS
    python -m workbench.engine.levers.invariant_record                      # OpenBLAS, where installed
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import mlx.core as mx

from .invariant import PROJECTIONS, _in_features, _plain_call, signature
from .invariant_blocks import block_from, sweep

RECORD_PATH = Path(__file__).with_name("invariant_blocks_record.json")


def blas_id() -> str:
    """Which BLAS serves MLX's CPU float32 matmuls in this process: ``"reference"`` (MLX's
    bundled one), ``"openblas <version> <core>"`` (OpenBLAS's own config and the kernel core
    it chose for this CPU), or the loaded library's file name."""
    from ...runtime.blas import STATUS

    if STATUS.library is None:
        return "reference"
    try:
        lib = ctypes.CDLL(STATUS.library)
        lib.openblas_get_corename.restype = lib.openblas_get_config.restype = ctypes.c_char_p
        version = lib.openblas_get_config().decode().split()[1]
        return f"openblas {version} {lib.openblas_get_corename().decode()}"
    except (AttributeError, IndexError, OSError):
        return Path(STATUS.library).name


def record_key() -> str:
    """``"<mlx version> | <blas_id()>"``: what the recorded blocks depend on (CPU)."""
    return f"mlx {mx.__version__} | {blas_id()}"


def recorded() -> dict[str, dict[str, list[int]]]:
    """:data:`RECORD_PATH`'s table: record key -> projection signature -> ``[lo, hi]``
    (``None``: one row per call); empty where the file is missing."""
    return json.loads(RECORD_PATH.read_text()) if RECORD_PATH.exists() else {}


def calibrated_blocks(model: Any) -> dict[str, tuple[int, int] | None]:
    """Sweep each distinct float projection of ``model`` on the CPU: ``str(signature)`` ->
    :func:`~.invariant_blocks.block_from`'s ``(lo, hi)``. What :data:`RECORD_PATH` records
    per :func:`record_key` (``python -m workbench.engine.levers.invariant_record`` writes it
    for the bundled model)."""
    return {
        sig: block_from(sweep(_plain_call(m), _in_features(m), m["weight"].dtype))
        for sig, m in _float_projections(model).items()
    }


def sweeps(model: Any) -> dict[str, dict]:
    """Per distinct float projection of ``model`` (``str(signature)``), the kernel-threshold
    sweep with its neighbour and position checks (:func:`~.invariant_blocks.sweep`,
    ``neighbours=True``): ``{"leaks", "moved", "switches"}`` (row counts) and ``"max_diff"``
    (the largest difference from the row alone)."""
    out: dict[str, dict] = {}
    for sig, m in _float_projections(model).items():
        s = sweep(_plain_call(m), _in_features(m), m["weight"].dtype, neighbours=True)
        out[sig] = {
            "leaks": [M for M, x in zip(s.rows, s.leak) if x],
            "moved": [M for M, x in zip(s.rows, s.moved) if x],
            "switches": s.switches(),
            "max_diff": max(s.max_diff),
        }
    return out


def _float_projections(model: Any) -> dict[str, Any]:
    """``str(signature)`` -> the first float projection of ``model`` with it."""
    out: dict[str, Any] = {}
    for _, m in model.named_modules():
        if isinstance(m, PROJECTIONS) and "weight" in m and "scales" not in m:
            out.setdefault(str(signature(m)), m)
    return out


def main() -> None:
    """Record the bundled model's calibrated blocks under this process's :func:`record_key`."""
    from ...runtime.loading import load

    model, _ = load()
    table = recorded()
    table[record_key()] = {k: list(v) if v else None for k, v in calibrated_blocks(model).items()}
    RECORD_PATH.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"recorded {record_key()} in {RECORD_PATH}")


if __name__ == "__main__":
    main()
