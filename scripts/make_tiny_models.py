"""Make the bundled random-weight test models under ``data/models/``.

Deterministic: the tokenizer is a byte-level BPE trained with the ``tokenizers``
package on a fixed list of CPython standard-library files, and the weights come
from ``mx.random.seed(SEED)``. The output is mlx-lm's on-disk format
(``config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``), so ``mlx_lm.load(folder)`` loads it exactly like a
downloaded model.

Usage::

    python scripts/make_tiny_models.py            # writes every data/models/tiny-* model
    python scripts/make_tiny_models.py --only tiny-gemma3
    python scripts/make_tiny_models.py --out DIR  # somewhere else
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import workbench  # noqa: F401  first: it loads an optimized BLAS before mlx (workbench/runtime/blas.py)
from model_folder import stdlib_dir, train_bpe, write_model_folder

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import gemma3_text, llama, mamba2, qwen3, qwen3_next
from tokenizers import Tokenizer

SEED = 0
VOCAB_SIZE = 1024
# Fixed, long-lived stdlib modules: the tokenizer corpus.
CORPUS_FILES = [
    "textwrap.py",
    "string.py",
    "heapq.py",
    "bisect.py",
    "fractions.py",
    "functools.py",
    "dataclasses.py",
    "argparse.py",
    "json/decoder.py",
    "json/encoder.py",
    "collections/__init__.py",
    "statistics.py",
]

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "intermediate_size": 344,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-5,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


# One small random-weight model per cache family, for the family tests (windows of 8
# tokens so the ring buffers wrap inside the tests). All share the tiny-llama tokenizer.
# The attention of the family models: width 64, MLP 128, 4 query and 2 KV heads of 16 dims.
FAMILY_ATTENTION = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 2048,
    "torch_dtype": "float32",
}
TINY_GEMMA3 = {  # sliding window (BatchRotatingKVCache) + global attention (BatchKVCache)
    **FAMILY_ATTENTION,
    "model_type": "gemma3_text",
    "num_hidden_layers": 4,
    "query_pre_attn_scalar": 16,
    "sliding_window": 8,
    "sliding_window_pattern": 2,
}
TINY_QWEN3_NEXT = {  # gated-delta linear attention (ArraysCache) + full attention (BatchKVCache)
    **FAMILY_ATTENTION,
    "model_type": "qwen3_next",
    "num_hidden_layers": 4,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "shared_expert_intermediate_size": 64,
    "mlp_only_layers": [],
    "moe_intermediate_size": 32,
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.25,
    "full_attention_interval": 2,
    "tie_word_embeddings": False,
}
TINY_MAMBA2 = {  # pure SSM (ArraysCache: conv state + SSM state)
    "model_type": "mamba2",
    "num_heads": 8,
    "head_dim": 16,
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "state_size": 16,
    "num_hidden_layers": 3,
    "layer_norm_epsilon": 1e-5,
    "conv_kernel": 4,
    "n_groups": 1,
    "use_bias": False,
    "use_conv_bias": True,
    "tie_word_embeddings": False,
    "time_step_limit": [0.0, 1e9],
    "time_step_rank": "auto",
    "max_position_embeddings": 2048,
    "torch_dtype": "float32",
}
TINY_QWEN3 = {  # full attention, no make_cache: mlx-lm's max_kv_size gives it rotating caches
    **FAMILY_ATTENTION,
    "model_type": "qwen3",
    "num_hidden_layers": 3,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
FAMILIES = {
    "tiny-llama": (llama, TINY_LLAMA),
    "tiny-gemma3": (gemma3_text, TINY_GEMMA3),
    "tiny-qwen3-next": (qwen3_next, TINY_QWEN3_NEXT),
    "tiny-mamba2": (mamba2, TINY_MAMBA2),
    "tiny-qwen3": (qwen3, TINY_QWEN3),
}


def corpus_texts() -> list[str]:
    """The tokenizer's training texts: the fixed stdlib files, read in order."""
    return [(stdlib_dir() / name).read_text(encoding="utf-8") for name in CORPUS_FILES]


def train_tokenizer() -> Tokenizer:
    """A byte-level BPE of ``VOCAB_SIZE`` tokens with ``EOS`` as id 0."""
    return train_bpe(corpus_texts(), VOCAB_SIZE)


def write_model(out: Path, arch, config: dict, tok: Tokenizer) -> None:
    """Write random weights of mlx-lm module ``arch`` for ``config`` plus the tokenizer."""
    mx.random.seed(SEED)
    model = arch.Model(arch.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    n_params = write_model_folder(out, config, dict(tree_flatten(model.parameters())), tok)
    (out / "README.md").write_text(
        f"# {out.name}\n\nRandom weights (seed {SEED}) of mlx-lm's `{config['model_type']}` "
        f"architecture, {n_params:,} parameters, float32; a byte-level BPE tokenizer of "
        f"{VOCAB_SIZE} tokens trained on {len(CORPUS_FILES)} CPython {platform.python_version()} "
        "standard-library files. Made by `python scripts/make_tiny_models.py`; for tests of "
        "the engine's mechanics, not for legible text.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parent.parent
    parser.add_argument("--out", type=Path, default=here / "data" / "models")
    parser.add_argument("--only", nargs="*", choices=sorted(FAMILIES), help="models to write (default: all)")
    args = parser.parse_args()
    tok = train_tokenizer()
    for name in args.only or FAMILIES:
        arch, config = FAMILIES[name]
        write_model(args.out / name, arch, config, tok)
        print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
