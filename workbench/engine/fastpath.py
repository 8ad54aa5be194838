"""Decode fast paths that leave the numbers unchanged: attention without a mask where no
row is padded, and each layer's MLP under ``mx.compile``.

Knows: mlx-lm's ``BatchKVCache`` (its write index and ``make_mask``) and the ``mlp``
attribute of mlx-lm's transformer blocks. Must not know: requests, the queue, events.

Both were measured on an H200 as levers of the decode step (issue 15, ``docs/gpu.md``):

- **No mask.** mlx-lm's ``BatchKVCache.make_mask`` returns a mask array for every step,
  also a one-token step in which no row is left-padded, where every cached position is
  attended anyway. MLX's fused one-query attention kernel on CUDA takes no array mask, so
  the masked step falls back to a slower path. Where every row holds as many tokens as the
  cache's write index (no left padding: always at B = 1), the step passes ``None`` instead,
  which is the same attention: on the CPU the masked path applies ``where(mask, scores,
  -inf)`` with an all-True mask, an identity, so the bits are equal.
- **Compiled MLP** (opt-in, ``fast_decode=True``). Each layer's MLP (three projections and
  the SiLU gate) as one ``mx.compile``\\ d function per input shape: fewer Python calls and
  graph nodes per step, the same kernels. Only for decode (one shape per batch size) and
  only where the layer MLPs are plain modules (not with per-row LoRA adapters, whose
  layers read a row selection at call time). Alone on the bare forward it cut an H200
  step by 9-10%; inside the engine it bought nothing measurable, so it is off by default.

The swaps are made only while the engine builds its own forward's graph (a ``with``
block) and undone after it, so an oracle or a user calling the same model meanwhile runs
mlx-lm's forward untouched.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from .cache_internals import LayerCaches, write_index


@dataclass(frozen=True)
class FastDecode:
    """Which decode fast paths the engine may take.

    Attributes:
        no_mask: attention without a mask in steps where no row is left-padded.
        compile_mlp: every layer's MLP under ``mx.compile`` (where :func:`compilable`).
    """

    no_mask: bool
    compile_mlp: bool

    @classmethod
    def of(cls, fast_decode: bool | None, adapters: Any = None) -> "FastDecode":
        """From ``Scheduler(fast_decode=)``: ``None`` (default): no mask where it applies,
        MLPs not compiled (in the engine on an H200 they bought nothing: step ratios
        0.81-1.07 at B = 8-128, ``docs/gpu.md``); ``True``: both; ``False``: neither.
        Never compiled with per-row LoRA ``adapters`` (their layers read a row selection at
        call time).

        Raises:
            ValueError: ``fast_decode`` is not ``None``, ``True`` or ``False``.
        """
        if not (fast_decode is None or isinstance(fast_decode, bool)):
            raise ValueError(f"fast_decode must be None, True or False, got {fast_decode!r}")
        no_mask = fast_decode is None or bool(fast_decode)
        return cls(no_mask, bool(fast_decode) and adapters is None)


def unpadded(caches: LayerCaches | None, held: Sequence[int]) -> bool:
    """True when no row of ``caches`` is left-padded, so a one-token step's mask would
    attend every cached position of every row.

    Args:
        caches: per-layer batch caches over ``B`` rows (no free slots).
        held: ``[B]`` tokens each row's cache holds before the step (``context_tokens``).

    Returns:
        True only if every layer is a ``BatchKVCache`` (or a subclass that keeps its
        ``make_mask``) whose write index equals every row's ``held``: rotating (sliding
        window), recurrent and list caches return False (their masks carry more than
        padding).
    """
    if not caches or not held:
        return False
    width = set(held)
    if len(width) != 1:
        return False
    for c in caches:
        if not isinstance(c, BatchKVCache) or type(c).make_mask is not BatchKVCache.make_mask:
            return False
        if c.keys is None or write_index(c) != next(iter(width)):
            return False
    return True


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
    """True when every transformer block of ``model`` has an ``mlp`` module (mlx-lm's
    llama, qwen, gemma, mistral, phi3 blocks; not mixture-of-experts or recurrent ones)."""
    import mlx.nn as nn

    blocks = _blocks(model)
    return bool(blocks) and all(isinstance(getattr(b, "mlp", None), nn.Module) and type(b.mlp).__name__ == "MLP"
                                for b in blocks)


@contextlib.contextmanager
def compiled_mlps(model: Any) -> Iterator[None]:
    """Within the block, each block's ``mlp`` is its ``mx.compile``\\ d call (made once
    per MLP module and kept while the model lives: weights changed in place afterwards are
    not seen); restored after. Call only where :func:`compilable` holds.

    Mirrors nothing in mlx-lm (which compiles only the SiLU gate, ``swiglu``)."""
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


@contextlib.contextmanager
def decode_fast_path(model: Any, caches: LayerCaches, held: Sequence[int], paths: FastDecode) -> Iterator[str]:
    """Within the block, build a decode forward with whichever fast paths apply.

    Args:
        held: ``[B]`` tokens each row holds before the step (see :func:`unpadded`).
        paths: the paths allowed: :func:`without_mask` where :func:`unpadded` holds,
            :func:`compiled_mlps` where :func:`compilable` holds.

    Yields:
        Which paths are on: ``""``, ``"no mask"``, ``"compiled MLP"`` or both, joined by
        ``" + "``.
    """
    with contextlib.ExitStack() as stack:
        on = []
        if paths.no_mask and unpadded(caches, held):
            stack.enter_context(without_mask(caches))
            on.append("no mask")
        if paths.compile_mlp and compilable(model):
            stack.enter_context(compiled_mlps(model))
            on.append("compiled MLP")
        yield " + ".join(on)
