"""The batch-invariant mode's CPU attention in fixed key blocks: one-query attention whose
bits depend only on the row's own keys, through the BLAS in calls of one fixed shape
(``docs/batch-invariance.md``, "Cost").

Knows: MLX's CPU matmul (a batched ``@`` is one BLAS call per matrix) and reductions. Must
not know: caches, requests, the scheduler.

A row's keys are cut into blocks of :data:`KEY_BLOCK` positions counted back from its last
key (every row of a left-padded cache ends at the last column, so the blocks of a row fall on
the same keys in any batch and alone). Per block, two BLAS calls of fixed shape: the scores
``[R, D] @ [D, KB]`` and the weighted values ``[R, KB] @ [KB, D]`` (``R`` query heads per KV
head), so the kernel never sees the batch size, the cache width or the padding. The
normalizer is each block's sum over its ``KB`` positions (a reduction of fixed width), and
the blocks are summed in order, first to last (MLX's CPU reduces a non-contiguous axis
position by position). Positions before the row's first key are masked (weight exactly 0,
adding 0 to every sum), so a longer batch only adds leading blocks of zeros. Worked example,
``KB = 4``: row ``b``'s 7 keys ``k0..k6`` in columns 3..9 of a cache 10 wide whose longest
row has 10 keys (3 blocks, 2 columns of padding added), and the same row alone (7 columns,
2 blocks, 1 column added); ``.`` is masked::

    in the batch   [. . . .] [. k0 k1 k2] [k3 k4 k5 k6]
    alone                    [. k0 k1 k2] [k3 k4 k5 k6]

The check (:func:`blocks_agree`, once per shape and process) sweeps the block's two BLAS
calls over batch counts and positions (:func:`unstable_block_counts`) and runs the attention
on random rows of several lengths behind several paddings against their runs alone
(:func:`rows_alone_agree`); where either fails the mode keeps
:func:`workbench.engine.levers.invariant.strided_row_attention`.

Axis letters: ``B`` rows, ``H`` query heads, ``Hkv`` KV heads, ``R = H / Hkv``, ``S``
cached positions, ``D`` head dim, ``KB`` key positions per block, ``nb`` blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

KEY_BLOCK = 32  # key positions per block (the BLAS calls' fixed width); docs/batch-invariance.md
_AGREE: dict = {}  # (R, D, dtype, block) -> whether the block attention passed blocks_agree


def key_block_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    first_key: mx.array,
    scale: float,
    longest: int | None = None,
    block: int = KEY_BLOCK,
) -> mx.array:
    """One-query attention in which each row's bits depend only on its own keys (see the
    module docstring); within float rounding of ``mx.fast.scaled_dot_product_attention``.

    Args:
        queries: ``[B, H, 1, D]`` (RoPE applied). keys, values: ``[B, Hkv, S, D]``, row
            ``b``'s keys in columns ``first_key[b]:``; the columns before may hold anything
            finite.
        first_key: ``[B]`` int, each row's first key column.
        scale: the softmax scale.
        longest: the most keys a row has (``S - min(first_key)``, a Python int so that nothing
            waits on the device); ``None``: ``S``.
        block: key positions per block.

    Returns:
        ``[B, H, 1, D]`` in the queries' dtype.
    """
    B, H, _, D = queries.shape
    Hkv, S = keys.shape[1], keys.shape[2]
    R, f32 = H // Hkv, mx.float32
    nb = -(-(S if longest is None else longest) // block)
    W = nb * block  # columns S - W .. S - 1: a first block reaching left of column 0 is padded
    kv = [(k.astype(f32), v.astype(f32)) for k, v in _blocks(keys, values, S, W, block)]
    q = (queries.astype(f32) * scale).reshape(B, Hkv, 1, R, D)
    scores = [q @ k.swapaxes(-1, -2) for k, _ in kv]  # one [R, D] @ [D, KB] call per block
    scores = scores[0] if len(scores) == 1 else mx.concatenate(scores, axis=2)  # [B, Hkv, nb, R, KB]
    scores = mx.where(_valid(first_key, S, W, block), scores, -mx.inf)
    e = mx.exp(scores - scores.max(-1, keepdims=True).max(2, keepdims=True))  # 0 where masked
    pv, first = [], 0
    for k, v in kv:  # one [R, KB] @ [KB, D] call per block
        pv.append(e[:, :, first : first + k.shape[2]] @ v)
        first += k.shape[2]
    num = (pv[0] if len(pv) == 1 else mx.concatenate(pv, axis=2)).sum(2)  # [B, Hkv, R, D], in order
    den = e.sum(-1, keepdims=True).sum(2)  # [B, Hkv, R, 1]
    return (num / den).reshape(B, H, 1, D).astype(queries.dtype)


_VALID: list = [None]  # (first_key, S, W, block, its mask): the last one made, kept


def _valid(first_key: mx.array, S: int, W: int, block: int) -> mx.array:
    """``[B, 1, nb, 1, KB]`` bool: which of columns ``S - W .. S - 1``, as blocks, are a row's
    keys (at or after ``first_key[b]``). The last one made is kept: every layer of a forward
    attends from the same ``first_key`` array (:func:`~.invariant_attention.starts_array`), so
    a decode step builds the mask once, not once per layer (three graph nodes a layer fewer;
    within the noise of ``workbench invariance --cost``). Raises nothing of its own."""
    hit = _VALID[0]  # one read: another thread may replace it
    if hit is not None and hit[0] is first_key and hit[1:4] == (S, W, block):
        return hit[4]
    B, nb = first_key.shape[0], W // block
    valid = (mx.arange(W)[None, :] >= (first_key + (W - S))[:, None]).reshape(B, 1, nb, 1, block)
    _VALID[0] = (first_key, S, W, block, valid)
    return valid


def blocks_agree(heads_per_kv: int, head_dim: int, dtype: Any, block: int = KEY_BLOCK) -> bool:
    """Whether the mode may attend in key blocks for this shape on this BLAS: the block's
    two BLAS calls give a block the same bits in a batched call of any count and position
    (:func:`unstable_block_counts` finds none) and whole rows get the bits of their run
    alone (:func:`rows_alone_agree`). Evidence (the calls' shapes are covered, not every
    value); memoized per ``(heads_per_kv, head_dim, dtype, block)``, a few tens of ms."""
    key = (heads_per_kv, head_dim, str(dtype), block)
    if key not in _AGREE:
        _AGREE[key] = not unstable_block_counts(heads_per_kv, head_dim, dtype, block) and rows_alone_agree(
            heads_per_kv, head_dim, dtype, block
        )
    return _AGREE[key]


def unstable_block_counts(
    heads_per_kv: int,
    head_dim: int,
    dtype: Any,
    block: int = KEY_BLOCK,
    counts: Sequence[int] = (1, 2, 3, 5, 8, 13, 32, 33, 100),
) -> list[int]:
    """The kernel-threshold sweep of the block's two BLAS calls: for each ``count``, a probe
    block (its queries ``[R, D]``, keys and values ``[KB, D]``, weights ``[R, KB]``) at a
    position moving with the count among random neighbours in one batched ``@`` of
    ``count`` blocks, against the probe's calls alone. Returns the counts at which the
    probe's scores or weighted values differ (``[]``: the kernel is bit-stable for this
    block shape: the batch count, the position and the neighbours never reach a block's
    bits)."""
    R, D, K = heads_per_kv, head_dim, block
    k0, k1, k2, k3 = mx.random.split(mx.random.key(3), 4)
    n = max(counts)
    q = mx.random.normal((n, R, D), key=k0).astype(dtype).astype(mx.float32)
    k = mx.random.normal((n, K, D), key=k1).astype(dtype).astype(mx.float32)
    v = mx.random.normal((n, K, D), key=k2).astype(dtype).astype(mx.float32)
    e = mx.exp(mx.random.normal((n, R, K), key=k3))  # weights in (0, inf), as after the softmax's exp
    bad = []
    for count in counts:
        at = (count - 1) * 2 // 3  # the probe's position, moving with the count
        idx = mx.array([(i - at) % n for i in range(count)])  # row `at` of the call holds block 0
        scores = q[idx] @ k[idx].swapaxes(-1, -2)  # [count, R, K]
        weighted = e[idx] @ v[idx]  # [count, R, D]
        if not (
            mx.array_equal(scores[at], (q[:1] @ k[:1].swapaxes(-1, -2))[0]).item()
            and mx.array_equal(weighted[at], (e[:1] @ v[:1])[0]).item()
        ):
            bad.append(count)
    return bad


def rows_alone_agree(
    heads_per_kv: int,
    head_dim: int,
    dtype: Any,
    block: int = KEY_BLOCK,
    lengths: Sequence[int] = (1, 5, 31, 32, 33, 64, 97, 200),
    pads: Sequence[int] = (0, 1, 7, 40, 99),
    attend: Callable[..., mx.array] | None = None,
) -> bool:
    """True when ``attend`` (default :func:`key_block_attention`) gives each of rows of
    ``lengths`` keys, in one batch behind each of ``pads`` columns of left padding (the
    longest row's; the others' padding holds other finite values), the bits of the same row
    alone (its keys only, no padding), with ``longest`` given and not (more leading blocks).
    ``attend``: ``(queries, keys, values, starts, scale, longest, block)``."""
    attend = attend or key_block_attention
    R, D, B, Hkv = heads_per_kv, head_dim, len(lengths), 2
    n = max(lengths) + max(pads)
    k0, k1, k2 = mx.random.split(mx.random.key(11), 3)
    q = mx.random.normal((B, Hkv * R, 1, D), key=k0).astype(dtype)  # [B, H, 1, D]
    k = mx.random.normal((B, Hkv, n, D), key=k1).astype(dtype)  # row b's keys: its last columns
    v = mx.random.normal((B, Hkv, n, D), key=k2).astype(dtype)

    def own(x: mx.array, b: int, width: int) -> mx.array:
        return x[b : b + 1, :, n - width :]

    alone = [
        attend(q[b : b + 1], own(k, b, m), own(v, b, m), mx.array([0]), 0.125, m, block)
        for b, m in enumerate(lengths)
    ]
    for p in pads:
        S = max(lengths) + p  # every row ends at column S - 1, the longest behind p columns
        starts = mx.array([S - m for m in lengths])
        keys, values = (mx.concatenate([own(x, b, S) for b in range(B)]) for x in (k, v))
        for longest in (max(lengths), None):
            out = attend(q, keys, values, starts, 0.125, longest, block)
            if not all(mx.array_equal(out[b], a[0]).item() for b, a in enumerate(alone)):
                return False
    return True


def _blocks(keys: mx.array, values: mx.array, S: int, W: int, block: int) -> list[tuple[mx.array, mx.array]]:
    """Columns ``S - W .. S - 1`` of ``keys`` and ``values`` (``[B, Hkv, S, D]``) as
    ``[B, Hkv, n, KB, D]`` blocks, first to last: one view where ``W <= S``; else the first
    block left-padded with zeros (a copy of ``KB`` columns) and the others a view (no copy
    of the whole cache)."""
    B, Hkv, _, D = keys.shape
    if W <= S:
        return [tuple(x[:, :, S - W :].reshape(B, Hkv, W // block, block, D) for x in (keys, values))]
    w = S - (W - block)  # the first block's columns inside the cache (1 .. KB - 1)
    pad = [(0, 0), (0, 0), (block - w, 0), (0, 0)]
    out = [tuple(mx.pad(x[:, :, :w], pad).reshape(B, Hkv, 1, block, D) for x in (keys, values))]
    if W > block:
        out.append(tuple(x[:, :, w:].reshape(B, Hkv, W // block - 1, block, D) for x in (keys, values)))
    return out
