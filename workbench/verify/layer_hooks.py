"""Hooks around a model's transformer layers: wrap each layer's call for the length of a
``with`` block, then put the layers back. mlx-lm's code is not changed.

Knows: how mlx-lm models hold their layers: ``model.layers`` (a property of every mlx-lm
``Model``) lists the decoder layers in order, and the model's forward loops over the list
that holds them (``self.layers`` of the inner model, e.g. ``model.model.layers`` in
``mlx_lm.models.llama``; ``pipeline_layers`` in ``qwen3_next`` slices it on every call).
Must not know: caches, the scheduler, batching.

A hook is ``hook(i, layer, args, kwargs)``: it runs the real layer (``layer(*args,
**kwargs)``, mlx-lm's ``layer(h, mask, cache)``) and returns its output, possibly changed.
The wrapper forwards attribute reads (``layer.use_sliding``, ``layer.is_linear``) to the
real layer, so model code that inspects its layers keeps working.

Axis letters: ``B`` rows, ``L`` positions in the forward, ``hidden`` the model width.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx

Hook = Callable[[int, Any, tuple, dict], Any]


class _Wrapped:
    """Stands in for layer ``index`` in its model's list while a hook is installed."""

    def __init__(self, index: int, layer: Any, hook: Hook):
        self._index, self._layer, self._hook = index, layer, hook

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._hook(self._index, self._layer, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)


def model_layers(model: Any) -> list[Any]:
    """The model's decoder layers in order (mlx-lm's ``model.layers``).

    Raises:
        ValueError: when the model has no ``layers`` list (not an mlx-lm model).
    """
    layers = getattr(model, "layers", None)
    if not isinstance(layers, (list, tuple)) or not layers:
        raise ValueError(f"{type(model).__module__}.{type(model).__name__} has no `layers` list to hook")
    return list(layers)


def _holders(model: Any, layers: list[Any]) -> list[tuple[list, int, int]]:
    """Every ``(list, position, layer index)`` in the model's module tree that holds one
    of ``layers`` (the list the forward iterates, wherever it lives)."""
    index_of = {id(layer): i for i, layer in enumerate(layers)}
    found = []
    for _, module in model.named_modules():
        for value in module.values():
            if isinstance(value, list):
                found += [(value, k, index_of[id(v)]) for k, v in enumerate(value) if id(v) in index_of]
    return found


@contextmanager
def hooked_layers(model: Any, hooks: dict[int, Hook]) -> Iterator[None]:
    """Within the block, layer ``i``'s call goes through ``hooks[i]`` (for each key);
    the real layers are back in place on exit, whatever happens inside.

    Args:
        model: an mlx-lm model (``mlx_lm.load``).
        hooks: layer index (``0 .. len(model.layers) - 1``) -> hook (see the module
            docstring).

    Raises:
        ValueError: for a model without ``layers``, a layer index out of range, or a
            layer that no list in the model's module tree holds.
    """
    layers = model_layers(model)
    bad = [i for i in hooks if not 0 <= i < len(layers)]
    if bad:
        raise ValueError(
            f"layer index {bad} out of range: the model has {len(layers)} layers (0..{len(layers) - 1})"
        )
    holders = [h for h in _holders(model, layers) if h[2] in hooks]
    missing = sorted(set(hooks) - {i for _, _, i in holders})
    if missing:
        raise ValueError(f"layers {missing} are not held by a list of the model's modules; cannot hook them")
    for holder, k, i in holders:
        holder[k] = _Wrapped(i, layers[i], hooks[i])
    try:
        yield
    finally:
        for holder, k, i in holders:
            holder[k] = layers[i]


def output_array(out: Any) -> mx.array:
    """The hidden states ``[B, L, hidden]`` of a layer's output (mlx-lm layers return
    the array itself; a tuple's first element otherwise)."""
    return out[0] if isinstance(out, (tuple, list)) else out


@contextmanager
def recorded_layers(model: Any) -> Iterator[list[list[mx.array]]]:
    """Within the block, record every layer's output on every forward.

    Yields ``outputs``: ``outputs[i]`` lists layer ``i``'s outputs ``[B, L, hidden]``, one
    per forward run inside the block, in order (lazy MLX arrays: evaluate them, or read
    them after the forward was evaluated).

    Raises:
        ValueError: as :func:`hooked_layers`.
    """
    outputs: list[list[mx.array]] = [[] for _ in model_layers(model)]

    def record(i: int, layer: Any, args: tuple, kwargs: dict) -> Any:
        out = layer(*args, **kwargs)
        outputs[i].append(output_array(out))
        return out

    with hooked_layers(model, {i: record for i in range(len(outputs))}):
        yield outputs
