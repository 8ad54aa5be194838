"""Shared by the model-making scripts: the stdlib location, the byte-level BPE tokenizer,
and the mlx-lm model folder format.

Knows: how a folder must look for ``mlx_lm.load(folder)`` (and ``transformers``) to load
it offline: ``config.json``, ``model.safetensors``, ``tokenizer.json`` and
``tokenizer_config.json`` naming ``EOS``. Must not know: how the weights were made
(random in ``make_tiny_models.py``, trained in ``train_tiny.py``).
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterable
from pathlib import Path

import workbench  # noqa: F401  first: it loads an optimized BLAS before mlx (workbench/runtime/blas.py)

import mlx.core as mx
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"


def stdlib_dir() -> Path:
    """This interpreter's standard-library folder (``sysconfig.get_paths()["stdlib"]``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` tokens trained on ``texts``, ``EOS`` as id 0.

    Deterministic for the same texts in the same order.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def write_model_folder(out: Path, config: dict, weights: dict[str, mx.array], tok: Tokenizer) -> int:
    """Write ``config``, ``weights`` (name -> array, saved as given) and ``tok`` into
    ``out`` in mlx-lm's format; returns the parameter count (elements of ``weights``).

    ``config["max_position_embeddings"]`` becomes the tokenizer's ``model_max_length``.
    """
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok.save(str(out / "tokenizer.json"))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "bos_token": None,
        "unk_token": None,
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    return sum(v.size for v in weights.values())
