"""Loading models: a thin door to ``mlx_lm.load``.

Knows: where the bundled models live. Must not know: anything about batching.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx_lm

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
# The default: a small llama trained on CPython's stdlib (scripts/train_tiny.py).
BUNDLED_MODEL = DATA_DIR / "models" / "tiny-code"
# Random weights, same architecture family: for tests of mechanics on another shape.
RANDOM_MODEL = DATA_DIR / "models" / "tiny-llama"


def load(path_or_repo: str | Path = BUNDLED_MODEL) -> tuple[Any, Any]:
    """Load an mlx-lm model and its tokenizer.

    Mirrors ``mlx_lm.load``: ``path_or_repo`` is a local folder in mlx-lm's format
    (config.json, safetensors weights, tokenizer files) or a Hugging Face repo id, which
    mlx-lm downloads (this needs network access). Defaults to the bundled trained
    model, ``tiny-code``.

    Returns:
        ``(model, tokenizer)``: an ``mlx.nn.Module`` and an mlx-lm ``TokenizerWrapper``.

    Raises:
        FileNotFoundError: for a local-looking path (absolute, or starting with ``.``) that
            does not exist; mlx-lm's own errors for an unknown repo id or architecture.
    """
    path = Path(path_or_repo)
    looks_local = path.is_absolute() or str(path_or_repo).startswith((".", "~"))
    if looks_local and not path.expanduser().exists():
        raise FileNotFoundError(f"model path {str(path_or_repo)!r} does not exist")
    target = str(path.expanduser()) if path.expanduser().exists() else str(path_or_repo)
    return mlx_lm.load(target)
