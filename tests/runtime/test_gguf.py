"""The GGUF → mlx-lm conversion on small hand-built GGUF files (no download): names,
quantization, config, tokenizer, and the written folder loading in mlx-lm."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from workbench.runtime import gguf

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
# A tiny byte-level vocabulary: 3 control tokens, then bytes as GPT-2 spells them, one merge.
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LETTERS = ["a", "b", "c", "Ġ", "1", "2", "ab"]
TOKENS = SPECIAL + LETTERS
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def tiny_metadata(**overrides):
    meta = {
        "general.architecture": "llama",
        "llama.embedding_length": mx.array(HIDDEN, dtype=mx.uint32),
        "llama.block_count": mx.array(LAYERS, dtype=mx.uint32),
        "llama.feed_forward_length": mx.array(FFN, dtype=mx.uint32),
        "llama.attention.head_count": mx.array(HEADS, dtype=mx.uint32),
        "llama.attention.head_count_kv": mx.array(KV_HEADS, dtype=mx.uint32),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        "llama.context_length": mx.array(256, dtype=mx.uint32),
        "llama.rope.freq_base": mx.array(100000.0, dtype=mx.float32),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": TOKENS,
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.token_type": mx.array([3, 3, 3] + [1] * len(LETTERS), dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
        "tokenizer.ggml.padding_token_id": mx.array(2, dtype=mx.uint32),
        "tokenizer.ggml.add_bos_token": mx.array(False),
        "tokenizer.chat_template": TEMPLATE,
    }
    meta.update(overrides)
    return meta


def tiny_weights(seed=0):
    """float32 tensors under GGUF names, shapes [out, in] as GGUF (and MLX) store them."""
    rng = np.random.default_rng(seed)
    w = lambda *shape: mx.array(rng.normal(0, 0.05, shape).astype(np.float32))  # noqa: E731
    head_dim = HIDDEN // HEADS
    out = {"token_embd.weight": w(len(TOKENS), HIDDEN), "output_norm.weight": mx.ones((HIDDEN,))}
    for i in range(LAYERS):
        out |= {
            f"blk.{i}.attn_q.weight": w(HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_k.weight": w(KV_HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_v.weight": w(KV_HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_output.weight": w(HIDDEN, HEADS * head_dim),
            f"blk.{i}.ffn_gate.weight": w(FFN, HIDDEN),
            f"blk.{i}.ffn_up.weight": w(FFN, HIDDEN),
            f"blk.{i}.ffn_down.weight": w(HIDDEN, FFN),
            f"blk.{i}.attn_norm.weight": mx.ones((HIDDEN,)),
            f"blk.{i}.ffn_norm.weight": mx.ones((HIDDEN,)),
        }
    return out


@pytest.mark.parametrize(
    "name, expected",
    [
        ("blk.3.attn_q.scales", "model.layers.3.self_attn.q_proj.scales"),
        ("blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"),
        ("blk.12.ffn_down.biases", "model.layers.12.mlp.down_proj.biases"),
        ("blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"),
        ("blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"),
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.scales", "lm_head.scales"),
    ],
)
def test_gguf_tensor_names_map_to_mlx_lm_llama_names(name, expected):
    assert gguf.gguf_name_to_mlx(name) == expected


@pytest.mark.parametrize(
    "name", ["blk.0.attn_qkv.weight", "token_embd", "blk.x.attn_q.weight", "output.norm.weight"]
)
def test_a_tensor_outside_the_llama_map_is_refused_by_name(name):
    with pytest.raises(ValueError, match="unknown GGUF tensor name"):
        gguf.gguf_name_to_mlx(name)


def test_quantization_is_read_from_packed_shapes_with_per_module_exceptions():
    def q(out, inp, bits):  # what mx.load gives for a GGUF Q4_1 / Q8_0 tensor
        return {
            "weight": mx.zeros((out, inp * bits // 32), dtype=mx.uint32),
            "scales": mx.zeros((out, inp // 32), dtype=mx.float16),
        }

    weights = {}
    for module, bits in [("a.q_proj", 4), ("a.k_proj", 4), ("model.embed_tokens", 8)]:
        weights |= {f"{module}.{k}": v for k, v in q(96, 576, bits).items()}
    weights["model.norm.weight"] = mx.ones((576,))
    assert gguf.quantization_of(weights) == {
        "group_size": 32,
        "bits": 4,
        "model.embed_tokens": {"group_size": 32, "bits": 8},
    }
    assert gguf.quantization_of({"model.norm.weight": mx.ones((4,))}) is None


def test_config_carries_the_llama_shape_rope_traditional_and_tied_embedding():
    weights = gguf.rename_weights(tiny_weights())
    config = gguf.config_from_metadata(tiny_metadata(), weights)
    assert config["model_type"] == "llama"
    assert (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["intermediate_size"],
    ) == (HIDDEN, LAYERS, HEADS, KV_HEADS, FFN)
    assert config["rope_traditional"] is True and config["tie_word_embeddings"] is True
    assert config["rms_norm_eps"] == 1e-5 and config["rope_theta"] == 100000.0
    assert config["vocab_size"] == len(TOKENS) and config["head_dim"] == HIDDEN // HEADS
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert "quantization" not in config  # float tensors: nothing quantized
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    assert gguf.config_from_metadata(tiny_metadata(), weights)["tie_word_embeddings"] is False


def test_a_non_llama_gguf_is_refused():
    with pytest.raises(ValueError, match="only llama GGUF files.*'qwen2'"):
        gguf.config_from_metadata(tiny_metadata(**{"general.architecture": "qwen2"}), {})


def test_tokenizer_keeps_special_tokens_whole_splits_digits_and_round_trips():
    tok = gguf.tokenizer_from_metadata(tiny_metadata())
    ids = tok.encode("<|im_start|>ab 12<|im_end|>").ids
    # special tokens whole; "ab" by its merge; " " is Ġ; digits one by one (smollm pre-tokenizer)
    assert ids == [1, TOKENS.index("ab"), TOKENS.index("Ġ"), TOKENS.index("1"), TOKENS.index("2"), 2]
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>ab 12<|im_end|>"
    with pytest.raises(ValueError, match="not supported"):
        gguf.tokenizer_from_metadata(tiny_metadata(**{"tokenizer.ggml.pre": "qwen2"}))
    with pytest.raises(ValueError, match="byte-level BPE"):
        gguf.tokenizer_from_metadata(tiny_metadata(**{"tokenizer.ggml.model": "llama"}))


def test_converted_folder_loads_in_mlx_lm_with_its_chat_template_and_records_its_source(tmp_path):
    source = tmp_path / "tiny.gguf"
    weights = tiny_weights()
    mx.save_gguf(str(source), weights, tiny_metadata())
    out = gguf.convert_gguf(source, tmp_path / "model")
    record = json.loads((out / "conversion.json").read_text())
    assert record["source"] == "tiny.gguf" and record["conversion_version"] == gguf.CONVERSION_VERSION
    assert record["sha256"] == gguf.sha256_of(source) and len(record["sha256"]) == 64
    assert record["bytes"] == source.stat().st_size
    model, tokenizer = mlx_lm.load(str(out))
    assert model.args.rope_traditional is True and len(model.layers) == LAYERS
    np.testing.assert_array_equal(
        np.array(model.model.layers[1].mlp.down_proj.weight), np.array(weights["blk.1.ffn_down.weight"])
    )
    assert tokenizer.eos_token_ids == {2} and tokenizer.bos_token == "<|im_start|>"
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "ab"}])
    assert ids[:1] == [1] and TOKENS.index("ab") in ids and 2 in ids
    logits = model(mx.array([ids]))
    assert logits.shape == (1, len(ids), len(TOKENS))


def test_a_missing_gguf_file_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gguf.convert_gguf(tmp_path / "nope.gguf", tmp_path / "out")
