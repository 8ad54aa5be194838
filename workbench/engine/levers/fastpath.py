"""Decode fast paths: attention without a mask where no row is padded, a fused attention
kernel that honours each row's left padding without a mask (CUDA), and each layer's MLP
under ``mx.compile``.

- **No mask.** A one-token step in which no row is left-padded passes ``None`` instead of
  mlx-lm's all-True ``BatchKVCache.make_mask``: the same attention, on the CPU the same bits.
- **Padded-rows kernel** (CUDA, default there):
  :func:`workbench.engine.levers.padded_attention.padded_decode_attention` over padded rows
  (within float rounding of the unfused path, not bit-equal).
- **Compiled MLP** (opt-in, ``fast_decode=True``): each layer's MLP under ``mx.compile``;
  decode only, never with per-row LoRA adapters.

Swaps are made on this scheduler's model instance only (:mod:`workbench.engine.model_hooks`),
while the engine builds its own forward's graph, and undone after. What each bought:
``docs/architecture.md`` ("Measurements behind the defaults"); notes:
``docs/lab/engine-notes.md``, "levers/fastpath.py".
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from ..kv.cache_internals import LayerCaches, write_index
from ..model_hooks import hooks_of

PADDED_KERNEL_MIN_ROWS = 1  # rows from which the padded-rows kernel beats masked attention in a step
# (scripts/lab/gpu_crossover.py measures it; docs/gpu.md)


@dataclass(frozen=True)
class FastDecode:
    """Which decode fast paths the engine may take.

    Attributes:
        no_mask: attention without a mask in steps where no row is left-padded.
        compile_mlp: every layer's MLP under ``mx.compile`` (where :func:`compilable`).
        padded_kernel: the padded-rows attention kernel over left-padded rows (CUDA).
        kernel_min_rows: fewest rows the kernel serves (:data:`PADDED_KERNEL_MIN_ROWS`).
    """

    no_mask: bool
    compile_mlp: bool
    padded_kernel: bool = False
    kernel_min_rows: int = 1

    @classmethod
    def of(cls, fast_decode: bool | None, adapters: Any = None) -> "FastDecode":
        """From ``Scheduler(fast_decode=)``: ``None``: no mask and (CUDA) the kernel; ``True``: all
        three (no compiled MLP with ``adapters``); ``False``: none.

        Raises:
            ValueError: ``fast_decode`` is not ``None``, ``True`` or ``False``.
        """
        from ...runtime.device import backend

        if not (fast_decode is None or isinstance(fast_decode, bool)):
            raise ValueError(f"fast_decode must be None, True or False, got {fast_decode!r}")
        no_mask = fast_decode is None or bool(fast_decode)
        return cls(
            no_mask,
            bool(fast_decode) and adapters is None,
            no_mask and backend() == "cuda",
            PADDED_KERNEL_MIN_ROWS,
        )


def unpadded(caches: LayerCaches | None, held: Sequence[int]) -> bool:
    """True when every layer is a ``BatchKVCache`` (keeping its ``make_mask``) whose write index
    equals every row's ``held`` ``[B]`` (tokens before the step): no row is left-padded."""
    if not caches or not held:
        return False
    width = set(held)
    if len(width) != 1:
        return False
    for c in caches:
        if not _mask_is_padding(c) or c.keys is None or write_index(c) != next(iter(width)):
            return False
    return True


def _mask_is_padding(c: Any) -> bool:
    """True for a cache whose one-token mask is only its rows' left padding."""
    return isinstance(c, BatchKVCache) and type(c).make_mask is BatchKVCache.make_mask


def _one_token_unmasked(make_mask: Callable[..., Any]) -> Callable[..., Any]:
    def make(N: int, *args: Any, **kwargs: Any) -> Any:
        return None if N == 1 else make_mask(N, *args, **kwargs)

    return make


@contextlib.contextmanager
def without_mask(caches: LayerCaches) -> Iterator[None]:
    """Within the block, each cache's ``make_mask(1)`` returns ``None`` (no mask); other
    lengths are unchanged. Call only where :func:`unpadded` holds."""
    patched = []
    try:
        for c in caches:
            c.make_mask = _one_token_unmasked(c.make_mask)
            patched.append(c)
        yield
    finally:
        for c in patched:
            del c.__dict__["make_mask"]


