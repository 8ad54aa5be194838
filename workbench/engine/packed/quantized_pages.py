"""Quantized pages: the packed layout's pools holding keys and values as ``mx.quantize``
stores them, attended with the padded quantized cache's semantics.

Knows: the pools and paged layers of :mod:`workbench.engine.packed.attention`, the groups of
:mod:`workbench.engine.packed.grouped`, a quantization (``bits``, ``group_size``: a
:class:`~workbench.engine.levers.quantized_kv.KVQuant`) and an attention over quantized keys
with the signature of mlx-lm's ``quantized_scaled_dot_product_attention`` (the layout passes
mlx-lm's or :func:`~workbench.engine.levers.quantized_attention.dequantized_attention`). Must
not know: the queue, events, admission, the levers.

Storage: each layer's keys (and values) are three pools, ``(packed [N, n_kv_heads, D_p]
uint32, scales [N, n_kv_heads, G], biases [N, n_kv_heads, G])``, what ``mx.quantize``
returns for ``[N, n_kv_heads, D]`` (groups along ``D`` only, so each position is quantized
on its own: a page holds exactly the parts mlx-lm's ``QuantizedKVCache`` holds for those
positions, and gathering, copying or sharing pages commutes with quantizing).

Semantics: mlx-lm's ``generate_step(kv_bits=, quantized_kv_start=0)``, as the padded
layout's quantized cache (:mod:`workbench.engine.levers.quantized_kv`): a row's **first
forward** attends to float keys (the chunk's own keys, fresh from the projection, mlx-lm's
float ``KVCache`` before ``maybe_quantize_kv_cache`` converts it), **every later one** to
quantized keys (its own new keys included, quantized before they are read, as
``QuantizedKVCache.update_and_fetch``). The first forward covers exactly
``max(1, min(prefill_step_size, prompt - 1))`` tokens (:func:`first_forward`, the
reference's first ``_model_call``), whatever the token budget or the other rows leave:
:meth:`QuantizedPackedBatch.wants` asks the plan for that chunk whole
(:attr:`~workbench.engine.packed.plan.Want.first`), and the plan runs it only in a forward
with room for all of it. A chunk that starts at position 0 is a row's first forward (a
preempted row starts again at 0 and prefills its prompt and tokens again: its first chunk is
the same size, as in the padded layout); every other chunk and every decode token read the
quantized pages.

Example (4 bits, group 32, head dim 32: ``D_p = 4``, ``G = 1``; one position of one KV head
in one layer, keys + values)::

    float16: 2 * 32 * 2 bytes = 128 B;  quantized: 2 * (4 * 4 + 2 * 1 * 2) = 40 B

Axis letters: ``T`` packed tokens, ``N`` pool slots, ``R`` decode rows, ``L`` keys per row,
``D`` head dim, ``D_p = D * bits / 32``, ``G = D / group_size``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

import mlx.core as mx
import mlx_lm.models.base as mlx_base

from .attention import PagedLayer, Pools
from .batch import PackedBatch
from .grouped import _gather
from .plan import Want

Parts = tuple[mx.array, mx.array, mx.array]  # (packed, scales, biases), [N, n_kv_heads, D_p | G | G]


def first_forward(prompt_tokens: int, prefill_step_size: int) -> int:
    """Tokens of a row's first forward on float keys: ``min(prefill_step_size, prompt - 1)``
    (``generate_step`` prefills all but the last prompt token, in chunks), or ``1`` for a
    one-token prompt (its first ``_step``). The padded layout's
    :func:`~workbench.engine.levers.quantized_prefill.first_forward_tokens`."""
    return max(1, min(prefill_step_size, prompt_tokens - 1))


class QuantizedPools(Pools):
    """Every layer's keys and values as quantized parts (see the module docstring):
    ``keys[l]``, ``values[l]`` are :data:`Parts` tuples, made at the first write, grown to
    ``slots``.

    Args:
        n_layers: the model's layers. quant: the quantization (``bits``, ``group_size``).
        attention: ``(queries, q_keys, q_values, scale=, mask=, group_size=, bits=)`` ->
            ``[B, H, L, D]``, attention over quantized parts (default mlx-lm's
            ``quantized_scaled_dot_product_attention``).
    """

    layer_class: type  # set below: the paged layer that reads these pools

    def __init__(self, n_layers: int, quant: Any, attention: Any = None):
        super().__init__(n_layers)
        self.quant = quant
        self.attention = attention or mlx_base.quantized_scaled_dot_product_attention

    @property
    def nbytes(self) -> int:
        """Bytes the pools allocate (all layers, keys and values, the three parts)."""
        return sum(int(a.nbytes) for parts in self.keys + self.values if parts is not None for a in parts)

    def quantize(self, x: mx.array) -> Parts:
        """``x`` ``[T, n_kv_heads, D]`` -> its :data:`Parts` (``mx.quantize`` along ``D``)."""
        return tuple(mx.quantize(x, group_size=self.quant.group_size, bits=self.quant.bits))

    def fit(self, layer: int, like: Parts) -> None:
        """Make layer ``layer``'s parts ``[slots, ...]`` (zeros, ``like``'s dtypes and
        trailing shapes), keeping what they hold."""
        for pool in (self.keys, self.values):
            have = pool[layer]
            n = 0 if have is None else have[0].shape[0]
            if n < self.slots:
                grow = tuple(mx.zeros((self.slots - n, *p.shape[1:]), dtype=p.dtype) for p in like)
                pool[layer] = (
                    grow if have is None else tuple(mx.concatenate([h, g]) for h, g in zip(have, grow))
                )

    def copy_pages(self, pairs: Sequence[tuple[int, int]], page_size: int) -> None:
        """:meth:`Pools.copy_pages` over each part in turn (each read before it is written:
        in place), the parts grown to ``slots`` first."""
        if not pairs:
            return
        for layer, have in enumerate(self.keys):
            if have is not None:
                self.fit(layer, have)
        for i in range(3):  # packed, scales, biases: float-pool copies of the same page slots
            part = Pools(len(self.keys))
            part.slots = self.slots
            part.keys = [None if p is None else p[i] for p in self.keys]
            part.values = [None if p is None else p[i] for p in self.values]
            Pools.copy_pages(part, pairs, page_size)  # writes the arrays these parts hold

    def clone(self, share: bool = False) -> "QuantizedPools":
        """As :meth:`Pools.clone`, part by part."""
        out = QuantizedPools(len(self.keys), self.quant, self.attention)

        def handle(parts):
            if parts is None or share:
                return parts
            return tuple(mx.view(a, a.dtype) for a in parts)

        out.keys, out.values = [handle(p) for p in self.keys], [handle(p) for p in self.values]
        out.slots = self.slots
        return out


class QuantizedPagedLayer(PagedLayer):
    """The paged layer over :class:`QuantizedPools`: writes each token's keys and values
    quantized, attends by groups (the grouped path only) with the module docstring's
    semantics.

    Raises:
        ValueError: built for the masked path (``groups`` ``None``), or with the CUDA
            kernel's decode rows (neither reads quantized pages).
    """

    def __init__(self, pools: QuantizedPools, layer: int, write: mx.array, positions: mx.array, **kw: Any):
        super().__init__(pools, layer, write, positions, **kw)
        if self.groups is None or self.decode is not None:
            raise ValueError("quantized pages are attended by groups only (no masked path, no CUDA kernel)")
        self.fresh: tuple[mx.array, mx.array] | None = None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Quantize ``keys``, ``values`` ``[1, n_kv_heads, T, head_dim]`` and write the parts
        at their slots; keep the float ones for the rows' first forwards; return them."""
        pools = self.pools
        k, v = pools.quantize(keys[0].transpose(1, 0, 2)), pools.quantize(values[0].transpose(1, 0, 2))
        pools.fit(self.layer, k)
        for pool, parts in ((pools.keys, k), (pools.values, v)):
            for stored, new in zip(pool[self.layer], parts, strict=True):
                stored[self.write] = new
        self.fresh = (keys, values)
        return keys, values

    def attend(self, queries: mx.array, scale: float) -> mx.array:
        """Attention of ``queries`` ``[1, H, T, D]`` by groups: the decode rows and every
        chunk not starting at position 0 over the quantized pages (mlx-lm's quantized
        attention, or dequantized where the device lacks it), a chunk starting at 0 (a
        row's first forward) over its own float keys, causal. Returns ``[1, H, T, D]``."""
        pools, groups = self.pools, self.groups
        quant, attention = pools.quant, pools.attention
        kq, vq = pools.keys[self.layer], pools.values[self.layer]

        def quantized(q: mx.array, slots: mx.array, mask: Any, batch: bool) -> mx.array:
            k = tuple(_gather(p, slots, groups) for p in kq)  # [R, n_kv, L, .] (or [n_kv, end, .])
            v = tuple(_gather(p, slots, groups) for p in vq)
            if not batch:
                k, v = tuple(a[None] for a in k), tuple(a[None] for a in v)
            return attention(q, k, v, scale=scale, mask=mask, group_size=quant.group_size, bits=quant.bits)

        outs = []
        R = groups.n_decode
        if R:
            q = (queries if queries.shape[2] == R else queries[:, :, :R]).transpose(
                2, 1, 0, 3
            )  # [R, H, 1, D]
            outs.append(quantized(q, groups.decode_slots, groups.decode_mask, True).transpose(2, 1, 0, 3))
        keys, values = self.fresh
        for first, n, slots in groups.chunks:
            q, mask = queries[:, :, first : first + n], ("causal" if n > 1 else None)
            if slots.shape[0] == n:  # starts at 0: the row's first forward, on float keys
                k, v = keys[:, :, first : first + n], values[:, :, first : first + n]
                outs.append(mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask))
            else:
                outs.append(quantized(q, slots, mask, False))
        return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)


