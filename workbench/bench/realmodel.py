"""The benchmark's second shape: the real model, SmolLM2-135M-Instruct, with the 4-bit
weights it was converted with (``workbench models fetch smollm2-135m``).

Knows: the fetched-model folder (:mod:`workbench.runtime.models`), the decode scenario
(:func:`workbench.bench.scenarios.decode_runs`: alternating runs, the decode window).
Must not know: how results are printed, drawn or written (:mod:`workbench.bench.report`),
nor the run's sizes (:mod:`workbench.bench.run` passes them).

The random fp32 llama of :mod:`workbench.bench.model` measures a decode step made of
float32 matmuls through the BLAS. The real model's step is a different mix: 30 thin layers
(hidden 576) of MLX's quantized matmuls (4-bit weights packed in ``uint32``, ``float16``
scales and biases, groups of 32), which on CPU do not use the BLAS, plus a 49,152-token
output head tied to the (8-bit) embedding. Same engines, same prompts-of-equal-length runs, the model's
own tokenizer. Not fetched, the section is skipped and :func:`real_model_missing` says why
(the benchmark prints it and records it in ``meta.csv``); it never downloads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from ..runtime.models import resolve_name
from .model import parameter_count
from .scenarios import MLX_LM, WORKBENCH, decode_runs, engine_factories, equal_prompts

REAL_MODEL = "smollm2-135m"
REAL_ENGINES = (WORKBENCH, MLX_LM)


def real_model_missing(name: str = REAL_MODEL) -> str | None:
    """Why the real-model section cannot run (one line, with the command that fixes it),
    or ``None`` when ``name`` is fetched (or bundled)."""
    if resolve_name(name) is None:
        return (
            f"{name} is not fetched, so the real-model decode rows are skipped "
            f"(run `workbench models fetch {name}`, then the benchmark again)"
        )
    return None


def describe_weights(model: Any) -> str:
    """The weights' format in words: the first attention projection's (``"4-bit (groups of
    32)"`` for an mlx ``QuantizedLinear``, else its dtype, ``"float32"``), and the input
    embedding's when it is quantized at other bits (``", 8-bit embedding"``)."""
    proj = model.layers[0].self_attn.q_proj
    bits = getattr(proj, "bits", None)
    if not bits:
        return str(proj.weight.dtype).replace("mlx.core.", "")
    embed_bits = getattr(getattr(getattr(model, "model", None), "embed_tokens", None), "bits", bits)
    return f"{bits}-bit (groups of {proj.group_size})" + (
        f", {embed_bits}-bit embedding" if embed_bits != bits else ""
    )


def describe_model(name: str, model: Any) -> str:
    """One line: name, family, layers, hidden, heads (query/KV), vocabulary, weights."""
    a = model.args
    return (
        f"{name}: {a.model_type}, hidden {a.hidden_size}, {a.num_hidden_layers} layers, "
        f"{a.num_attention_heads} query / {a.num_key_value_heads} KV heads (GQA), MLP {a.intermediate_size}, "
        f"vocab {a.vocab_size}, weights {describe_weights(model)}"
    )


def real_decode_runs(
    batch_sizes: tuple[int, ...],
    prompt_tokens: int,
    decode_tokens: int,
    pairs: int,
    prefill_step_size: int,
    echo: Callable[[str], None] = print,
    name: str = REAL_MODEL,
    skip: str | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Decode throughput of the workbench and mlx-lm's ``BatchGenerator`` on the fetched
    real model, alternating, at each batch size: :func:`decode_runs` with the model's own
    tokenizer (prompts of exactly ``prompt_tokens`` tokens from the bundled prompt set).

    Args:
        batch_sizes: rows decoding at once (``B``), one set of runs each.
        prompt_tokens: every row's prompt length (tokens).
        decode_tokens: every row's ``max_tokens`` (greedy, no stop ids).
        pairs: measured runs per engine and ``B`` (after one warm-up run each).
        prefill_step_size: both engines' prompt chunk length (tokens).
        echo: progress lines.
        name: the fetched model (default ``smollm2-135m``).
        skip: a reason to skip the section even when the model is fetched.

    Returns:
        ``(runs, meta)``: ``runs`` has :func:`decode_runs`' columns (``engine``, ``B``,
        ``pair``, ``tok_per_s``, ``window_s`` in seconds, ``tokens``, ``step_s``,
        ``same_tokens``, ...), or no rows when the model is not fetched; ``meta`` has
        ``real_model`` (:func:`describe_model`) and ``real_parameters``, or
        ``real_model_skipped`` (``skip``, or :func:`real_model_missing`'s reason).
    """
    from ..runtime.loading import load

    missing = skip or real_model_missing(name)
    if missing is not None:
        echo(f"  skipped: {missing}")
        return pd.DataFrame(
            columns=[
                "engine",
                "B",
                "pair",
                "tok_per_s",
                "window_s",
                "tokens",
                "step_s",
                "snapshots",
                "history_read_s",
                "same_tokens",
            ]
        ), {"real_model_skipped": missing}
    model, tokenizer = load(name, dequantize=False)  # as converted: 4-bit weights
    meta = {"real_model": describe_model(name, model), "real_parameters": parameter_count(model)}
    echo(f"  model {meta['real_model']}")
    runs = pd.concat(
        [
            decode_runs(
                engine_factories(model, tokenizer, B, prefill_step_size, REAL_ENGINES),
                equal_prompts(tokenizer, B, prompt_tokens),
                decode_tokens,
                pairs,
                echo,
            )
            for B in batch_sizes
        ],
        ignore_index=True,
    )
    return runs, meta
