"""A packed forward whose only chunk is one row's prefill, run as mlx-lm runs a prompt chunk:
the fast path of a prompt alone (a request's TTFT when nothing else is in flight, or a
prefill-first forward).

With one chunk the ``[1, T]`` sequence is one request's positions ``start .. end - 1`` in
order, so the general path's per-token work is not needed: RoPE takes the scalar offset
``start`` (mlx-lm's ``rope(x, offset=cache.offset)`` as it is, no per-token positions), the new
keys and values go into the pool as one slice where their slots are contiguous (one scatter
otherwise), and attention is one causal ``mx.fast.scaled_dot_product_attention`` (mlx-lm's
own call, ``mask="causal"``): over the new keys as they come when the chunk starts the request
(``start == 0``), else over the request's keys ``0 .. end - 1`` gathered from the pool once per
forward for every layer (a later chunk of a long prompt, or after a cached prefix). In a chunk
that samples, only its last token reaches the LM head, so the last layer attends for that token
alone (as mlx-lm's ``generate_step`` feeds a prompt's last token by itself, and the padded
layout's prefill never runs its last layer's attention over the prompt). Why it pays, in numbers:
``docs/packed.md``, "One row's prefill as mlx-lm runs it".

Example (page_size 4; uid 0 holds pages ``[2, 3]``)::

    row_index(t, Chunk(0, 0, 6, "prefill")) -> RowIndex(start=0, write=slice(8, 14), keys=None)
    row_index(t, Chunk(0, 4, 2, "prefill")) -> RowIndex(4, slice(12, 14), keys=[8, 9, 10, 11, 12, 13])

Axis letters: ``T`` the chunk's tokens, ``L`` its request's positions up to the chunk's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ...observe.packed import Chunk
from .grouped import Groups, _gather
from .pages import PageTable


def row_prefill(chunks: Sequence[Chunk]) -> bool:
    """Whether ``chunks`` are one chunk: one row's prefill (a lone decode chunk that samples
    runs as a decode row first: :func:`~workbench.engine.packed.decode_rows.decode_only`)."""
    return len(chunks) == 1


@dataclass(frozen=True)
class RowIndex:
    """Where one row's prefill chunk writes and what it attends (host side).

    Attributes:
        start: the chunk's first position (RoPE's scalar offset).
        write: the chunk's pool slots: a ``slice`` where they are contiguous, else ``[T]``
            int32 (numpy).
        keys: ``[L]`` int32 slots of the request's positions ``0 .. end - 1`` (numpy), or
            ``None`` when the chunk starts the request (attention over its new keys alone).
    """

    start: int
    write: slice | np.ndarray
    keys: np.ndarray | None


def row_index(table: PageTable, chunk: Chunk) -> RowIndex:
    """The :class:`RowIndex` of ``chunk`` over ``table``'s pages.

    Raises:
        ValueError: the chunk ends beyond its request's pages (as :meth:`PageTable.slots`)."""
    P, pages = table.page_size, table.pages.get(chunk.uid, [])
    if chunk.end > len(pages) * P:
        raise ValueError(
            f"uid {chunk.uid}: positions up to {chunk.end - 1} but only {len(pages)} page(s) of {P}"
        )
    need = np.asarray(pages[: -(-chunk.end // P)], np.int32)
    slots = (need[:, None] * P + np.arange(P, dtype=np.int32)).reshape(-1)[: chunk.end]
    write = slots[chunk.start :]
    if int(write[-1]) - int(write[0]) == len(write) - 1 and bool(np.all(np.diff(write) == 1)):
        write = slice(int(write[0]), int(write[-1]) + 1)
    return RowIndex(chunk.start, write, None if chunk.start == 0 else slots)


class RowPrefillLayer:
    """The cache one layer's ``Attention`` gets in a one-row prefill forward (mlx-lm's cache
    protocol: ``offset``, ``update_and_fetch``, ``make_mask``; mlx-lm's attention runs as it is
    over what ``update_and_fetch`` returns).

    Args:
        pools: the :class:`~workbench.engine.packed.attention.Pools`; layer: this layer's index.
        index: the chunk's :class:`RowIndex`.
        write: ``index.write`` as MLX (a ``slice`` as it is).
        keys: the :class:`~workbench.engine.packed.grouped.Groups` whose only row is
            ``index.keys`` (its flat indices built once for every layer), or ``None``.
    """

    attend = None  # mlx-lm's attention over what update_and_fetch returns (but last_query's layer)

    def __init__(
        self,
        pools: Any,
        layer: int,
        index: RowIndex,
        write: Any,
        keys: Groups | None,
        last_query: bool = False,
    ):
        self.pools, self.layer, self.index, self.write, self.keys = pools, layer, index, write, keys
        self.offset = index.start
        self.fetched: tuple[mx.array, mx.array] | None = None
        if last_query:
            self.attend = self.last_query_attention

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write ``keys``, ``values`` ``[1, n_kv_heads, T, head_dim]`` (RoPE applied) at the
        chunk's slots; return them as they are (the chunk starts its request) or the request's
        ``[1, n_kv_heads, L, head_dim]`` read back from the pool."""
        # [T, n_kv_heads, head_dim]; mx.squeeze, not keys[0] (MLX's integer index is a gather: a copy)
        k, v = (mx.squeeze(a, 0).transpose(1, 0, 2) for a in (keys, values))
        self.pools.fit(self.layer, k)
        kp, vp = self.pools.keys[self.layer], self.pools.values[self.layer]
        kp[self.write] = k
        vp[self.write] = v
        g = self.keys
        self.fetched = (
            (keys, values) if g is None else (_gather(kp, g.decode_slots, g), _gather(vp, g.decode_slots, g))
        )  # [1, n_kv, L, D]
        return self.fetched

    def last_query_attention(self, queries: mx.array, scale: float) -> mx.array:
        """The last layer of a chunk that samples: only its last token's output reaches the LM
        head, so only that query attends (over every key of the request: no mask), as mlx-lm's
        ``generate_step`` feeds a prompt's last token alone. ``queries`` ``[1, H, T, D]`` ->
        ``[1, H, T, D]``: the last token's output broadcast over the ``T`` positions (the
        others' are never read)."""
        keys, values = self.fetched
        last = mx.fast.scaled_dot_product_attention(queries[:, :, -1:], keys, values, scale=scale)
        return mx.broadcast_to(last, queries.shape)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> Any:
        """``"causal"`` (MLX aligns it to the last keys: query ``i`` sees positions
        ``0 .. start + i``), or that mask as a ``[N, L]`` bool array with ``return_array``."""
        if not return_array:
            return "causal"
        start = self.index.start
        return mx.arange(start + N)[None, :] <= (mx.arange(N) + start)[:, None]


def row_prefill_forward(
    model: Any, pools: Any, table: PageTable, chunk: Chunk, tokens: Sequence[int] | mx.array, head: Any
) -> mx.array:
    """``tokens`` ``[T]`` of one row's prefill ``chunk`` through ``model`` over the pools
    (written in place); returns the logits ``[1, V]`` of its last token when the chunk samples,
    else ``[0, hidden]``. ``head``: ``(model, h [R, hidden]) -> [R, V]`` (the LM head). Run it
    under the packed forward's attention hook (``paged_attention``), which calls a layer's
    ``attend``: in a chunk that samples, the last layer attends for its last token only
    (:meth:`RowPrefillLayer.last_query_attention`); without the hook every query attends, the
    same logits.

    Raises:
        ValueError: the chunk ends beyond its request's pages."""
    index = row_index(table, chunk)
    write = index.write if isinstance(index.write, slice) else mx.array(index.write)
    keys = None if index.keys is None else Groups(1, mx.array(index.keys)[None], None, ())
    n = len(model.model.layers)
    last_query = chunk.samples and chunk.n_tokens > 1
    caches = [RowPrefillLayer(pools, i, index, write, keys, last_query and i == n - 1) for i in range(n)]
    ids = tokens if isinstance(tokens, mx.array) else mx.array(list(tokens), dtype=mx.uint32)
    h = mx.squeeze(model.model(ids[None], cache=caches), 0)  # [T, hidden], normed: the model's own layers
    return head(model, h[-1:]) if chunk.samples else h[:0]