QuantizedPools.layer_class = QuantizedPagedLayer


class QuantizedPackedBatch(PackedBatch):
    """A :class:`PackedBatch` over :class:`QuantizedPools` whose rows' first forwards are
    exactly :func:`first_forward` tokens (the plan runs such a chunk whole or not at all).

    Args:
        quant, attention: as :class:`QuantizedPools`. prefill_step_size: the scheduler's
            (decides the first forward). The others as :class:`PackedBatch` (no CUDA decode
            kernel: it reads float pools).
    """

    def __init__(self, *args: Any, quant: Any, prefill_step_size: int, attention: Any = None, **kw: Any):
        super().__init__(*args, **{**kw, "decode_kernel": False})
        self.quant, self.prefill_step_size = quant, prefill_step_size
        self.pools = QuantizedPools(self.n_layers, quant, attention)

    def wants(self, unread: Collection[int] = ()) -> list[Want]:
        """:meth:`PackedBatch.wants`, a row with nothing in pages asking for its first
        forward whole (:attr:`Want.first`)."""
        prompts = {r.uid: len(r.valid.prompt_ids) for r in self.rows}
        return [
            replace(w, first=first_forward(prompts[w.uid], self.prefill_step_size)) if w.held == 0 else w
            for w in super().wants(unread)
        ]

    def clone(self, state_of: Any, share_appended: bool = False) -> "QuantizedPackedBatch":
        """As :meth:`PackedBatch.clone` (the pools' parts cloned by :meth:`QuantizedPools.clone`)."""
        out = super().clone(state_of, share_appended)
        out.__class__ = QuantizedPackedBatch
        out.quant, out.prefill_step_size = self.quant, self.prefill_step_size
        return out
