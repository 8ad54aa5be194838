"""Planted faults: known ways to compute a batch wrongly, switched on for a ``with``
block, so :func:`workbench.verify.layers.localize` can be shown (and tested) to find them.

Knows: :mod:`workbench.verify.layer_hooks` (wrapping a layer's call), how mlx-lm model
modules get their masks (``create_attention_mask`` imported by name into the model's
module, which calls the cache's ``make_mask``), mlx-lm batch caches' public per-row
``offset`` and ``left_padding`` arrays (RoPE reads ``cache.offset``). Must not know: the
scheduler. The engine never uses this module; every fault is undone on exit.

Each fault touches only batched computation, so the solo side of a re-run stays right:

- :func:`noisy_row`: layer ``k``'s output for batch row ``r`` gets relative noise, only
  when the forward has more than one row (the planted fault of issue 16).
- :func:`no_padding_mask`: a batch cache's mask is dropped (mlx-lm's ``make_mask`` not
  called): every row attends to every cached position, its left padding included. A
  single-sequence cache keeps its mask (a one-token decode needs none).
- :func:`rope_counts_padding`: each row's RoPE position becomes its position in the padded
  batch (``offset + left_padding``, i.e. the KV width) instead of its own ``offset``: rows
  with left padding get rotated as if the pads were tokens.

Axis letters: ``B`` rows, ``L`` positions in the forward, ``hidden`` the model width.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx

from .layer_hooks import hooked_layers, model_layers, output_array


@contextmanager
def noisy_row(model: Any, layer: int, row: int, scale: float = 1e-2, seed: int = 0) -> Iterator[None]:
    """Within the block, layer ``layer``'s output ``[B, L, hidden]`` for batch row ``row``
    gets Gaussian noise of ``scale`` times that row's largest magnitude, whenever
    ``B > 1`` (a forward of one row, e.g. the solo reference, is untouched).

    Raises:
        ValueError: for a layer index out of range (:func:`hooked_layers`) or a negative row.
    """
    if row < 0:
        raise ValueError(f"row must be >= 0, got {row}")

    def hook(i: int, real: Any, args: tuple, kwargs: dict) -> Any:
        out = real(*args, **kwargs)
        h = output_array(out)
        B = h.shape[0]
        if B <= 1 or row >= B:
            return out
        noise = mx.random.normal(h.shape[1:], key=mx.random.key(seed)).astype(h.dtype)  # [L, hidden]
        picked = (mx.arange(B) == row).reshape(B, 1, 1).astype(h.dtype)  # [B, 1, 1]
        noisy = h + picked * noise * (scale * mx.abs(h[row]).max())
        return (noisy, *out[1:]) if isinstance(out, tuple) else noisy

    with hooked_layers(model, {layer: hook}):
        yield


def _model_modules(model: Any) -> list[Any]:
    """The Python modules of the model's classes (where mlx-lm model files import
    ``create_attention_mask`` by name), each once."""
    names = {type(m).__module__ for _, m in model.named_modules()}
    return [sys.modules[n] for n in sorted(names) if n in sys.modules]


@contextmanager
def no_padding_mask(model: Any) -> Iterator[None]:
    """Within the block, attention masks built from a batch cache (one with
    ``left_padding``) are dropped: ``None`` for a one-token decode, ``"causal"`` for a
    longer forward. Patches ``create_attention_mask`` in the model's modules.

    Raises:
        ValueError: when no module of the model imports ``create_attention_mask``.
    """
    patched = [
        (m, m.create_attention_mask) for m in _model_modules(model) if hasattr(m, "create_attention_mask")
    ]
    if not patched:
        raise ValueError(f"{type(model).__module__} builds no mask through create_attention_mask")

    def make(original):
        def create_attention_mask(h, cache=None, *args, **kwargs):
            if cache is not None and getattr(cache, "left_padding", None) is not None:
                return None if h.shape[1] == 1 else "causal"  # h: [B, L, hidden]
            return original(h, cache, *args, **kwargs)

        return create_attention_mask

    for module, original in patched:
        module.create_attention_mask = make(original)
    try:
        yield
    finally:
        for module, original in patched:
            module.create_attention_mask = original


def _layer_cache(args: tuple, kwargs: dict) -> Any:
    """The cache argument of mlx-lm's ``layer(h, mask, cache)`` call."""
    return kwargs["cache"] if "cache" in kwargs else (args[2] if len(args) > 2 else None)


@contextmanager
def rope_counts_padding(model: Any) -> Iterator[None]:
    """Within the block, every layer that gets a batch cache (one with ``left_padding``
    and a per-row ``offset`` ``[B]``) runs with ``offset + left_padding`` as the RoPE
    position, then the cache's own offset is put back (advanced as the layer advanced it).

    Raises:
        ValueError: for a model without ``layers`` (:func:`hooked_layers`).
    """

    def hook(i: int, real: Any, args: tuple, kwargs: dict) -> Any:
        cache = _layer_cache(args, kwargs)
        padding = getattr(cache, "left_padding", None)
        if padding is None or not isinstance(getattr(cache, "offset", None), mx.array):
            return real(*args, **kwargs)
        cache.offset = cache.offset + padding
        try:
            return real(*args, **kwargs)
        finally:
            cache.offset = cache.offset - padding

    with hooked_layers(model, {i: hook for i in range(len(model_layers(model)))}):
        yield
