"""Per-token attention inputs of a packed forward: each token's own keys, left-padded, so
that a batch-invariant attention can compute every token the way it computes it alone.

Consumed by the batch-invariant mode's attention (:mod:`workbench.engine.levers.invariant_packed`).

Token ``t`` (chunk ``c``, position ``p``) attends its request's positions ``0 .. p`` (its
chunk's earlier tokens included: causal). Tokens go in blocks of at most ``BLOCK``; in a block
of longest context ``L``, token ``t``'s slots fill the last ``p + 1`` columns of its row of
``slots`` ``[n, L]`` (``starts[t] = L - p - 1``; the columns before hold slot 0, never
attended), the left padding the mode's one-query attention reads from ``starts``.

Example (page_size 4; uid 0 holds pages ``[0, 1]`` and decodes at position 5; uid 1 prefills
positions 0..1 in page ``[2]``)::

    token_blocks(forward_index(t, [Chunk(0, 5, 1, "decode"), Chunk(1, 0, 2, "prefill")]))
      -> [(0, 3, slots [[0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 8], [0, 0, 0, 0, 8, 9]],
           starts [0, 5, 4])]

Axis letters: ``T`` packed tokens, ``n`` tokens of a block, ``L`` its longest context.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import numpy as np

from .indices import ForwardIndex

BLOCK = 64  # tokens per attention call: the gathered keys are [n, n_kv_heads, L, D], not [T, ...]


class TokenBlock(NamedTuple):
    """One block of the forward's tokens: packed tokens ``first .. first + n - 1``, their
    left-padded slots ``[n, L]`` int32 and first attended column ``starts`` ``[n]`` int32."""

    first: int
    n: int
    slots: mx.array
    starts: mx.array


def token_blocks(index: ForwardIndex, block: int = BLOCK) -> list[TokenBlock]:
    """The :class:`TokenBlock` s of a forward with :class:`ForwardIndex` ``index`` (see the
    module docstring); ``block``: most tokens a block holds (``>= 1``)."""
    n_tok = index.ends - index.starts
    chunk = np.repeat(np.arange(len(n_tok)), n_tok)  # [T] the chunk of each packed token
    pos = index.positions().astype(np.int64)  # [T]
    P, out = index.page_size, []
    for first in range(0, len(pos), block):
        c, p = chunk[first : first + block], pos[first : first + block]
        L = int(p.max()) + 1
        starts = L - p - 1  # [n]
        j = np.arange(L)[None, :] - starts[:, None]  # [n, L] the position each column holds
        held = np.clip(j, 0, None)
        slots = index.pages[c[:, None], held // P] * P + held % P
        slots[j < 0] = 0
        out.append(
            TokenBlock(first, len(p), mx.array(slots.astype(np.int32)), mx.array(starts.astype(np.int32)))
        )
    return out
