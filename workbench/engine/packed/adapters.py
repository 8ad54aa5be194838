"""LoRA adapters in a packed forward: each token's adapter, gathered per token.

The packed forward is one ``[1, T]`` sequence whose tokens belong to different requests, so
each token gets its request's slot in the bank's stacks, as vLLM's punica kernels take a
per-token adapter index (``token_lora_indices``); each
:class:`~workbench.engine.levers.lora.RowLoRALinear` then runs its delta as ``T`` rows of one
token (``x`` ``[1, T, I]`` seen as ``[T, 1, I]``)::

    chunks   uid 0 (base) decode 1 | uid 1 ("prose") decode 1 | uid 2 ("numbers") prefill 3
    rows     [0, 1, 2, 2, 2]                                      (slot per token, [T])
    y[t] = linear(x[t]) + scale[rows[t]] * (x[t] @ A[rows[t]]) @ B[rows[t]]

Axis letters: ``T`` packed tokens, ``I`` / ``O`` a Linear's input / output features.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import mlx.core as mx
import numpy as np

from ...observe.packed import Chunk


def token_slots(bank, chunks: Sequence[Chunk], adapter_of: Mapping[int, str | None]) -> np.ndarray:
    """``[T]`` int32: each packed token's slot in ``bank``'s stacks (its request's adapter;
    ``0``: the base model), in the chunks' order.

    Raises:
        KeyError: a chunk's uid missing from ``adapter_of``.
    """
    slots = [bank.index(adapter_of[c.uid]) for c in chunks]
    return np.repeat(np.array(slots, np.int32), [c.n_tokens for c in chunks]).astype(np.int32)


@contextlib.contextmanager
def selected_tokens(bank, chunks: Sequence[Chunk], adapter_of: Mapping[int, str | None]) -> Iterator[None]:
    """While active, the packed forward of ``chunks`` runs each token with its request's adapter
    (``adapter_of``: uid -> name, ``None``: base); :func:`workbench.engine.levers.lora.selected`
    per token."""
    if bank is None or all(adapter_of[c.uid] is None for c in chunks):
        yield
        return
    slots = token_slots(bank, chunks, adapter_of)
    sel = bank.selection
    sel.bank, sel.rows, sel.per_token = bank, mx.array(slots), True
    sel.scale = mx.array(np.array(bank.scales, np.float32)[slots])[:, None, None]  # [T, 1, 1]
    try:
        yield
    finally:
        sel.bank, sel.rows, sel.scale, sel.per_token = None, None, None, False


def check_bank(bank) -> None:
    """Refuse adapters targeting a layer outside the decoder layers (``lm_head`` runs on
    sampled positions only).

    Raises:
        ValueError: naming ``adapters``, the adapter and the layer.
    """
    if bank is None:
        return
    for name, adapter in bank.adapters.items():
        outside = [t for t in adapter.targets if not t.startswith("model.layers.")]
        if outside:
            raise ValueError(
                f"layout='packed' does not take adapters targeting {outside[0]!r} (adapter {name!r}): "
                "it serves adapters on the decoder layers' projections (model.layers.*), as mlx-lm's "
                "LoRA training writes them (use layout='padded')"
            )