_COMPILED: dict[int, list[tuple[Any, Callable[[mx.array], mx.array]]]] = {}  # id(model) -> per block
# (an mlx Module is a dict, so not hashable: keyed by id, dropped when the model is collected)


def _blocks(model: Any) -> list[Any]:
    layers = getattr(model, "layers", None)
    return list(layers) if layers is not None else []


def compilable(model: Any) -> bool:
    """True when every transformer block of ``model`` has an ``mlp`` module."""
    import mlx.nn as nn

    blocks = _blocks(model)
    return bool(blocks) and all(
        isinstance(getattr(b, "mlp", None), nn.Module) and type(b.mlp).__name__ == "MLP" for b in blocks
    )


@contextlib.contextmanager
def compiled_mlps(model: Any) -> Iterator[None]:
    """Within the block, each block's ``mlp`` runs ``mx.compile``\\ d (compiled once per module:
    weights changed in place later are not seen); restored after. Mirrors nothing in mlx-lm."""
    blocks = _blocks(model)
    plain = [b.mlp for b in blocks]
    made = _COMPILED.get(id(model))
    if made is None or any(m is not p for (m, _), p in zip(made, plain)):  # new or replaced MLPs
        if made is None:
            weakref.finalize(model, _COMPILED.pop, id(model), None)
        made = _COMPILED[id(model)] = [(mlp, mx.compile(lambda x, mlp=mlp: mlp(x))) for mlp in plain]
    try:
        for b, (_, fast) in zip(blocks, made):
            b.mlp = fast
        yield
    finally:
        for b, module in zip(blocks, plain):
            b.mlp = module


def plain_batch_caches(caches: LayerCaches | None) -> bool:
    """True when every layer is mlx-lm's float ``BatchKVCache``."""
    return bool(caches) and all(
        _mask_is_padding(c) and not hasattr(c, "bits") and c.keys is not None for c in caches
    )


def kernel_serves(caches: LayerCaches) -> bool:
    """True when the padded-rows kernel serves every layer (head dim and key dtype supported)."""
    from . import padded_attention as kernel

    return all(c.keys.shape[-1] in kernel.HEAD_DIMS and c.keys.dtype in kernel.DTYPES for c in caches)


def _padded_kernel(original, queries, keys, values, cache, scale, mask, sinks=None):
    """The attention hook: the padded kernel where it serves, else ``original``."""
    from .padded_attention import padded_decode_attention, supported

    if (
        sinks is None
        and isinstance(mask, mx.array)
        and plain_batch_caches([cache])
        and supported(queries, keys)
    ):
        return padded_decode_attention(
            queries, cache.keys, cache.values, cache.left_padding, write_index(cache), scale
        )
    return original(queries, keys, values, cache, scale, mask, sinks)


@contextlib.contextmanager
def padded_attention(model: Any) -> Iterator[bool]:
    """Within the block, ``model``'s one-query attention over a padded float ``BatchKVCache``
    runs :func:`~workbench.engine.levers.padded_attention.padded_decode_attention` (CUDA); other
    calls run mlx-lm's ``scaled_dot_product_attention``. Yields whether it could hook the model.
    """
    hooks = hooks_of(model)
    if not hooks.attention_hooked:
        yield False
        return
    with hooks.using(attention=_padded_kernel):
        yield True


@contextlib.contextmanager
def decode_fast_path(
    model: Any, caches: LayerCaches, held: Sequence[int], paths: FastDecode
) -> Iterator[str]:
    """Within the block, build a decode forward with whichever fast paths apply.

    Args:
        held: ``[B]`` tokens each row holds before the step (see :func:`unpadded`).
        paths: the paths allowed (:class:`FastDecode`), each taken where its check holds.

    Yields:
        Which paths are on: ``""``, ``"no mask"`` or ``"padded kernel"``, ``"compiled
        MLP"``, joined by ``" + "``.
    """
    with contextlib.ExitStack() as stack:
        on = []
        if paths.no_mask and unpadded(caches, held):
            stack.enter_context(without_mask(caches))
            on.append("no mask")
        elif (
            paths.padded_kernel
            and len(held) >= paths.kernel_min_rows
            and plain_batch_caches(caches)
            and kernel_serves(caches)
            and stack.enter_context(padded_attention(model))
        ):
            on.append("padded kernel")
        if paths.compile_mlp and compilable(model):
            stack.enter_context(compiled_mlps(model))
            on.append("compiled MLP")
        yield " + ".join(on)
