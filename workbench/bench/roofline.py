"""Roofline of a decode step: what memory bandwidth and arithmetic allow, to compare with
what the engines measure.

Knows: the model's decode weights (:mod:`workbench.bench.model`), its KV bytes per token
(:mod:`workbench.engine.kv.profile`), a timed array copy (bandwidth) and a timed matmul (flops).
Must not know: engines, schedulers.

One decode step of ``B`` rows at ``C`` context tokens each::

    bytes_per_step = decode weight bytes + B * C * KV bytes per token
    flops_per_step = B * (2 * decode weight params + 4 * C * n_layers * n_heads * head_dim)
    memory bound  tok/s = B * bandwidth_bytes_per_s / bytes_per_step
    compute bound tok/s = B * flops_per_s / flops_per_step
    attainable    tok/s = min(memory bound, compute bound)

Example: 620 MB of weights, no KV, 15 GB/s -> at most 24 steps/s, so 24 tok/s at B = 1
and 774 tok/s at B = 32 unless compute binds first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.kv.profile import kv_profile
from ..runtime.blas import matmul_seconds
from .model import decode_weight_bytes, decode_weight_params


def copy_bandwidth_bytes_per_s(n_bytes: int = 256 * 2**20, repeats: int = 5, backend: str = "numpy") -> float:
    """Best bytes moved per second (read + write) copying an ``n_bytes`` float32 array.

    ``backend="numpy"`` uses ``np.copyto`` (a ``memcpy``: the machine's bandwidth);
    ``"mlx"`` an MLX copy on the default device (``x + 0`` evaluated: on the CPU what
    MLX's kernels reach, the rate of its cache copies such as ``extend``; on a GPU its
    memory bandwidth: use an ``n_bytes`` of a few GiB there)."""
    n = n_bytes // 4
    if backend == "numpy":
        src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
        run = lambda: np.copyto(dst, src)  # noqa: E731
    else:
        import mlx.core as mx

        src = mx.ones((n,), mx.float32)
        mx.eval(src)
        run = lambda: mx.eval(src + 0)  # noqa: E731
    best_s = float("inf")
    for _ in range(repeats + 1):  # the first copy touches fresh pages
        start = time.perf_counter()
        run()
        best_s = min(best_s, time.perf_counter() - start)
    return 2 * n * 4 / best_s


def matmul_flops_per_s(n: int = 1024, repeats: int = 3, dtype: str = "float32") -> float:
    """Flops per second of an ``[n, n] @ [n, n]`` MLX matmul in ``dtype`` on the default
    device (on the CPU, the active BLAS)."""
    return 2 * n**3 / matmul_seconds(n, repeats, dtype)


@dataclass(frozen=True)
class DecodeCost:
    """What one decode step must move and compute, per row and for the whole model."""

    weight_bytes: int
    weight_params: int
    kv_bytes_per_token: int
    attention_flops_per_token: int  # per context token per row: 4 * n_layers * n_heads * head_dim

    def bytes_per_step(self, rows: int, context_tokens: float) -> float:
        """Bytes one decode step moves: weights read plus B x context x KV bytes per token."""
        return self.weight_bytes + rows * context_tokens * self.kv_bytes_per_token

    def flops_per_step(self, rows: int, context_tokens: float) -> float:
        """Floating-point operations of one decode step (matmuls and attention)."""
        return rows * (2 * self.weight_params + context_tokens * self.attention_flops_per_token)


def decode_cost(model: Any) -> DecodeCost:
    """The :class:`DecodeCost` of ``model`` (an mlx-lm model with ``args``)."""
    a = model.args
    head_dim = a.head_dim or a.hidden_size // a.num_attention_heads
    return DecodeCost(
        weight_bytes=decode_weight_bytes(model),
        weight_params=decode_weight_params(model),
        kv_bytes_per_token=sum(lb.per_token_bytes for lb in kv_profile(model)),
        attention_flops_per_token=4 * a.num_hidden_layers * a.num_attention_heads * head_dim,
    )


def bounds_tok_per_s(
    cost: DecodeCost, rows: int, context_tokens: float, bandwidth_bytes_per_s: float, flops_per_s: float
) -> dict[str, float]:
    """``memory_tok_per_s``, ``compute_tok_per_s``, ``attainable_tok_per_s`` and
    ``bytes_per_step`` for ``rows`` rows at ``context_tokens`` (see the module docstring)."""
    memory = rows * bandwidth_bytes_per_s / cost.bytes_per_step(rows, context_tokens)
    compute = rows * flops_per_s / cost.flops_per_step(rows, context_tokens)
    return {
        "bytes_per_step": cost.bytes_per_step(rows, context_tokens),
        "memory_tok_per_s": memory,
        "compute_tok_per_s": compute,
        "attainable_tok_per_s": min(memory, compute),
    }
