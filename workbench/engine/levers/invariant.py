"""Batch-invariant forwards: a row computes the same bits whatever its neighbours
(``Scheduler(batch_invariant=True)``, ``docs/batch-invariance.md``).

Knows: MLX's layer classes (``nn.Linear``, ``nn.QuantizedLinear``, ``nn.Embedding`` and
``nn.QuantizedEmbedding``'s ``as_linear``), mlx-lm's ``scaled_dot_product_attention`` and
``BatchKVCache``. Must not know: requests, the queue, events.

In the decode-shaped forwards (the decode step, the join forward) two things mix rows,
both removed here (why: ``docs/batch-invariance.md``):

- **matmuls** run on row blocks of a shape fixed per device and weight kind
  (:class:`RowBlocks`: ``B`` rows cut into blocks of ``max_rows``, each zero-padded to at
  least ``min_rows``), so the kernel never sees the batch size;
- **attention** runs each row on its own keys (``[left_padding_b:]``, no mask): the call
  it makes alone at ``B = 1``; on the CPU in fixed blocks of key positions counted back from
  the row's last key (:mod:`.invariant_keyblocks`).

On CUDA and Metal the projections that read one input (q / k / v, gate / up) run as one
matmul over their concatenated weights (:mod:`.invariant_fuse`): fewer launches for a
host-bound step, the same fused kernel alone and batched.

Prefill runs every prompt in chunks of exactly ``prefill_step_size`` tokens, the group's
chunks in one forward with these row blocks and each prompt attending its own keys
(:mod:`.invariant_prefill`, for full-attention models without adapters or ``kv_bits``; others
run each prompt alone, :mod:`.invariant_preempt`); row-wise operations do not mix rows.

Example (CPU, float32, ``max_rows = min_rows = 16``): a step over ``B = 20`` rows runs
each projection as two calls of 16 rows (the second holding 4 rows and 12 zero rows);
the same request alone runs one call of 16 rows (1 row and 15 zero rows)::

    rows  0..15  -> x[0:16]  @ W.T        (a [16, K] call)
    rows 16..19  -> x[16:20] + 12 zeros   (a [16, K] call, 4 rows kept)

Axis letters: ``B`` rows, ``K`` input features, ``N`` output features, ``H`` query heads,
``S`` cached positions, ``D`` head dim.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache

from ..model_hooks import hooks_of
from .invariant_blocks import CACHED_BYTES


@dataclass(frozen=True)
class RowBlocks:
    """Row counts a matmul call may have so that each row's result does not depend on the
    call's row count: blocks of at most ``max_rows``, each zero-padded to ``min_rows``.

    Attributes:
        min_rows: the fewest rows a call runs (``>= 1``).
        max_rows: the most rows a call runs (``>= min_rows``).
    """

    min_rows: int
    max_rows: int

    def plan(self, rows: int) -> list[tuple[int, int, int]]:
        """``(start, kept rows, call rows)`` per call for an input of ``rows`` rows.

        >>> RowBlocks(16, 16).plan(20)
        [(0, 16, 16), (16, 4, 16)]
        >>> RowBlocks(2, 256).plan(1)
        [(0, 1, 2)]
        """
        out = []
        for start in range(0, max(rows, 1), self.max_rows):
            kept = min(self.max_rows, rows - start)
            out.append((start, kept, max(kept, self.min_rows)))
        return out


def _kind(module: Any) -> str:
    if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        return "quantized"
    return "float32" if module["weight"].dtype == mx.float32 else "half"


def signature(module: Any) -> tuple:
    """What decides a projection's kernel: its class, weight shape and dtype, bias (and
    for quantized layers bits, group size and mode)."""
    w = module["weight"]
    extra = tuple(getattr(module, a, None) for a in ("bits", "group_size", "mode"))
    return (type(module).__name__, tuple(w.shape), str(w.dtype), "bias" in module) + extra


# Row blocks per backend and weight kind: the first choice of :meth:`Invariance.calibrate`,
# which checks it on each projection and falls back to smaller fixed blocks. Measured with
# single ops (a row alone against inside M rows, ``docs/batch-invariance.md``): on the CPU,
# OpenBLAS's sgemm picks kernels by row count and tiles rows (a row's bits depend on M and
# on its position in the call), so float32 needs one fixed M whose rows do not depend on
# their position (8); MLX's own bf16/fp16 and quantized CPU kernels give the same rows at
# every M; on CUDA bf16 M = 1 differs from M = 2..256 (all equal), float32 is equal for
# M = 2..8; quantized (4- and 8-bit, group 32, SmolLM2-135M's every projection on an H100,
# mlx 0.32.4: scripts/lab/quantized_blocks_ab.py) M = 1..7 in one group (the matrix-vector
# kernel) and M = 8..300 in another, no neighbour or position effect: one call of 8-256 rows
# (RowBlocks(4, 4) before: 32 calls a projection at B = 128).
ROW_BLOCKS: dict[tuple[str, str], RowBlocks | None] = {
    ("cpu", "float32"): RowBlocks(8, 8),
    ("cpu", "half"): None,
    ("cpu", "quantized"): None,
    ("cuda", "float32"): RowBlocks(8, 8),
    ("cuda", "half"): RowBlocks(2, 256),
    ("cuda", "quantized"): RowBlocks(8, 256),
}
ROWS_APART_BYTES = CACHED_BYTES  # CPU float weights up to this size run one-row calls (they stay in cache)
# Where that rule holds: on the CPU a one-row call wakes no BLAS threads and its weight stays in
# cache. Not on CUDA, where one-row products are a batched matrix-vector kernel reading the
# weight once per row (the 1B-shaped llama's 2 MiB k_proj / v_proj at B = 128: 128 reads) and
# RowBlocks(2, 256) runs them in one call (docs/gpu.md, the kernel-threshold sweep).
ROWS_APART_BACKENDS = ("cpu",)
FALLBACK_ROWS = (8, 4, 2, 1)  # fixed blocks tried in order where the first choice fails its check
PROJECTIONS = (nn.Linear, nn.QuantizedLinear, nn.Embedding, nn.QuantizedEmbedding)
_METHOD = {
    nn.Linear: "__call__",
    nn.QuantizedLinear: "__call__",
    nn.Embedding: "as_linear",
    nn.QuantizedEmbedding: "as_linear",
}


ONE_ROW = RowBlocks(1, 1)


def blocked(
    f: Callable[[mx.array], mx.array],
    x: mx.array,
    blocks: RowBlocks | None,
    rows_apart: Callable[[mx.array], mx.array] | None = None,
    pad: Callable[[mx.array, int], mx.array] | None = None,
) -> mx.array:
    """``f(x)`` for a row-wise ``f`` (a projection ``[..., K] -> [..., N]``), computed in
    calls of :meth:`RowBlocks.plan`'s shapes: equal to ``f(x)`` up to the kernel chosen, and
    each row's bits independent of the other rows of ``x``.

    Args:
        x: ``[..., K]``; its leading axes are flattened into ``M`` rows.
        blocks: the row blocks, ``None``: one call as it is.
        rows_apart: for :data:`ONE_ROW` blocks, ``[M, K] -> [M, N]`` computing every row
            in a call of its own at once (:func:`rows_apart_linear`); ``None``: ``M`` calls.
        pad: ``(rows [M, K], call) -> [call, K]``, the rows with zero rows after them for a
            call of ``M < blocks.min_rows`` rows (:func:`zero_padded`, the default; a hook may
            share one padded input among the projections that read the same ``x``).

    The host work is kept to what the blocks need (on a GPU a decode step is host-bound): a
    call of ``min_rows .. max_rows`` rows runs as it is, and a short one is padded with zero
    rows kept from earlier calls (:func:`zero_rows`), not made anew.
    """
    if blocks is None:
        return f(x)
    shape = x.shape
    rows = x.reshape(-1, shape[-1])  # [M, K]
    M = rows.shape[0]
    if rows_apart is not None and M > 1 and blocks == ONE_ROW:
        y = rows_apart(rows)
    elif blocks.min_rows <= M <= blocks.max_rows:
        y = f(rows)  # one call, unpadded: the plan's only block
    elif M < blocks.min_rows:
        y = f((pad or zero_padded)(rows, blocks.min_rows))[:M]
    else:
        parts = []
        for start, kept, call in blocks.plan(M):
            block = rows[start : start + kept]
            parts.append(f(block if call == kept else zero_padded(block, call))[:kept])  # [kept, N]
        y = mx.concatenate(parts)
    return y.reshape(*shape[:-1], y.shape[-1])


_ZERO_ROWS: dict = {}  # (rows, K, dtype) -> an evaluated [rows, K] zeros array


def zero_rows(n: int, K: int, dtype: Any) -> mx.array:
    """``[n, K]`` zeros of ``dtype`` (``mx.zeros``; no mlx-lm counterpart), evaluated once per
    shape and reused (a constant input to the calls that pad with it, not a new node per call).
    ``n``, ``K``: rows and features (counts). Raises what ``mx.zeros`` raises (e.g. ``ValueError``
    for a negative size)."""
    key = (n, K, dtype)
    z = _ZERO_ROWS.get(key)
    if z is None:
        z = mx.zeros((n, K), dtype=dtype)
        mx.eval(z)  # before it is shared: another thread's forward never evaluates it too
        _ZERO_ROWS[key] = z
    return z


def zero_padded(rows: mx.array, call: int) -> mx.array:
    """``rows`` ``[M, K]`` followed by ``call - M`` zero rows (:func:`zero_rows`): ``[call, K]``,
    ``call >= M`` rows. No mlx-lm counterpart (mlx-lm never pads a projection's rows).

    Raises:
        ValueError: ``call < M`` (from ``mx.zeros``'s negative size)."""
    M, K = rows.shape
    return mx.concatenate([rows, zero_rows(call - M, K, rows.dtype)])


def rows_agree(
    f: Callable[[mx.array], mx.array],
    K: int,
    dtype: Any,
    blocks: RowBlocks | None,
    counts: Sequence[int] = (3, 9, 20),
    rows_apart: Callable[[mx.array], mx.array] | None = None,
) -> bool:
    """True when, for random inputs ``[M, K]``, the first, middle and last row of ``f``
    computed among ``M`` rows (in :func:`blocked` calls of ``blocks``, for each ``M`` in
    ``counts``; for fixed blocks one full block) have the bits of the same row computed
    alone. Evidence, not proof: the kernel choice depends on shapes, which this covers,
    not on values. ``rows_apart``: as :func:`blocked`'s."""
    if blocks is not None and blocks.min_rows == blocks.max_rows and rows_apart is None:
        counts = (blocks.max_rows,)
    x = mx.random.normal((max(counts), K), key=mx.random.key(7)).astype(dtype)  # [M, K]
    alone: dict[int, mx.array] = {}
    for M in counts:
        y = blocked(f, x[:M], blocks, rows_apart)
        for i in sorted({0, M // 2, M - 1}):
            if i not in alone:
                alone[i] = blocked(f, x[i : i + 1], blocks, rows_apart)[0]
            if not mx.array_equal(y[i], alone[i]).item():
                return False
    return True


def _plain_call(module: Any) -> Callable[[mx.array], mx.array]:
    """The module's projection as MLX defines it (unpatched)."""
    for cls in type(module).__mro__:
        if cls in _METHOD:
            method = cls.__dict__[_METHOD[cls]]
            return lambda x: method(module, x)
    raise TypeError(f"{type(module).__name__} is not a projection")


def _in_features(module: Any) -> int:
    w = module["weight"]
    return w.shape[1] * 32 // module.bits if "scales" in module else w.shape[1]


@dataclass(frozen=True)
class Invariance:
    """The batch-invariant mode's row blocks for one model on one device.

    Attributes:
        backend: ``"cpu"``, ``"cuda"`` or ``"metal"`` (:func:`workbench.runtime.device.backend`).
        blocks: :func:`signature` of each projection -> its :class:`RowBlocks` (``None``:
            any row count gives the same rows). A projection not listed runs one row per
            call (always invariant, slow).
        fused: ``id(projection)`` -> ``(group, index)`` for the projections computed as one
            matmul with their siblings (:class:`~.invariant_fuse.FusedGroup`, where the
            backend is in :data:`~.invariant_fuse.FUSE_BACKENDS`; empty: none fused).
        runners: ``id(projection)`` -> ``(weight, runner)``: what the mode's projection hook
            runs for it, made at its first call and kept while its weight array is the same
            (:func:`~.invariant_hook.runner`).
    """

    backend: str
    blocks: dict
    fused: dict = field(default_factory=dict, compare=False, repr=False)
    _plans: dict = field(
        default_factory=dict, compare=False, repr=False
    )  # id(module) -> (weight, blocks, apart)
    runners: dict = field(
        default_factory=dict, compare=False, repr=False
    )  # id(module) -> (weight, its projection in the mode's hook: invariant_hook.runner)

    @classmethod
    def calibrate(cls, model: Any) -> "Invariance":
        """Check :data:`ROW_BLOCKS`' choice on each distinct projection of ``model``
        (:func:`rows_agree`, with the layer's own weights) and keep it, or the first of
        :data:`FALLBACK_ROWS` that agrees (one row per call always does). A few calls per
        distinct projection shape. Where the backend is in
        :data:`~.invariant_fuse.FUSE_BACKENDS`, sibling projections that read one input are
        fused first (:func:`~.invariant_fuse.fuse`: their weights rebound to rows of one
        concatenated array) and each fused layer is calibrated like a projection."""
        from ...runtime.device import backend
        from . import invariant_fuse

        dev = backend()
        groups = invariant_fuse.fuse(model) if dev in invariant_fuse.FUSE_BACKENDS else []
        blocks: dict = {}
        for m in [m for _, m in model.named_modules()] + [g.module for g in groups]:
            if not isinstance(m, PROJECTIONS) or "weight" not in m or signature(m) in blocks:
                continue
            key = (dev, signature(m))
            if key not in _CALIBRATED:
                _CALIBRATED[key] = _first_agreeing(m, ROW_BLOCKS.get((dev, _kind(m)), RowBlocks(8, 8)))
            blocks[signature(m)] = _CALIBRATED[key]
        fused = {id(m): (g, i) for g in groups for i, m in enumerate(g.members)}
        return cls(dev, blocks, fused)

    def blocks_for(self, module: Any) -> RowBlocks | None:
        """The row blocks of ``module`` (one row per call if it was not calibrated)."""
        return self.blocks.get(signature(module), RowBlocks(1, 1))

    def plan_for(self, module: Any) -> tuple[RowBlocks | None, Callable[[mx.array], mx.array] | None]:
        """``(blocks, rows_apart)`` of ``module`` for :func:`blocked`, worked out once per
        module and weight array (a projection runs every layer of every step)."""
        weight = module["weight"]
        known = self._plans.get(id(module))
        if known is None or known[0] is not weight:
            blocks = self.blocks_for(module)
            known = self._plans[id(module)] = (
                weight,
                blocks,
                rows_apart_linear(module) if blocks == ONE_ROW else None,
            )
        return known[1], known[2]


_CALIBRATED: dict = {}  # (backend, signature) -> RowBlocks: shapes decide kernels, not weights
_SWEPT: dict = {}  # CPU (weight shape, dtype, bias) -> the swept RowBlocks or None (no clean run)


def _first_agreeing(module: Any, first: RowBlocks | None) -> RowBlocks | None:
    from ...runtime.device import backend

    f, K = _plain_call(module), _in_features(module)
    dtype = module["scales"].dtype if "scales" in module else module["weight"].dtype
    if first is None and backend() == "cpu":
        return None  # MLX's own CPU kernels (bf16/fp16, quantized): rows equal at every M, measured
    if backend() == "cpu":  # the BLAS's sgemm: one kernel group's row counts, swept (invariant_blocks)
        from .invariant_blocks import block_from, sweep

        sgemm = (tuple(module["weight"].shape), str(dtype), "bias" in module)  # Linear or as_linear alike
        if sgemm not in _SWEPT:
            run = block_from(sweep(f, K, dtype))
            ok = run is not None and rows_agree(f, K, dtype, RowBlocks(*run), counts=(run[1] + 1,))
            _SWEPT[sgemm] = RowBlocks(*run) if ok else None
        if _SWEPT[sgemm] is not None:
            return _SWEPT[sgemm]
    apart = rows_apart_linear(module)
    small = module["weight"].nbytes <= ROWS_APART_BYTES and backend() in ROWS_APART_BACKENDS
    if first is not None and apart is not None and small:
        first = ONE_ROW  # a weight that stays in cache: one-row calls, no threads to wake (CPU)
    if first is not None and first.max_rows > first.min_rows:  # swept only where a range is kept
        first = clean_range(f, K, dtype, first)  # GPU: a kernel may switch inside the range
    for choice in (first, *(RowBlocks(r, r) for r in FALLBACK_ROWS)):
        if rows_agree(f, K, dtype, choice, rows_apart=apart if choice == ONE_ROW else None):
            return choice
    return ONE_ROW


def clean_range(f: Callable[[mx.array], mx.array], K: int, dtype: Any, blocks: RowBlocks) -> RowBlocks:
    """``blocks`` cut to the row counts that keep a row's bits: ``RowBlocks(lo, hi')`` with
    ``hi'`` the largest count up to ``blocks.max_rows`` such that at every ``M`` in
    ``lo .. hi'`` a probe row of ``f`` (a projection ``[M, K] -> [M, N]``) has the bits it has
    at ``M = lo``, whatever its neighbours and its place in the call
    (:func:`~.invariant_blocks.sweep` with ``neighbours=True``: three calls per ``M``).

    Why: :func:`rows_agree` checks three row counts, and a GPU's kernel choice can switch
    between them and ``max_rows``. Measured on an H100 (mlx 0.32.4, bf16, 2026-12-07,
    ``scripts/lab/invariance_proof.py``): the 1B-shaped llama's ``down_proj`` (``K`` = 8192)
    gives a row other bits at ``M`` = 73, 80, 81, 96, 97, 144, ... than at ``M`` = 2 .. 72, its
    other projections the same bits at every ``M`` from 2 to 300. So with ``RowBlocks(2, 256)``
    a row decoding among 73 or more rows differed from its run alone; now such a projection
    runs blocks of at most 72 rows. One sweep per projection shape and device, at
    :meth:`Invariance.calibrate` (and for a prefill's larger blocks at its first prefill,
    :func:`~.invariant_prefill.prefill_plan`), in windows of :data:`CLEAN_WINDOW` counts: a
    switch at 73 rows costs one window, not a sweep to 2,048.

    Raises:
        nothing: a range that is clean only at ``lo`` gives ``RowBlocks(lo, lo)``.
    """
    from .invariant_blocks import sweep

    lo = hi = blocks.min_rows
    while hi < blocks.max_rows or hi == lo:  # windows of CLEAN_WINDOW counts, each with lo first
        top = min(hi + CLEAN_WINDOW, blocks.max_rows)
        rows = tuple(range(lo, top + 1)) if hi == lo else (lo, *range(hi + 1, top + 1))
        swept = sweep(f, K, dtype, rows=rows, neighbours=True)
        for M, group, leak, moved in zip(swept.rows, swept.group, swept.leak, swept.moved):
            if group != swept.group[0] or leak or moved:
                return RowBlocks(lo, hi)
            hi = M
        if top == blocks.max_rows:
            break
    return RowBlocks(lo, hi)


CLEAN_WINDOW = 256  # clean_range sweeps this many row counts at a time: it stops at the first switch


def rows_apart_linear(module: Any) -> Callable[[mx.array], mx.array] | None:
    """For a float ``nn.Linear`` or ``nn.Embedding`` (as a read-out): ``[M, K] -> [M, N]``
    as one batched matmul of ``M`` one-row products (``[M, 1, K] @ W.T`` broadcast to
    ``[M, K, N]``: MLX runs a one-row BLAS call per row, the weights staying in cache), the
    bias added after. ``None`` for other layers."""
    if not isinstance(module, (nn.Linear, nn.Embedding)) or "scales" in module:
        return None
    w, bias = module["weight"], module.get("bias") if isinstance(module, nn.Linear) else None

    def apart(rows: mx.array) -> mx.array:
        M, K = rows.shape
        y = (rows[:, None, :] @ mx.broadcast_to(w.T, (M, K, w.shape[0])))[:, 0, :]  # [M, N]
        return y if bias is None else y + bias

    return apart


def row_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    starts: mx.array,
    scale: float,
    longest: int | None = None,
) -> mx.array:
    """One-query attention in which each row's bits depend only on its own keys (the CPU's
    batch-invariant attention): row ``b`` attends positions ``starts[b]:`` of its keys.

    In fixed key blocks through the BLAS
    (:func:`~workbench.engine.levers.invariant_keyblocks.key_block_attention`) where that
    passed its check for this shape on this BLAS
    (:func:`~workbench.engine.levers.invariant_keyblocks.blocks_agree`), else
    :func:`strided_row_attention`. Arguments and result as theirs (``longest``: the most
    keys a row has, ``S - min(starts)``; ``None``: ``S``)."""
    from .invariant_keyblocks import blocks_agree, key_block_attention

    if blocks_agree(queries.shape[1] // keys.shape[1], queries.shape[-1], keys.dtype):
        return key_block_attention(queries, keys, values, starts, scale, longest)
    return strided_row_attention(queries, keys, values, starts, scale)


def strided_row_attention(
    queries: mx.array, keys: mx.array, values: mx.array, starts: mx.array, scale: float
) -> mx.array:
    """One-query attention in which each row's bits depend only on its own keys, by
    reductions alone (no BLAS): row ``b`` attends positions ``starts[b]:`` of its keys.

    The sums run so that leading padding cannot regroup them: scores are per-key dot
    products (a reduction over ``D`` only), the softmax's normalizer and the weighted sum of
    values are one reduction over ``S`` along a non-contiguous axis, which MLX's CPU runs
    position by position (``strided_reduce``), so the zeros of the padding add nothing and
    change no grouping. Float32 inside; within float rounding of
    ``mx.fast.scaled_dot_product_attention`` (measured 4e-7 in float32).

    Args:
        queries: ``[B, H, 1, D]`` (RoPE applied). keys, values: ``[B, n_kv_heads, S, D]``.
        starts: ``[B]`` int, each row's first attended position. scale: softmax scale.

    Returns:
        ``[B, H, 1, D]`` in the queries' dtype.
    """
    B, H, _, D = queries.shape
    Hkv, S = keys.shape[1], keys.shape[2]
    f32 = mx.float32
    q = (queries.astype(f32) * scale).reshape(B, Hkv, H // Hkv, 1, D)  # [B, Hkv, R, 1, D]
    scores = (q * keys.astype(f32)[:, :, None]).sum(-1)  # [B, Hkv, R, S]
    valid = mx.arange(S)[None, :] >= starts[:, None]  # [B, S]
    scores = mx.where(valid[:, None, None, :], scores, -mx.inf)
    e = mx.exp(scores - scores.max(-1, keepdims=True))  # [B, Hkv, R, S], 0 at padding
    v1 = mx.concatenate([values.astype(f32), mx.ones((B, Hkv, S, 1), dtype=f32)], axis=-1)[:, :, None]
    acc = (e[..., None] * v1).sum(-2)  # [B, Hkv, R, D + 1]: weighted values and the normalizer
    return (acc[..., :D] / acc[..., D:]).reshape(B, H, 1, D).astype(queries.dtype)


def _per_row(held: Sequence[int]) -> Callable[..., mx.array]:
    """The ``attention`` hook computing each row from its own keys alone (``held``: ``[B]``
    tokens each row's cache held before this forward; one or more query positions, a float
    or quantized cache: :func:`workbench.engine.levers.invariant_attention.per_row_attention`)."""
    from ...runtime.device import backend
    from .invariant_attention import per_row_attention

    cuda = backend() == "cuda"
    memo: dict = {}  # this forward's columns per cache width (per_row_attention's memo)

    def sdpa(original, queries, keys, values, cache, scale, mask, sinks=None):
        if not isinstance(cache, (BatchKVCache, BatchRotatingKVCache)) or sinks is not None:
            raise RuntimeError("batch-invariant attention runs over BatchKVCache rows only")
        return per_row_attention(
            original, row_attention, queries, keys, values, cache, scale, held, cuda, memo
        )

    return sdpa


@contextlib.contextmanager
def invariant_forward(model: Any, inv: Invariance | None, held: Sequence[int]) -> Iterator[None]:
    """Within the block, a one-token-per-row forward of ``model`` (this instance only) is
    batch-invariant: every projection in :func:`blocked` row blocks, and attention computing
    each row from its own keys alone (:func:`row_attention` on the CPU, the padded-rows kernel
    on CUDA where it serves, else one call per row), no mask (``held``: ``[B]`` tokens each
    row's cache held before the forward). ``inv=None``: unchanged."""
    if inv is None:
        yield
        return
    from .invariant_hook import blocked_projection

    with hooks_of(model, projections=True).using(
        projections=blocked_projection(inv, sys.modules[__name__]), attention=_per_row(held)
    ):
        yield


def configure(
    model: Any,
    batch_invariant: bool,
    max_kv_size: int | None = None,
    kv_quant: Any = None,
    kv_budget_bytes: int | None = None,
) -> Invariance | None:
    """``Scheduler(batch_invariant=)``: the mode's :class:`Invariance` on this device, or
    ``None`` when off. ``kv_quant`` and ``kv_budget_bytes`` compose with it (per-row attention
    over a quantized cache: :mod:`workbench.engine.levers.invariant_attention`; preemption
    replays a row's decode steps: :mod:`workbench.engine.levers.invariant_preempt`).

    Raises:
        ValueError: ``batch_invariant`` is not a bool; or it is True with what the mode
            cannot keep invariant, named: a layer cache other than full attention
            (``BatchKVCache``), a sliding window (``BatchRotatingKVCache``, also
            ``max_kv_size``) or recurrent state (``ArraysCache``).
    """
    from mlx_lm.models.cache import ArraysCache, CacheList

    from ..kv.caches import new_batch_cache

    if not isinstance(batch_invariant, bool):
        raise ValueError(f"batch_invariant must be True or False, got {batch_invariant!r}")
    if not batch_invariant:
        return None

    def leaves(c: Any) -> list[Any]:
        return [x for sub in c.caches for x in leaves(sub)] if isinstance(c, CacheList) else [c]

    for i, c in enumerate(x for layer in new_batch_cache(model, 1, max_kv_size) for x in leaves(layer)):
        if not (type(c) in (BatchKVCache, BatchRotatingKVCache) or isinstance(c, ArraysCache)):
            raise ValueError(
                f"batch_invariant=True cannot batch layer {i}'s {type(c).__name__}"
                + (f" (max_kv_size={max_kv_size})" if max_kv_size else "")
                + ": only full-attention (BatchKVCache), sliding-window (BatchRotatingKVCache) "
                "and recurrent (ArraysCache) layers"
            )
    hooks_of(model, projections=True)  # this model's projections and attention, hooked once
    return Invariance.calibrate(model)
