"""GGUF → mlx-lm model folder: a llama GGUF file converted to what ``mlx_lm.load`` opens.

Knows: GGUF's llama tensor names and metadata keys, mlx-lm's llama names, config keys
and tokenizer files. Must not know: anything about batching, where models are cached
(``runtime/models.py``), or how the file was fetched.

Glossary and shapes (``O`` output features, ``I`` input features, ``G`` group size, ``b``
bits; for SmolLM2-135M: hidden 576, 30 layers, 9 heads, 3 KV heads, vocab 49,152):

- ``mx.load(path, return_metadata=True)`` reads the GGUF. A Q4_0 / Q4_1 / Q8_0 tensor
  comes back as MLX affine quantization: ``NAME.weight`` packed ``uint32 [O, I * b / 32]``,
  ``NAME.scales`` and ``NAME.biases`` ``float16 [O, I / G]`` with ``G = 32``. Other
  tensors (the RMSNorm weights) come back unquantized, ``float32 [hidden]``.
  Those three arrays are exactly what an ``mlx.nn.QuantizedLinear`` holds, so the
  converted model is an mlx-lm quantized model (``quantization: {group_size, bits}``).
- GGUF stores a llama's Q and K rows in the interleaved rotary layout (llama.cpp permutes
  them when it converts from Hugging Face), so the config says ``rope_traditional: true``
  instead of un-permuting packed 4-bit rows.
- Without an ``output`` tensor the embedding is tied (``tie_word_embeddings: true``).

Tensor names (``N`` the layer index):

    token_embd          → model.embed_tokens          output_norm   → model.norm
    output              → lm_head
    blk.N.attn_q        → model.layers.N.self_attn.q_proj       (k, v: k_proj, v_proj)
    blk.N.attn_output   → model.layers.N.self_attn.o_proj
    blk.N.ffn_gate      → model.layers.N.mlp.gate_proj          (up, down: up_proj, down_proj)
    blk.N.attn_norm     → model.layers.N.input_layernorm
    blk.N.ffn_norm      → model.layers.N.post_attention_layernorm

The tokenizer (``tokenizer.ggml.model == "gpt2"``: byte-level BPE with its tokens, merges
and token types) is rebuilt with the ``tokenizers`` package; the chat template and the
BOS / EOS / pad tokens go into ``tokenizer_config.json``. The folder also gets
``conversion.json``: the source file's name, its sha256, its size and
``CONVERSION_VERSION``.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import mlx.core as mx

# Bump when the written folder changes, so a cached conversion can be told apart.
CONVERSION_VERSION = 1

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GGUF_NAME = re.compile(r"^(?:blk\.(\d+)\.)?([a-z_]+)\.(weight|scales|biases|bias)$")
# GGUF token types (llama.cpp's llama_token_type): 3 = control, 4 = user-defined.
_SPECIAL_TOKEN_TYPES = (3, 4)


def _scalar(meta: dict[str, Any], key: str) -> Any:
    """One metadata value as a Python scalar (GGUF numbers come back as 0-d ``mx.array``)."""
    if key not in meta:
        raise ValueError(f"GGUF metadata has no {key!r}")
    value = meta[key]
    return value.item() if isinstance(value, mx.array) else value


def gguf_name_to_mlx(name: str) -> str:
    """Rename one GGUF tensor to mlx-lm's llama name.

    ``"blk.3.attn_q.scales"`` → ``"model.layers.3.self_attn.q_proj.scales"``;
    ``"token_embd.weight"`` → ``"model.embed_tokens.weight"``. The suffix (``weight``,
    ``scales``, ``biases``, ``bias``) is kept. Mirrors the name map of llama.cpp's
    ``convert_hf_to_gguf.py`` read backwards (mlx-lm's ``models/llama.py`` names).

    Raises:
        ValueError: for a name outside the llama map (the name is in the message).
    """
    match = _GGUF_NAME.match(name)
    if match is None:
        raise ValueError(f"unknown GGUF tensor name {name!r}")
    layer, base, suffix = match.groups()
    if layer is not None and base in _LAYER_NAMES:
        return f"model.layers.{layer}.{_LAYER_NAMES[base]}.{suffix}"
    if layer is None and base in _TOP_NAMES:
        return f"{_TOP_NAMES[base]}.{suffix}"
    raise ValueError(f"unknown GGUF tensor name {name!r}")


def rename_weights(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """All tensors of a llama GGUF under mlx-lm's names (arrays unchanged, not copied).

    Raises:
        ValueError: for a tensor outside the llama map.
    """
    return {gguf_name_to_mlx(name): array for name, array in weights.items()}


def quantization_of(weights: dict[str, mx.array]) -> dict[str, Any] | None:
    """mlx-lm's ``quantization`` entry for renamed weights, from the arrays' shapes.

    For every quantized tensor (one with ``.scales``): ``G = I / scales.shape[-1]`` and
    ``b = 32 * packed.shape[-1] / I`` where ``I = G * scales.shape[-1]``; the group size is
    the one GGUF's block formats use, 32. Returns ``{"group_size": G, "bits": b}`` when every
    quantized tensor agrees (the model-wide setting mlx-lm reads), with a per-module
    ``{"group_size", "bits"}`` entry for each one that differs; ``None`` when nothing is
    quantized.
    """
    group_size = 32
    per_module: dict[str, int] = {}
    for name, scales in weights.items():
        if not name.endswith(".scales"):
            continue
        module = name[: -len(".scales")]
        in_features = scales.shape[-1] * group_size
        per_module[module] = weights[f"{module}.weight"].shape[-1] * 32 // in_features
    if not per_module:
        return None
    bits = max(set(per_module.values()), key=list(per_module.values()).count)
    quantization: dict[str, Any] = {"group_size": group_size, "bits": bits}
    for module, module_bits in sorted(per_module.items()):
        if module_bits != bits:
            quantization[module] = {"group_size": group_size, "bits": module_bits}
    return quantization


def config_from_metadata(meta: dict[str, Any], weights: dict[str, mx.array]) -> dict[str, Any]:
    """mlx-lm's ``config.json`` for a llama GGUF (``general.architecture == "llama"``).

    ``weights`` are the renamed tensors (for the quantization and the tied embedding).
    Keys mirror Hugging Face's ``LlamaConfig`` as mlx-lm's ``models/llama.ModelArgs`` reads
    them; ``rope_traditional`` is ``True`` (GGUF's interleaved Q/K rows).

    Raises:
        ValueError: for another architecture or a missing metadata key.
    """
    arch = _scalar(meta, "general.architecture")
    if arch != "llama":
        raise ValueError(f"only llama GGUF files are converted, this one is {arch!r}")
    hidden = int(_scalar(meta, "llama.embedding_length"))
    n_heads = int(_scalar(meta, "llama.attention.head_count"))
    vocab = meta.get("tokenizer.ggml.tokens")
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": int(_scalar(meta, "llama.block_count")),
        "intermediate_size": int(_scalar(meta, "llama.feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(_scalar(meta, "llama.attention.head_count_kv")),
        "head_dim": int(meta["llama.rope.dimension_count"].item())
        if "llama.rope.dimension_count" in meta
        else hidden // n_heads,
        "rms_norm_eps": float(f"{_scalar(meta, 'llama.attention.layer_norm_rms_epsilon'):.7g}"),
        "vocab_size": int(meta["llama.vocab_size"].item())
        if "llama.vocab_size" in meta
        else len(vocab or ()),
        "max_position_embeddings": int(_scalar(meta, "llama.context_length")),
        "rope_theta": float(_scalar(meta, "llama.rope.freq_base")),
        "rope_traditional": True,
        "tie_word_embeddings": "lm_head.weight" not in weights,
        "bos_token_id": int(_scalar(meta, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_scalar(meta, "tokenizer.ggml.eos_token_id")),
    }
    quantization = quantization_of(weights)
    if quantization is not None:
        config["quantization"] = quantization
        config["quantization_config"] = quantization
    return config


def tokenizer_from_metadata(meta: dict[str, Any]) -> Any:
    """A ``tokenizers.Tokenizer`` rebuilt from a GGUF's ``tokenizer.ggml.*`` metadata.

    Byte-level BPE (``tokenizer.ggml.model == "gpt2"``): vocabulary = ``tokens`` in id
    order, ``merges`` as ``"a b"`` pairs, ByteLevel decoder. The pre-tokenizer follows
    ``tokenizer.ggml.pre`` as llama.cpp does: ``"smollm"`` splits every digit, then the
    GPT-2 byte-level regex; ``"gpt2"`` / ``"default"`` the regex only. Tokens of type
    control / user-defined are added as special tokens (never split, never normalized).
    Mirrors what ``transformers``' ``GGUFTokenizerSkeleton`` / ``GGUFGPTConverter`` build.

    Raises:
        ValueError: for another tokenizer model or pre-tokenizer.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = _scalar(meta, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"only byte-level BPE ('gpt2') GGUF tokenizers are converted, not {kind!r}")
    pre = meta.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("gpt2", "default"):
        pre_tokenizer = byte_level
    else:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported (smollm, gpt2, default)")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    types = meta["tokenizer.ggml.token_type"].tolist()
    special = [tokens[i] for i, t in enumerate(types) if t in _SPECIAL_TOKEN_TYPES]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tokenizer


def tokenizer_config_from_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """``tokenizer_config.json``: chat template, BOS / EOS / pad / unk tokens, context length.

    ``model_max_length`` is the model's context (``llama.context_length``), so
    ``transformers`` does not warn about prompts longer than a default 512.
    ``add_bos_token`` follows ``tokenizer.ggml.add_bos_token`` (False for SmolLM2).
    """
    tokens = meta["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        return tokens[int(meta[key].item())] if key in meta else None

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(meta["tokenizer.ggml.add_bos_token"].item())
        if "tokenizer.ggml.add_bos_token" in meta
        else False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_scalar(meta, "llama.context_length")),
    }
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config


def sha256_of(path: str | Path, progress: Any = None) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks; ``progress.update(n_bytes)`` if given."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            if progress is not None:
                progress.update(len(block))
    return digest.hexdigest()


def convert_gguf(
    gguf_path: str | Path, out_dir: str | Path, *, source: str | None = None, sha256: str | None = None
) -> Path:
    """Convert a llama GGUF file into an mlx-lm model folder; returns ``out_dir``.

    Writes ``config.json`` (:func:`config_from_metadata`), ``model.safetensors`` (the
    tensors renamed by :func:`rename_weights`, quantized ones kept packed),
    ``tokenizer.json`` (:func:`tokenizer_from_metadata`), ``tokenizer_config.json``
    (:func:`tokenizer_config_from_metadata`) and ``conversion.json`` (``source``: where the
    file came from, default its name; ``sha256``: computed unless given; ``bytes``;
    ``conversion_version``). The result opens with ``mlx_lm.load(out_dir)``; the whole
    conversion mirrors ``mlx_lm.convert`` for a Hugging Face folder, with GGUF as input.

    Raises:
        ValueError: for a non-llama GGUF, an unknown tensor name or tokenizer model.
        FileNotFoundError: when ``gguf_path`` does not exist.
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file {str(gguf_path)!r} does not exist")
    weights, meta = mx.load(str(gguf_path), return_metadata=True)
    weights = rename_weights(weights)
    config = config_from_metadata(meta, weights)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer_from_metadata(meta).save(str(out_dir / "tokenizer.json"))
    tok_config = tokenizer_config_from_metadata(meta)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    record = {
        "source": source or gguf_path.name,
        "sha256": sha256 or sha256_of(gguf_path),
        "bytes": gguf_path.stat().st_size,
        "conversion_version": CONVERSION_VERSION,
        "converted_by": "workbench.runtime.gguf.convert_gguf",
    }
    (out_dir / "conversion.json").write_text(json.dumps(record, indent=2) + "\n")
    return out_dir
