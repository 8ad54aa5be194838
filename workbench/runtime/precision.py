"""Full float32 matmuls on every device, so the oracles compare like with like.

Knows: MLX's ``MLX_ENABLE_TF32`` environment variable, numpy (a float64 reference matmul).
Must not know: models, requests.

On an NVIDIA GPU (mlx's CUDA backend, ``mlx[cuda13]``) and on Apple's newest GPUs, MLX
runs float32 matmuls at TF32 precision (a 10-bit mantissa, relative error about 1e-3 per
product) unless ``MLX_ENABLE_TF32=0`` is set before the first matmul; MLX reads it once.
Measured on an H200 (mlx 0.32.4): with TF32, 0 of the demo's 14 rows equal their solo
reference (log-prob differences about 1e-3, ten times the oracle's 1e-4 tolerance); with
``MLX_ENABLE_TF32=0``, 14 of 14 (``docs/gpu.md``).

``import workbench`` therefore sets ``MLX_ENABLE_TF32=0`` (this module is imported before
anything of ours imports mlx), unless the user set the variable: ``MLX_ENABLE_TF32=1``
keeps TF32 and its speed for float32 models, and the oracles then classify what diverges
(:mod:`workbench.verify.oracle`). On the CPU the variable has no effect. On the H200 a bf16
1B llama's decode step was as fast with it at 0 as at 1 (differences within the spread of
repeats, in both directions; ``docs/gpu.md``).

Since the variable is read by MLX, not by us, the precision that is really in force is
*measured*: :func:`float32_matmul_error` compares an MLX float32 matmul with a float64
one (full float32: about 1e-7; TF32: about 3e-4), and :func:`describe` says which it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "MLX_ENABLE_TF32"
TF32_ERROR = (
    1e-4  # relative error above which float32 matmuls are judged to run at TF32 (full float32: ~1e-7)
)


@dataclass(frozen=True)
class PrecisionStatus:
    """What :func:`full_float32` did: ``set_by_workbench`` (True when it set ``ENV=0``),
    ``env_value`` (the variable's value afterwards, ``None`` when unset) and a one-line
    ``note``."""

    set_by_workbench: bool
    env_value: str | None
    note: str


def full_float32() -> PrecisionStatus:
    """Set ``MLX_ENABLE_TF32=0`` unless the user set it (see the module docstring).

    Takes effect only if no MLX matmul ran in this process before (MLX reads the variable
    once); :func:`float32_matmul_error` tells whether it did.
    """
    user = os.environ.get(ENV)
    if user is not None:
        return PrecisionStatus(False, user, f"{ENV}={user} set by the user (workbench leaves it)")
    os.environ[ENV] = "0"
    return PrecisionStatus(True, "0", f"{ENV}=0 set by workbench (set {ENV}=1 to allow TF32)")


STATUS = full_float32()


def float32_matmul_error(n: int = 256, seed: int = 0) -> float:
    """Relative error of one MLX float32 ``[n, n] @ [n, n]`` matmul on the default device
    against the same product in float64 (numpy): ``||mlx - exact||_F / ||exact||_F``.

    Full float32 gives about 1e-7 (n = 256), TF32 about 3e-4. Runs one matmul, so it
    also fixes MLX's TF32 setting for the process if nothing did before.
    """
    import mlx.core as mx
    import numpy as np

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    got = np.asarray(mx.matmul(mx.array(a), mx.array(b)), dtype=np.float64)
    return float(np.linalg.norm(got - exact) / np.linalg.norm(exact))


def tf32_in_force(error: float | None = None) -> bool:
    """True when float32 matmuls run at reduced (TF32) precision: ``error`` (from
    :func:`float32_matmul_error`, measured when ``None``) is above ``TF32_ERROR``."""
    return (float32_matmul_error() if error is None else error) > TF32_ERROR


def describe() -> str:
    """One line for ``workbench info`` and the demo, e.g. ``float32 matmuls: full float32
    (measured relative error 1.2e-07; MLX_ENABLE_TF32=0 set by workbench ...)``."""
    error = float32_matmul_error()
    kind = "TF32 (reduced precision)" if tf32_in_force(error) else "full float32"
    return f"float32 matmuls: {kind} (measured relative error {error:.1e}; {STATUS.note})"
