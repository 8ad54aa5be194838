"""The batch-invariant mode's prefill attention of several prompts in one call: the prompts'
chunks of a forward that share a cache offset attend in ONE
``mx.fast.scaled_dot_product_attention`` call over their right-padded queries and keys, where
that call gives each real query the bits of its prompt's call alone (checked on the device by
:func:`batched_attention_holds`); elsewhere each prompt attends alone, as before.

Why it is exact in principle: with ``mask="causal"`` query ``i`` of a ``[L]``-query, ``[S]``-key
call sees keys ``0 .. i + S - L``. Rows of one offset ``o`` right-padded to ``L`` queries and
``o + L`` keys put every real query ``i`` of row ``b`` (``i < n_b``) on keys ``0 .. o + i``: its
own, never the padding. Whether its *bits* equal the call alone (``[1, H, n_b, D]``) depends on
the kernel: measured on an H100 (mlx 0.32.4, bf16, ``scripts/lab/gpu_prefill_sdpa.py``), 2-32
rows of 160-486 tokens, short chunks of 2-64, one row padded from 297 to 300 / 512 / 1024 and
second chunks at offset 512 kept every row's bits (75 of 75 rows), and the 256 per-prompt calls
of 16 prompts x 16 layers launched in 18.7 ms against 0.44 ms as 16 calls. On the CPU (float32,
OpenBLAS) they did not (the unfused fallback's matmuls change with the shape): the CPU is not
tried (:data:`BACKENDS`).

A query count at or below :data:`SOLO_QUERIES` can take another kernel alone (MLX's vector
kernel: fewer than 4 queries on CUDA, up to 8 on Metal) than padded among longer rows, so such a
row attends alone wherever it sits. Knows: mlx's fused attention and nothing of the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

BACKENDS = ("cuda", "metal")  # where :func:`batched_attention_holds` is tried (the CPU: measured not)
SOLO_QUERIES = 8  # a row with this many queries or fewer attends alone (the vector kernels' range)
# :func:`batched_attention_holds`'s rows: query counts around the kernels' tile edges, padded among
# each other, at offset 0 and at an offset (a chunk after the first, its keys a cache's slice)
CHECK_LENGTHS = (9, 16, 17, 63, 64, 65, 130, 257, 511)
CHECK_OFFSET = 128
_HOLDS: dict = {}  # (backend, n_q, n_kv, head_dim, dtype) -> bool


def batched_attention_holds(backend: str, n_q: int, n_kv: int, head_dim: int, dtype: Any) -> bool:
    """Whether one causal ``scaled_dot_product_attention`` call over right-padded rows gives
    every real query its bits alone, for ``[*, n_q, *, head_dim]`` queries over ``n_kv`` key
    heads in ``dtype`` on ``backend`` (``"cuda"``, ``"metal"``, ``"cpu"``), once per process
    and shape: :data:`CHECK_LENGTHS` rows at offset 0 and at :data:`CHECK_OFFSET`, each compared
    with its call alone, the alone call's keys both a slice of a longer buffer (as a ``KVCache``
    returns them) and exact contiguous copies (as a first chunk's cache holds them). ``False``
    on a backend outside :data:`BACKENDS`. Evidence, not proof (as
    :func:`~.invariant.rows_agree`): it covers the shapes' kernel choices, not values. No mlx-lm
    counterpart.

    Raises:
        nothing: a mismatch is ``False``."""
    if backend not in BACKENDS:
        return False
    key = (backend, n_q, n_kv, head_dim, str(dtype))
    if key not in _HOLDS:
        _HOLDS[key] = all(_offset_holds(n_q, n_kv, head_dim, dtype, offset) for offset in (0, CHECK_OFFSET))
    return _HOLDS[key]


def _offset_holds(n_q: int, n_kv: int, head_dim: int, dtype: Any, offset: int) -> bool:
    """:func:`batched_attention_holds` for the rows at one ``offset``."""
    n, L, scale = CHECK_LENGTHS, max(CHECK_LENGTHS), head_dim**-0.5
    q = mx.random.normal((len(n), n_q, L, head_dim), key=mx.random.key(3)).astype(dtype)  # [R, H, L, D]
    buffer = (len(n), n_kv, offset + L + 64, head_dim)  # the alone call's keys: a slice of a longer buffer
    k = mx.random.normal(buffer, key=mx.random.key(4)).astype(dtype)
    v = mx.random.normal(buffer, key=mx.random.key(5)).astype(dtype)
    keys = [k[b : b + 1, :, : offset + m] for b, m in enumerate(n)]  # [1, n_kv, offset + m, D] each
    values = [v[b : b + 1, :, : offset + m] for b, m in enumerate(n)]
    out = causal(q, padded(keys, offset + L), padded(values, offset + L), scale)
    for b, m in enumerate(n):
        q_b = mx.contiguous(q[b : b + 1, :, :m])
        for k_b, v_b in ((keys[b], values[b]), (mx.contiguous(keys[b]), mx.contiguous(values[b]))):
            # the alone call's keys as a cache's slice and as exact copies (``invariant_prefill._write``)
            if not mx.array_equal(out[b : b + 1, :, :m], causal(q_b, k_b, v_b, scale)).item():
                return False
    return True


def causal(queries: mx.array, keys: mx.array, values: mx.array, scale: float) -> mx.array:
    """``mx.fast.scaled_dot_product_attention`` with the causal mask (none for one query):
    ``[B, n_q, L, D]`` queries over ``[B, n_kv, S, D]`` keys and values (``S >= L``), the
    query ``i`` seeing keys ``0 .. i + S - L``; returns ``[B, n_q, L, D]``. Mirrors the call
    mlx-lm's ``scaled_dot_product_attention`` makes for a causal prefill.

    Raises:
        ValueError: from MLX, on shapes it refuses."""
    mask = "causal" if queries.shape[2] > 1 else None
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)


def padded(rows: Sequence[mx.array], S: int) -> mx.array:
    """``[len(rows), n_kv, S, D]``: each row's ``[1, n_kv, s_b, D]`` (``s_b <= S``) right-padded
    with zeros to ``S`` positions, concatenated (never attended by a real query: see the module
    docstring). No mlx-lm counterpart (its prefill left-pads one batch).

    Raises:
        ValueError: from MLX, rows whose head counts or head dims differ."""
    out = []
    for r in rows:
        gap = S - r.shape[2]
        out.append(
            r
            if gap == 0
            else mx.concatenate([r, mx.zeros((1, r.shape[1], gap, r.shape[3]), r.dtype)], axis=2)
        )
    return out[0] if len(out) == 1 else mx.concatenate(out)


def groups(offsets: Sequence[int], lengths: Sequence[int], batched: bool) -> list[list[int]]:
    """The rows of a forward in attention calls: rows of one cache offset with more than
    :data:`SOLO_QUERIES` queries share a call when ``batched``; every other row is a call of
    its own. ``[[row, ...], ...]`` in first-row order. No mlx-lm counterpart.

    Raises:
        nothing."""
    out: dict[Any, list[int]] = {}
    for b, (o, n) in enumerate(zip(offsets, lengths)):
        out.setdefault(("o", o) if batched and n > SOLO_QUERIES else ("b", b), []).append(b)
    return list(out.values())


def attend(
    queries: mx.array,
    fresh: tuple[mx.array, mx.array],
    fetched: Sequence[tuple[mx.array, mx.array]],
    offsets: Sequence[int],
    lengths: Sequence[int],
    scale: float,
    batched: bool,
) -> mx.array:
    """A forward's prefill attention, every row on its own keys, causally: rows in
    :func:`groups` (one call per group), a group of one as its prefill alone calls it.

    Args:
        queries: ``[B', n_q, C, D]``, RoPE applied; row ``b``'s first ``lengths[b]`` real.
        fresh: this forward's keys and values ``[B', n_kv, C, D]`` (row ``b``'s first
            ``lengths[b]`` real: a group at offset 0 attends these).
        fetched: per row its cache's keys and values ``[1, n_kv, offsets[b] + lengths[b], D]``.
        offsets: ``[B']`` tokens each row's cache held before this forward.
        lengths: ``[B']`` each row's real queries (``1 .. C``).
        scale: the softmax scale.
        batched: whether rows may share a call (:func:`batched_attention_holds` said so).

    Returns:
        ``[B', n_q, C, D]``; a padding position is zeros in a row attending alone, and
        finite values never read in a shared call. Mirrors, per row, mlx-lm's
        ``scaled_dot_product_attention`` of a causal prefill.

    Raises:
        ValueError: from MLX, on shapes it refuses."""
    C, parts, order = queries.shape[2], [], []
    for rows in groups(offsets, lengths, batched):
        if len(rows) == 1:
            b, n = rows[0], lengths[rows[0]]
            o = causal(mx.contiguous(queries[b : b + 1, :, :n]), *fetched[b], scale)  # the layout alone has
            parts.append(padded([o], C))
        else:
            whole = len(rows) == queries.shape[0]
            index = None if whole else mx.array(rows, dtype=mx.int32)
            if offsets[rows[0]] == 0:
                k, v = fresh if whole else (fresh[0][index], fresh[1][index])
            else:
                S = offsets[rows[0]] + C
                k, v = padded([fetched[b][0] for b in rows], S), padded([fetched[b][1] for b in rows], S)
            parts.append(causal(queries if whole else queries[index], k, v, scale))
        order += rows
    if len(parts) == 1:
        return parts[0]
    out = mx.concatenate(parts)
    if order == sorted(order):
        return out
    inverse = [0] * len(order)
    for i, b in enumerate(order):
        inverse[b] = i
    return out[mx.array(inverse, dtype=mx.int32)]
