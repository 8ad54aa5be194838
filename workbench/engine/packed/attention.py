"""The packed forward: mlx-lm's own layers over one ``[1, T]`` sequence of every
scheduled token, each layer handed a paged cache object (mlx-lm's cache protocol).

Per layer, with the model's ``Attention`` unchanged: RoPE at each token's own position
(:class:`PerTokenRoPE`), the ``T`` new keys and values written into the pool
(:meth:`PagedLayer.update_and_fetch`), then attention by groups (default,
:meth:`PagedLayer.attend`) or ``masked`` (the ``[T, S]`` block-diagonal mask, mlx-lm's
attention unchanged: the reference). Only the sampled positions reach the LM head
(:func:`lm_logits`). Step by step: ``docs/lab/engine-notes.md``, "packed/attention.py".

Axis letters: ``T`` packed tokens, ``S`` gathered key positions, ``R`` sampled rows,
``N`` pool slots (``capacity_pages * page_size``), ``H`` heads, ``D`` head dim, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from ...observe.packed import Chunk, packed_mask
from ..model_hooks import hooks_of
from . import cuda_attention
from .cuda_attention import DecodePages
from .decode_rows import DecodeRowsLayer, decode_index, decode_only
from .grouped import Groups, _gather, grouped_attention, groups_of
from .indices import ForwardIndex, forward_index
from .pages import PageTable
from .per_token import token_blocks
from .row_prefill import row_prefill, row_prefill_forward


class Pools:
    """Every layer's key and value pool: ``keys[l]``, ``values[l]`` ``[N, n_kv_heads, head_dim]``,
    made at the first write (the model's dtype), grown to ``slots``, written in place."""

    def __init__(self, n_layers: int):
        self.keys: list[mx.array | None] = [None] * n_layers
        self.values: list[mx.array | None] = [None] * n_layers
        self.slots = 0

    @property
    def nbytes(self) -> int:
        """Bytes the pools allocate (all layers, keys and values)."""
        return sum(int(a.nbytes) for a in self.keys + self.values if a is not None)

    def fit(self, layer: int, like: mx.array) -> None:
        """Grow layer ``layer``'s pools to ``[slots, H, D]`` in ``like``'s dtype."""
        for pool in (self.keys, self.values):
            have = pool[layer]
            n = 0 if have is None else have.shape[0]
            if n < self.slots:
                grow = mx.zeros((self.slots - n, *like.shape[1:]), dtype=like.dtype)
                pool[layer] = grow if have is None else mx.concatenate([have, grow])

    def copy_pages(self, pairs: Sequence[tuple[int, int]], page_size: int) -> None:
        """Copy each ``(source, copy)`` page's slots in every layer (copy-on-write), in place."""
        if not pairs:
            return
        src, dst = (
            mx.array(
                np.concatenate([np.arange(p * page_size, (p + 1) * page_size) for p in pages]).astype(
                    np.int32
                )
            )
            for pages in zip(*pairs, strict=True)
        )
        layers = [layer for layer, have in enumerate(self.keys) if have is not None]
        for layer in layers:
            self.fit(layer, self.keys[layer])
        # Read before the writes: a write into a pool that a gather not yet run still reads
        # copies the pool whole (MLX reuses only a buffer nothing else refers to).
        moved = {(id(pool), layer): pool[layer][src] for layer in layers for pool in (self.keys, self.values)}
        mx.eval(list(moved.values()))
        for layer in layers:
            for pool in (self.keys, self.values):
                pool[layer][dst] = moved[id(pool), layer]

    def clone(self, share: bool = False) -> "Pools":
        """A copy: the same arrays with ``share`` (a savepoint), else new handles (a checkpoint)."""
        out = Pools(len(self.keys))
        handle = (lambda a: a) if share else (lambda a: None if a is None else mx.view(a, a.dtype))
        out.keys, out.values = [handle(a) for a in self.keys], [handle(a) for a in self.values]
        out.slots = self.slots
        return out


class PagedLayer:
    """The cache one layer's ``Attention`` gets in a packed forward (``offset``,
    ``update_and_fetch``, ``make_mask``, and ``attend`` for the grouped path).

    Args:
        pools, layer: the pools and this layer's index.
        write, positions: ``[T]`` int32 pool slot and RoPE position of each packed token.
        gather: ``[S]`` int32 key slots and mask ``[T, S]`` bool (masked path), or
            :class:`~workbench.engine.packed.grouped.Groups`.
        decode: :class:`~workbench.engine.packed.cuda_attention.DecodePages` for the CUDA
            kernel, or ``None``.
        per_token: ``(attention, blocks)`` attending each token on its own (batch-invariant
            mode, :func:`~workbench.engine.packed.per_token.token_blocks`), or ``None``.
    """

    def __init__(
        self,
        pools: Pools,
        layer: int,
        write: mx.array,
        positions: mx.array,
        gather: mx.array | None = None,
        mask: mx.array | None = None,
        groups: Groups | None = None,
        decode: DecodePages | None = None,
        per_token: tuple | None = None,
    ):
        self.pools, self.layer, self.write, self.gather = pools, layer, write, gather
        self.mask, self.offset, self.groups, self.decode = mask, positions, groups, decode
        self.per_token = per_token
        if groups is None and per_token is None:
            self.attend = None  # the masked path: mlx-lm's attention over the gathered keys

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write ``keys``, ``values`` ``[1, n_kv_heads, T, head_dim]`` (rows: ``[R, ., 1, .]``) at
        their slots; return the gathered ``[1, n_kv_heads, S, head_dim]`` (masked) or them as is."""
        B, H, T, D = keys.shape  # [1, n_kv_heads, T, head_dim], or [R, n_kv_heads, 1, head_dim] (rows)
        if T == 1:  # one token a row (decode rows, or T = 1): [B, H, D] with no transpose
            k, v = keys.reshape(B, H, D), values.reshape(B, H, D)
        else:  # mx.squeeze, not keys[0]: MLX makes an integer index a gather (a copy) and a squeeze
            k, v = (mx.squeeze(a, 0).transpose(1, 0, 2) for a in (keys, values))  # [T, H, D]
        self.pools.fit(self.layer, k)
        kp, vp = self.pools.keys[self.layer], self.pools.values[self.layer]
        kp[self.write] = k
        vp[self.write] = v
        if self.groups is not None or self.per_token is not None:  # attend() reads the pools
            return keys, values
        return kp[self.gather].transpose(1, 0, 2)[None], vp[self.gather].transpose(1, 0, 2)[None]

    def attend(self, queries: mx.array, scale: float) -> mx.array:
        """Attention of ``queries`` ``[1, H, T, D]`` (decode rows alone: ``[R, H, 1, D]``) over
        this layer's pools by groups (:func:`~workbench.engine.packed.grouped.grouped_attention`)."""
        k, v = self.pools.keys[self.layer], self.pools.values[self.layer]
        if self.per_token is not None:
            attention, blocks = self.per_token
            return attention(queries, k, v, blocks, scale)
        if self.decode is not None:
            return cuda_attention.packed_attention(queries, k, v, self.decode, self.groups, scale)
        g = self.groups
        if g.n_decode and not g.chunks and queries.shape[0] == g.n_decode and queries.shape[2] == 1:
            keys, values = _gather(k, g.decode_slots, g), _gather(v, g.decode_slots, g)  # [R, n_kv, L, D]
            return mx.fast.scaled_dot_product_attention(
                queries, keys, values, scale=scale, mask=g.decode_mask
            )
        return grouped_attention(queries, k, v, g, scale)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        """The ``[T, S]`` packed mask (``N == T``; no window: full attention only);
        ``None`` on the grouped path."""
        return self.mask


def paged_attention(original: Any, queries, keys, values, cache, scale, mask, sinks=None) -> mx.array:
    """The attention hook of a packed forward (mlx-lm's ``scaled_dot_product_attention``
    signature): :meth:`PagedLayer.attend` where the layer attends by groups, else ``original``."""
    attend = getattr(cache, "attend", None)
    if attend is None or sinks is not None:
        return original(queries, keys, values, cache, scale, mask, sinks)
    return attend(queries, scale)


class PerTokenRoPE:
    """A layer's RoPE that also takes ``T`` positions for ``x`` ``[1, H, T, D]`` (rotated as
    ``[T, H, 1, D]``); every other call goes to the layer's RoPE unchanged."""

    def __init__(self, rope: Any):
        self.rope = rope

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        if (
            isinstance(offset, mx.array)
            and offset.ndim == 1
            and x.shape[0] == 1
            and offset.shape[0] == x.shape[2] > 1
        ):
            return self.rope(x.transpose(2, 1, 0, 3), offset=offset).transpose(2, 1, 0, 3)
        return self.rope(x, offset=offset)


@contextlib.contextmanager
def per_token_rope(inner: Any) -> Iterator[None]:
    """Within the block, every layer's ``self_attn.rope`` is a :class:`PerTokenRoPE`."""
    attns = [layer.self_attn for layer in inner.layers]
    try:
        for attn in attns:
            object.__setattr__(attn, "rope", PerTokenRoPE(attn["rope"]))  # wraps the child, never a wrapper
        yield
    finally:
        for attn in attns:
            attn.__dict__.pop("rope", None)


def lm_logits(model: Any, h: mx.array) -> mx.array:
    """``h`` ``[..., hidden]`` -> ``[..., V]`` through the LM head, as ``llama.Model.__call__`` ends."""
    if model.args.tie_word_embeddings:
        return model.model.embed_tokens.as_linear(h)
    return model.lm_head(h)


def layer_inputs(
    table: PageTable, chunks: Sequence[Chunk], index: ForwardIndex | None = None
) -> dict[str, np.ndarray]:
    """``write`` ``[T]``, ``positions`` ``[T]`` and ``sampled`` ``[R]`` of one packed forward.

    Raises:
        ValueError: a chunk beyond its request's pages."""
    index = forward_index(table, chunks) if index is None else index
    index.check(chunks)
    return dict(write=index.write(), positions=index.positions(), sampled=index.sampled())


def paged_layers(
    pools: Pools,
    table: PageTable,
    chunks: Sequence[Chunk],
    n_layers: int,
    arrays: dict,
    masked: bool = False,
    decode_kernel: bool = False,
    index: ForwardIndex | None = None,
    token_attention: Any = None,
) -> list[PagedLayer]:
    """One :class:`PagedLayer` per layer, by groups (default) or ``masked``."""
    write, positions = mx.array(arrays["write"]), mx.array(arrays["positions"])
    if token_attention is not None:
        per_token = (token_attention, token_blocks(forward_index(table, chunks) if index is None else index))
        return [PagedLayer(pools, i, write, positions, per_token=per_token) for i in range(n_layers)]
    if not masked:
        index = forward_index(table, chunks) if index is None else index
        decode = cuda_attention.decode_pages(table, chunks, index) if decode_kernel else None
        groups = groups_of(table, chunks, index, decode.n_rows if decode else 0)
        Layer = getattr(pools, "layer_class", PagedLayer)  # quantized pools: their own layer
        return [Layer(pools, i, write, positions, groups=groups, decode=decode) for i in range(n_layers)]
    gather = mx.array(np.array(table.gather_slots([(c.uid, c.end) for c in chunks]), np.int32))
    mask = mx.array(packed_mask(chunks))
    Layer = getattr(pools, "layer_class", PagedLayer)  # quantized pools refuse the masked path
    return [Layer(pools, i, write, positions, gather=gather, mask=mask) for i in range(n_layers)]


def selected(choice: bool | None, n_heads: int, pool: mx.array | None) -> bool:
    """Whether decode rows go to the CUDA kernel: ``False`` never, ``None`` on CUDA where it
    serves, ``True`` where it serves on any device."""
    from ...runtime.device import backend

    if choice is False or not cuda_attention.serves(n_heads, pool):
        return False
    return bool(choice) or backend() == "cuda"


def packed_forward(
    model: Any,
    pools: Pools,
    table: PageTable,
    chunks: Sequence[Chunk],
    tokens: Sequence[int] | mx.array,
    masked: bool = False,
    decode_kernel: bool | None = None,
    token_attention: Any = None,
) -> mx.array:
    """Run ``tokens`` ``[T]`` through ``model`` as one ``[1, T]`` forward over the pools
    (written in place); returns the logits ``[R, V]`` at each sampling chunk's last token.
    ``decode_kernel``: as :func:`selected`; ``token_attention``: per-token attention.

    Raises:
        ValueError: a chunk beyond its request's pages.
    """
    pools.slots = max(pools.slots, table.capacity * table.page_size)
    inner = model.model
    kernel = not masked and selected(decode_kernel, inner.layers[0].self_attn.n_heads, pools.keys[0])
    float_pools = getattr(pools, "layer_class", PagedLayer) is PagedLayer  # quantized pools: their own layer
    if not masked and token_attention is None and float_pools and decode_only(chunks):
        return _decode_rows_forward(model, pools, table, chunks, tokens, kernel)
    if not masked and not kernel and token_attention is None and float_pools and row_prefill(chunks):
        with hooks_of(model).calling(paged_attention):  # the last layer's attend: the last query only
            return row_prefill_forward(model, pools, table, chunks[0], tokens, lm_logits)
    index = forward_index(table, chunks)
    arrays = layer_inputs(table, chunks, index)
    caches = paged_layers(
        pools, table, chunks, len(inner.layers), arrays, masked, kernel, index, token_attention
    )
    with hooks_of(model).calling(paged_attention), per_token_rope(inner):
        ids = tokens if isinstance(tokens, mx.array) else mx.array(list(tokens), dtype=mx.uint32)
        h = mx.squeeze(inner(ids[None], cache=caches), 0)  # [T, hidden], normed
    return lm_logits(model, h[mx.array(arrays["sampled"])]) if len(arrays["sampled"]) else h[:0]  # [R, V]


def _decode_rows_forward(
    model: Any, pools: Pools, table: PageTable, chunks: Sequence[Chunk], tokens: Any, kernel: bool
) -> mx.array:
    """:func:`packed_forward` of decode chunks only, run as ``[R, 1]`` rows
    (:class:`~workbench.engine.packed.decode_rows.DecodeRowsLayer`; ``tokens``: ``[R]`` ids,
    as :func:`packed_forward`'s; ``kernel``: attending by the CUDA kernel); logits ``[R, V]``."""
    inner = model.model
    ix = decode_index(table, chunks, slots=not kernel, heads=inner.layers[0].self_attn.n_kv_heads)
    write, positions = mx.array(ix.write[0] if len(chunks) == 1 else ix.write), mx.array(ix.positions)
    flat, mask, decode = None, None, None
    if kernel:  # the kernel reads the page table: no slot grid, no mask
        ends = ix.positions + 1
        decode = DecodePages(
            len(chunks), mx.array(ix.pages), mx.array(ends), table.page_size, int(ends.max())
        )
    else:
        # made on the host: no index arithmetic nor reshape in the step's graph
        mask = None if ix.mask is None else mx.array(ix.mask[:, None, None, :])  # [R, 1, 1, L]
        flat = mx.array(ix.flat)  # [R, n_kv, L]: flat_indices(slots, n_kv)
    caches = [
        DecodeRowsLayer(pools, i, write, positions, flat, mask, decode) for i in range(len(inner.layers))
    ]
    ids = tokens if isinstance(tokens, mx.array) else mx.array(list(tokens), dtype=mx.uint32)
    with hooks_of(model).calling(paged_attention):
        h = inner(ids[:, None], cache=caches)[:, 0]  # [R, hidden], normed; RoPE at each row's [R] offsets
    return lm_logits(model, h)
