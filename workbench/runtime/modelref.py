"""Naming a model by value, so worker processes can load it; and the compute stand-in
for simulated replays.

Knows: :func:`workbench.load`, mlx-lm's llama architecture. Must not know: scheduling.

A :class:`ModelRef` is picklable (a path and a flag), unlike a loaded model; a sweep
sends refs to its workers, and each process loads a ref once (:meth:`ModelRef.load` is
cached per process).

The *stand-in* (``ModelRef(path, standin=True)``) keeps the tokenizer of ``path`` but
replaces the model by a one-layer llama with hidden size 16 and all weights zero (so it
always generates token 0). It has the same cache family as the bundled tiny-llama
(full attention, mlx-lm ``BatchKVCache``), so the scheduler's geometry (rows, left
padding, KV width) is real, while each forward costs a few percent of the bundled
model's. Simulated replays use it with a :class:`~workbench.sim.costmodel.CostModel`
advancing the clock and ``stop_ids=[]`` (output lengths come from the workload). Its KV
bytes are the stand-in's, not the costed model's: compare KV use in tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_map

from .loading import RANDOM_MODEL, load

STANDIN_HIDDEN = 16


def standin_model(vocab_size: int, context_tokens: int = 2048) -> Any:
    """A one-layer llama (hidden 16, one KV head) with zero weights, evaluated.

    Args:
        vocab_size: rows of its output (match the tokenizer of the workload's prompts).
        context_tokens: its ``max_position_embeddings``.
    """
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=STANDIN_HIDDEN,
        num_hidden_layers=1,
        intermediate_size=2 * STANDIN_HIDDEN,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=STANDIN_HIDDEN,
        rms_norm_eps=1e-5,
        vocab_size=int(vocab_size),
        max_position_embeddings=int(context_tokens),
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    model = llama.Model(args)
    model.update(tree_map(mx.zeros_like, model.parameters()))
    mx.eval(model.parameters())
    return model


@dataclass(frozen=True)
class ModelRef:
    """A model by value: an mlx-lm path or repo id, optionally swapped for the stand-in.

    Attributes:
        path: what :func:`workbench.load` takes (default: the bundled tiny-llama).
        standin: use :func:`standin_model` (with ``path``'s tokenizer and context).
    """

    path: str = str(RANDOM_MODEL)  # the model the bundled cost model was calibrated on
    standin: bool = False

    def load(self) -> tuple[Any, Any]:
        """``(model, tokenizer)``, loaded once per process per ref."""
        return _load(str(self.path), self.standin)

    @property
    def label(self) -> str:
        """Short name for tables: the folder name, marked when it is the stand-in."""
        return f"{Path(self.path).name}{' (stand-in)' if self.standin else ''}"


@functools.lru_cache(maxsize=4)
def _load(path: str, standin: bool) -> tuple[Any, Any]:
    model, tokenizer = load(path)
    if not standin:
        return model, tokenizer
    args = getattr(model, "args", None)
    vocab = getattr(args, "vocab_size", None) or len(tokenizer.get_vocab())
    return standin_model(vocab, getattr(args, "max_position_embeddings", None) or 2048), tokenizer
