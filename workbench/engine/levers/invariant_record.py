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

import ast
import ctypes
import pprint
from pathlib import Path
from typing import Any

import mlx.core as mx

from .invariant import PROJECTIONS, _in_features, _plain_call, signature
from .invariant_blocks import block_from, sweep

RECORD_PATH = Path(__file__).with_name("invariant_blocks_record.py")


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
    """:data:`RECORD_PATH`'s ``RECORDED`` table: record key -> projection signature ->
    ``[lo, hi]`` (``None``: one row per call)."""
    if not RECORD_PATH.exists():
        return {}
    return ast.literal_eval(RECORD_PATH.read_text().split("RECORDED = ", 1)[1])


def calibrated_blocks(model: Any) -> dict[str, tuple[int, int] | None]:
    """Sweep each distinct float projection of ``model`` on the CPU: ``str(signature)`` ->
    :func:`~.invariant_blocks.block_from`'s ``(lo, hi)``. What :data:`RECORD_PATH` records
    per :func:`record_key` (``python -m workbench.engine.levers.invariant_record`` writes it
    for the bundled model)."""
    out: dict[str, tuple[int, int] | None] = {}
    for _, m in model.named_modules():
        if (
            isinstance(m, PROJECTIONS)
            and "weight" in m
            and "scales" not in m
            and str(signature(m)) not in out
        ):
            out[str(signature(m))] = block_from(sweep(_plain_call(m), _in_features(m), m["weight"].dtype))
    return out


def main() -> None:
    """Record the bundled model's calibrated blocks under this process's :func:`record_key`."""
    from ...runtime.loading import load

    model, _ = load()
    table = recorded()
    table[record_key()] = {k: list(v) if v else None for k, v in calibrated_blocks(model).items()}
    RECORD_PATH.write_text(
        '"""Calibrated row blocks of the bundled model per (mlx version, BLAS): written by\n'
        "`python -m workbench.engine.levers.invariant_record` (run it under each BLAS), checked by\n"
        'tests/engine/test_invariant_blocks.py."""\n\n'
        f"RECORDED = {pprint.pformat(table, width=110)}\n"
    )
    print(f"recorded {record_key()} in {RECORD_PATH}")


if __name__ == "__main__":
    main()
