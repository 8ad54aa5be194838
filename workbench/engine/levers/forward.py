"""The one place a forward's levers are installed, from its description.

Knows: the levers that act during a forward (LoRA adapters, the batch-invariant mode, the
quantized cache's attention path, the decode fast paths) and the
:class:`~workbench.engine.forward.Forward` they read. Must not know: requests' lives, the
queue, which layout built the forward.

Each runner site and the packed layout's launch describe their forward once and enter
:meth:`ForwardLevers.applied`; no site stacks the levers' context managers by hand, so a lever
added here reaches every forward. Which lever reads which field:

- adapters: :attr:`Forward.adapters` per row (:func:`~workbench.engine.levers.lora.selected`),
  or per token for a packed forward (:attr:`ForwardLevers.select_tokens`, over
  :attr:`Forward.uids` and :attr:`Forward.n_tokens`);
- the batch-invariant mode: :attr:`Forward.held` for a padded join, decode or verify
  (:func:`~workbench.engine.levers.invariant.invariant_forward`); a packed forward's
  projections (:func:`~workbench.engine.levers.invariant_packed.packed_invariant_forward`); a
  padded prefill chunk never (its groups run the mode's fixed chunks themselves);
- the quantized attention path: every padded forward
  (:func:`~workbench.engine.levers.quantized_attention.attention_path`); a packed forward's
  pages attend by themselves (set when the pools are made);
- the decode fast paths: a padded decode with its caches given, over :attr:`Forward.held`
  (:func:`~workbench.engine.levers.fastpath.decode_fast_path`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..forward import DECODE, PACKED, PREFILL, Forward
from .fastpath import FastDecode, decode_fast_path
from .invariant import Invariance, invariant_forward
from .invariant_packed import packed_invariant_forward
from .lora import AdapterBank, selected
from .quantized_attention import attention_path


class _Span(NamedTuple):
    """A segment as the packed per-token adapter selection reads a chunk."""

    uid: int
    n_tokens: int


@dataclass(frozen=True)
class ForwardLevers:
    """Every lever a scheduler configured for its forwards, installed by :meth:`applied`.

    Args:
        model: the mlx-lm model instance (hooks are set on it alone).
        adapters: the LoRA bank (``None``: none loaded).
        invariant: the batch-invariant mode (``None``: off).
        quantized_attention: the quantized cache's attention path (``"dequantize"``,
            ``"quantized_matmul"``; ``None``: a float cache, or pages that attend by
            themselves).
        fast_decode: the decode fast paths allowed (``None``: none).
        select_tokens: the packed layout's per-token adapter selection,
            ``(bank, chunks, adapter_of)`` -> a context manager
            (:func:`workbench.engine.packed.adapters.selected_tokens`; handed in, as the
            levers never import the packed layout); needed for a packed forward with adapters.
    """

    model: Any
    adapters: AdapterBank | None = None
    invariant: Invariance | None = None
    quantized_attention: str | None = None
    fast_decode: FastDecode | None = None
    select_tokens: Callable[..., Any] | None = None

    @contextlib.contextmanager
    def applied(self, forward: Forward, caches: Any = None) -> Iterator[str]:
        """Within the block, a forward built on :attr:`model` runs as ``forward`` describes
        with every configured lever (see the module docstring); restored after, also on an
        exception. Enter it only around building the forward's graph.

        Args:
            forward: the forward's description.
            caches: a padded decode's batch caches, for the decode fast paths.

        Yields:
            The decode fast paths on (``""`` where none, or not a decode):
            :func:`~workbench.engine.levers.fastpath.decode_fast_path`'s names.

        Raises:
            ValueError: a packed forward with adapters and no :attr:`select_tokens`.
        """
        with contextlib.ExitStack() as stack:
            if forward.kind == PACKED:
                if self.adapters is not None and self.select_tokens is None:
                    raise ValueError(
                        "select_tokens: a packed forward with adapters needs the per-token selection"
                    )
                if self.adapters is not None:
                    spans = [_Span(u, n) for u, n in zip(forward.uids, forward.n_tokens)]
                    adapter_of = dict(zip(forward.uids, forward.adapters))
                    stack.enter_context(self.select_tokens(self.adapters, spans, adapter_of))
                stack.enter_context(packed_invariant_forward(self.model, self.invariant))
                yield ""
                return
            stack.enter_context(selected(self.adapters, forward.adapters))
            if forward.kind != PREFILL:
                stack.enter_context(invariant_forward(self.model, self.invariant, forward.held))
            stack.enter_context(attention_path(self.model, self.quantized_attention))
            path = ""
            if forward.kind == DECODE and caches is not None and self.fast_decode is not None:
                path = stack.enter_context(
                    decode_fast_path(self.model, caches, forward.held, self.fast_decode)
                )
            yield path
