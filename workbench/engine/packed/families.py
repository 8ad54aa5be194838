"""Which models and settings the packed layout admits, refused at construction with why.

Knows: mlx-lm's model modules (which file defines a model's ``Attention``) and the
settings that shape caches. Must not know: requests, the queue.

Admitted: models of ``mlx_lm.models.llama`` with full attention in every layer (the
bundled tiny-code and tiny-llama, SmolLM2): their ``Attention`` calls
``rope(x, offset=cache.offset)`` with a RoPE that takes an offset array, then
``cache.update_and_fetch`` and ``scaled_dot_product_attention(..., mask=)``, and the model
ends in ``model.norm`` before its LM head, which the packed forward relies on.

The design admits more (the same call pattern in qwen2, qwen3, mistral, gemma: a family
joins once the solo oracle passes on it); refused now: every other family (not checked
under per-token positions), sliding-window layers (a ring, not pages), recurrent layers
(a state per request, not pages), and these settings: ``max_kv_size``, and a ``prompt_cache``
other than an int (the packed layout caches pages: ``prompt_cache=N`` turns on prefix caching,
keeping at most ``N`` unreferenced pages; an mlx-lm ``LRUPromptCache`` holds whole mlx-lm caches,
not pages); prefix caching with ``kv_bits`` or LoRA ``adapters``; ``kv_bits`` with
``max_num_batched_tokens`` below ``prefill_step_size`` (a row's first forward, on float keys, is
not split); and three-way runs not verified yet: ``speculative`` or ``batch_invariant`` with
``kv_bits`` or ``adapters``, and ``speculative`` with ``batch_invariant``.
"""

from __future__ import annotations

from typing import Any

ADMITTED_MODULES = ("mlx_lm.models.llama",)


def check_model(model: Any) -> None:
    """Refuse a model the packed layout does not run (a wrapper's ``__wrapped__`` model is
    checked).

    Raises:
        ValueError: naming the model's module and why (not a checked family, or a
            sliding-window layer).
    """
    while hasattr(model, "__wrapped__"):  # a wrapper that runs the model unchanged (a cost clock's)
        model = model.__wrapped__
    module = type(model).__module__
    if module not in ADMITTED_MODULES:
        raise ValueError(
            f"layout='packed' runs the llama family ({', '.join(ADMITTED_MODULES)}); this model is "
            f"{module}: its attention is not checked with per-token RoPE positions and paged "
            "caches (use layout='padded')"
        )
    kinds = set(getattr(model.model, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ValueError(
            f"layout='packed' pages full-attention layers only; this model has layer types "
            f"{sorted(kinds)} (a sliding window keeps a ring, not pages; use layout='padded')"
        )


def check_settings(config: Any, prompt_cache: Any = None, adapters: Any = None) -> None:
    """Refuse settings the packed layout does not combine with.

    Raises:
        ValueError: naming the first such setting and why.
    """
    caching = prompt_cache is not None and _pages(prompt_cache)  # prefix caching
    quantized = config.kv_bits is not None
    refused = [
        (
            "kv_bits with prefix caching",
            quantized and caching,
            "a cached prefix changes which forward runs on float keys, as the padded layout's "
            "kv_bits with prompt_cache",
        ),
        (
            f"kv_bits with max_num_batched_tokens={config.token_budget}",
            quantized and config.token_budget < config.prefill_step_size,
            f"a row's first forward runs on float keys over min(prefill_step_size, prompt - 1) tokens "
            f"(mlx-lm's generate_step) and is not split: max_num_batched_tokens must be >= "
            f"prefill_step_size ({config.prefill_step_size})",
        ),
        ("max_kv_size", config.max_kv_size is not None, "a rotating window is not paged"),
        (
            "adapters with prefix caching",
            adapters is not None and caching,
            "cached pages are keyed by tokens alone, and a page's KV depends on the adapter that wrote it",
        ),
        (
            "speculative with batch_invariant",
            config.speculative is not None and config.batch_invariant,
            "packed + speculative and packed + batch_invariant each run, but the packed verify forward "
            "is not run under the mode's per-token path",
        ),
        (
            "prompt_cache",
            prompt_cache is not None and not _pages(prompt_cache),
            "its prompt cache is pages: prompt_cache=N (an int >= 0, the most unreferenced pages kept "
            f"cached), not {type(prompt_cache).__name__} {prompt_cache!r} (an mlx-lm LRUPromptCache holds "
            "mlx-lm caches, not pages)",
        ),
    ]
    for name, bad, why in refused:
        if bad:
            raise ValueError(f"layout='packed' does not take {name}: {why} (use layout='padded')")
    _refuse_three_way(config, adapters)


def _refuse_three_way(config: Any, adapters: Any) -> None:
    """Refuse speculative decoding or the batch-invariant mode beside ``kv_bits`` or adapters in
    the packed layout: each pair composes, these three-way runs are not verified.

    Raises:
        ValueError: naming the lever, the other setting and what the lever's path lacks.
    """
    levers = (
        ("speculative", config.speculative is not None, "the packed verify forward"),
        ("batch_invariant", config.batch_invariant, "the mode's per-token path"),
    )
    others = (
        ("kv_bits", config.kv_bits is not None, "does not read quantized pages"),
        ("adapters", adapters is not None, "does not pick an adapter per token"),
    )
    for lever, on, path in levers:
        for other, there, lacks in others:
            if on and there:
                raise ValueError(
                    f"layout='packed' with {lever} does not take {other} yet: {path} {lacks} "
                    f"(packed + {lever} and packed + {other} each run, alone: use layout='padded', or drop one)"
                )


def _pages(prompt_cache: Any) -> bool:
    """Whether ``prompt_cache`` is a packed prompt cache's size: an int ``>= 0`` (pages)."""
    return isinstance(prompt_cache, int) and not isinstance(prompt_cache, bool) and prompt_cache >= 0
