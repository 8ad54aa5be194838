"""Quantized pages: the packed layout's pools holding keys and values as ``mx.quantize``
stores them, attended with the padded quantized cache's semantics.

Storage: each layer's keys (and values) are three pools, ``(packed [N, n_kv_heads, D_p]
uint32, scales [N, n_kv_heads, G], biases [N, n_kv_heads, G])``, what ``mx.quantize`` returns
for ``[N, n_kv_heads, D]`` (groups along ``D`` only, so pages commute with quantizing).

Semantics: mlx-lm's ``generate_step(kv_bits=, quantized_kv_start=0)``, as
:mod:`workbench.engine.levers.quantized_kv`: a row's **first forward**
(:func:`first_forward` tokens, run whole: a chunk starting at position 0) attends to its own
float keys, **every later** chunk and decode token to quantized keys. Why and how:
``docs/lab/engine-notes.md``, "packed/quantized_pages.py".

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
    """Tokens of a row's first forward on float keys: ``max(1, min(prefill_step_size, prompt - 1))``
    (as :func:`~workbench.engine.levers.quantized_prefill.first_forward_tokens`)."""
    return max(1, min(prefill_step_size, prompt_tokens - 1))


class QuantizedPools(Pools):
    """Every layer's keys and values as quantized :data:`Parts` tuples.

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
        """:meth:`Pools.fit`, part by part."""
        for pool in (self.keys, self.values):
            have = pool[layer]
            n = 0 if have is None else have[0].shape[0]
            if n < self.slots:
                grow = tuple(mx.zeros((self.slots - n, *p.shape[1:]), dtype=p.dtype) for p in like)
                pool[layer] = (
                    grow if have is None else tuple(mx.concatenate([h, g]) for h, g in zip(have, grow))
                )

    def copy_pages(self, pairs: Sequence[tuple[int, int]], page_size: int) -> None:
        """:meth:`Pools.copy_pages`, part by part."""
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
    """The paged layer over :class:`QuantizedPools` (grouped path only).

    Raises:
        ValueError: built for the masked path or with the CUDA kernel's decode rows.
    """

    def __init__(self, pools: QuantizedPools, layer: int, write: mx.array, positions: mx.array, **kw: Any):
        super().__init__(pools, layer, write, positions, **kw)
        if self.groups is None or self.decode is not None:
            raise ValueError("quantized pages are attended by groups only (no masked path, no CUDA kernel)")
        self.fresh: tuple[mx.array, mx.array] | None = None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write ``keys``, ``values`` ``[1, n_kv_heads, T, head_dim]`` quantized; return them (float)."""
        pools = self.pools
        k, v = pools.quantize(keys[0].transpose(1, 0, 2)), pools.quantize(values[0].transpose(1, 0, 2))
        pools.fit(self.layer, k)
        for pool, parts in ((pools.keys, k), (pools.values, v)):
            for stored, new in zip(pool[self.layer], parts, strict=True):
                stored[self.write] = new
        self.fresh = (keys, values)
        return keys, values

    def attend(self, queries: mx.array, scale: float) -> mx.array:
        """``[1, H, T, D]`` attention by groups: first forwards on float keys, all else quantized."""
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
    """A :class:`PackedBatch` over :class:`QuantizedPools`, first forwards run whole.

    Args:
        quant, attention: as :class:`QuantizedPools`. prefill_step_size: decides the first
            forward. The others as :class:`PackedBatch` (no CUDA decode kernel).
    """

    def __init__(self, *args: Any, quant: Any, prefill_step_size: int, attention: Any = None, **kw: Any):
        super().__init__(*args, **{**kw, "decode_kernel": False})
        self.quant, self.prefill_step_size = quant, prefill_step_size
        self.pools = QuantizedPools(self.n_layers, quant, attention)

    def wants(self, unread: Collection[int] = ()) -> list[Want]:
        """:meth:`PackedBatch.wants`, first forwards asked whole (:attr:`Want.first`)."""
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
