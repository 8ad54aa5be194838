"""The batch-invariant mode in the packed layout: every token of the ``[1, T]`` forward
computed as it is computed alone, whatever else the forward carries.

Knows: the mode's row-blocked projections (:func:`workbench.engine.levers.invariant.invariant_forward`)
and its one-query attention whose bits depend only on a row's own keys
(:func:`workbench.engine.levers.invariant.row_attention`), the per-token key blocks a packed
forward hands its layers (:class:`workbench.engine.packed.per_token.TokenBlock`, by duck
typing: levers do not import the packed layout). Must not know: requests, pages, the queue.

In a packed forward a row's tokens share the forward with other rows' decode tokens and
prefill chunks, and how a prompt is cut into chunks depends on the token budget the other
rows leave. So in the mode every token goes through the mode's per-row path:

- each projection (and the LM head's read-out) runs in the mode's fixed row blocks
  (:func:`~workbench.engine.levers.invariant.invariant_forward`): a token's bits do not depend
  on ``T``;
- each token's attention is a one-query :func:`~workbench.engine.levers.invariant.row_attention`
  over its own request's keys up to its own position (:func:`paged_row_attention`; off the CPU
  one attention call per token over exactly its keys): the same computation whether it is a
  decode token, a draft, or the ``j``-th token of a prefill chunk of any length, so a
  prompt's bits do not depend on how the budget cut it into chunks;
- RoPE, norms and the MLP's activations act on each token alone.

A row's tokens, log-probs and top-k log-probs are then bit-equal to the same request alone in
the same settings, with any neighbours, budget or schedule. The price: prefill attention is
one query per token (``T x L`` keys gathered, in blocks of
:data:`~workbench.engine.packed.per_token.BLOCK` tokens) instead of one causal call per chunk.

Axis letters: ``T`` packed tokens, ``n`` tokens of a block, ``L`` its longest context, ``H``
query heads, ``D`` head dim, ``N`` pool slots.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx

from .invariant import Invariance, invariant_forward, row_attention


def paged_row_attention(
    queries: mx.array,
    keys_pool: mx.array,
    values_pool: mx.array,
    blocks: Sequence[Any],
    scale: float,
    one_call_per_token: bool | None = None,
) -> mx.array:
    """Each packed token's attention over its own keys, computed as it is computed alone:
    ``queries`` ``[1, H, T, D]`` (RoPE applied), the layer's pools ``[N, n_kv_heads, D]``,
    ``blocks`` the forward's token blocks (``first``, ``n``, left-padded ``slots`` ``[n, L]``,
    ``starts`` ``[n]``). On the CPU one :func:`row_attention` per block (its key blocks are
    counted back from each token's own last key, so the left padding changes no bit); elsewhere
    (``one_call_per_token``, default: on any backend but the CPU, whose reductions may group by
    width) one ``mx.fast.scaled_dot_product_attention`` call per token over exactly its keys:
    the call it makes alone. Returns ``[1, H, T, D]``."""
    if one_call_per_token is None:
        from ...runtime.device import backend

        one_call_per_token = backend() != "cpu"
    outs = []
    for block in blocks:
        q = queries[0, :, block.first : block.first + block.n].transpose(1, 0, 2)[:, :, None]  # [n, H, 1, D]
        if one_call_per_token:
            for i, start in enumerate(block.starts.tolist()):
                k, v = (
                    pool[block.slots[i, start:]].transpose(1, 0, 2)[None] for pool in (keys_pool, values_pool)
                )
                outs.append(
                    mx.fast.scaled_dot_product_attention(q[i : i + 1], k, v, scale=scale)[0]
                )  # [H, 1, D]
            continue
        k, v = (
            _head_major(keys_pool, block.slots),
            _head_major(values_pool, block.slots),
        )  # [n, n_kv_heads, L, D]
        outs.append(row_attention(q, k, v, block.starts, scale)[:, :, 0].transpose(1, 0, 2))  # [H, n, D]
    return (outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=1))[None]


_FLAT: dict = {}  # (id(slots), n_kv_heads) -> (slots, flat): a forward's blocks, shared by its layers


def _head_major(pool: mx.array, slots: mx.array) -> mx.array:
    """``[n, n_kv_heads, L, D]`` row-contiguous: the keys (or values) of ``pool``
    ``[N, n_kv_heads, D]`` at ``slots`` ``[n, L]``, gathered as ``head_dim`` vectors of the flat
    pool ``[N * n_kv_heads, D]`` (one gather, each head's positions contiguous, as a padded
    cache holds them). Not ``pool[slots].transpose(0, 2, 1, 3)``: that view's positions are
    ``n_kv_heads * D`` apart, so the key blocks' BLAS calls get them by another path than a
    left-padded first block (a contiguous copy) and round otherwise: a token's log-prob then
    moved with the length of the longest token beside it in its block. The flat rows are made
    once per block and forward (every layer's keys and values share them)."""
    N, H, D = pool.shape
    hit = _FLAT.get((id(slots), H))
    if hit is None or hit[0] is not slots:
        if len(_FLAT) >= 16:
            _FLAT.clear()
        flat = slots[:, None, :] * H + mx.arange(H, dtype=slots.dtype)[None, :, None]  # [n, H, L]
        hit = _FLAT[id(slots), H] = (slots, flat)
    return pool.reshape(N * H, D)[hit[1]]


@contextlib.contextmanager
def packed_invariant_forward(model: Any, inv: Invariance | None) -> Iterator[None]:
    """Within the block a packed forward of ``model`` (this instance only) runs every
    projection in the mode's row blocks (``inv``; ``None``: unchanged). Its attention is the
    packed batch's ``token_attention`` (:func:`paged_row_attention`), which the paged layers
    call themselves."""
    with invariant_forward(model, inv, ()):
        yield
