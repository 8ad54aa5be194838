"""Benchmark models: random-weight mlx-lm llamas with a real small-LLM shape, built in
memory from a fixed seed (never written to disk, never committed).

Knows: mlx-lm's llama ``ModelArgs`` / ``Model`` and its parameter tree. Must not know:
schedulers, timing.

Speed does not depend on the weights' values, only on the shapes, so a random-weight model
of a real shape (hidden size, layers, GQA heads, a 32k vocabulary) measures what a trained
model of that shape would cost. ``FULL`` is a TinyLlama-like shape scaled to this
project's 2-core CPU; ``QUICK`` is tiny, for the CI smoke run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import llama


@dataclass(frozen=True)
class ModelShape:
    """An mlx-lm llama configuration (the fields of its ``config.json``)."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False

    @classmethod
    def from_proportions(
        cls,
        name: str,
        hidden_size: int,
        num_hidden_layers: int,
        num_attention_heads: int,
        vocab_size: int,
        mlp_ratio: float = 2.75,
        gqa: int = 4,
        tie_word_embeddings: bool = False,
    ) -> ModelShape:
        """The shape of this width, depth, query heads and vocabulary, the rest in
        proportion (TinyLlama's and Llama-3's): ``intermediate_size = mlp_ratio *
        hidden_size``, ``num_key_value_heads = num_attention_heads / gqa`` (query heads per
        KV head), ``head_dim = hidden_size / num_attention_heads``.

        Raises:
            ValueError: a size that does not divide (heads into ``hidden_size``, ``gqa``
                into heads) or an ``intermediate_size`` that is not whole.

        >>> ModelShape.from_proportions("tiny", 256, 4, 8, 4096).intermediate_size
        704
        """
        mlp = mlp_ratio * hidden_size
        if hidden_size % num_attention_heads or num_attention_heads % gqa or mlp != int(mlp):
            raise ValueError(
                f"{name}: num_attention_heads={num_attention_heads} must divide hidden_size={hidden_size}, "
                f"gqa={gqa} must divide num_attention_heads, mlp_ratio={mlp_ratio} x hidden_size must be whole"
            )
        return cls(
            name,
            hidden_size,
            num_hidden_layers,
            int(mlp),
            num_attention_heads,
            num_attention_heads // gqa,
            hidden_size // num_attention_heads,
            vocab_size,
            tie_word_embeddings=tie_word_embeddings,
        )

    def config(self) -> dict[str, Any]:
        """The mlx-lm config dict (``model_type: llama``)."""
        fields = {k: v for k, v in asdict(self).items() if k != "name"}
        return {"model_type": "llama", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, **fields}

    def describe(self) -> str:
        """One line: hidden, layers, heads (query/KV), head dim, MLP, vocabulary, context."""
        return (
            f"{self.name}: llama, hidden {self.hidden_size}, {self.num_hidden_layers} layers, "
            f"{self.num_attention_heads} query / {self.num_key_value_heads} KV heads (GQA) of dim "
            f"{self.head_dim}, MLP {self.intermediate_size}, vocab {self.vocab_size}, "
            f"context {self.max_position_embeddings}"
        )


# TinyLlama-1.1B's proportions (GQA 4:1, SwiGLU MLP 2.75x, 32k vocab, untied head) at
# half its width and about a third of its depth: ~155M parameters. Each: name, hidden size,
# layers, query heads, vocabulary.
FULL = ModelShape.from_proportions("llama-155m", 1024, 8, 16, 32000)
QUICK = ModelShape.from_proportions("llama-tiny", 256, 4, 8, 4096)


def make_model(shape: ModelShape, seed: int = 0, dtype: mx.Dtype = mx.float32) -> Any:
    """A random-weight llama of ``shape`` (mlx-lm's own initialisation under
    ``mx.random.seed(seed)``), cast to ``dtype`` and evaluated."""
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(shape.config()))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def parameter_count(model: Any) -> int:
    """Number of parameters (embedding and output head included). A quantized layer (an
    mlx ``QuantizedLinear`` / ``QuantizedEmbedding``: packed ``uint32`` weight, with
    ``scales`` and ``biases``) counts the weights it packs, ``32 / bits`` per ``uint32``,
    and not its scales and biases, so a quantized model counts as its float form."""
    bits = {name: m.bits for name, m in model.named_modules() if isinstance(getattr(m, "bits", None), int)}
    total = 0
    for key, v in tree_flatten(model.parameters()):
        owner, leaf = key.rsplit(".", 1) if "." in key else ("", key)
        if owner not in bits:
            total += int(v.size)
        elif leaf == "weight":
            total += int(v.size) * 32 // bits[owner]
    return total


def decode_weights(model: Any) -> list[mx.array]:
    """The parameters one decode step reads whole: all but an untied input embedding
    (of which a step gathers only ``B`` rows)."""
    tied = getattr(getattr(model, "args", None), "tie_word_embeddings", True)
    return [v for k, v in tree_flatten(model.parameters()) if tied or not k.endswith("embed_tokens.weight")]


def decode_weight_bytes(model: Any) -> int:
    """Bytes one decode step reads from the weights (see :func:`decode_weights`)."""
    return sum(int(v.nbytes) for v in decode_weights(model))


def decode_weight_params(model: Any) -> int:
    """Parameters one decode step multiplies each row by (2 flops each per row)."""
    return sum(int(v.size) for v in decode_weights(model))
