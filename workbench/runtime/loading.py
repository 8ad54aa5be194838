"""Loading models: a thin door to ``mlx_lm.load``, which also knows the models' names.

Knows: where the bundled models live, how a name resolves (a folder, a bundled or fetched
name, a Hugging Face repo id; :mod:`workbench.runtime.models`). Must not know: anything
about batching.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import mlx_lm

from . import memory  # noqa: F401  MLX's CPU buffer-cache limit, raised before the first model loads
from .models import BUNDLED_DIR, CATALOG, DATA_DIR, known_models_text, resolve_name

# The default: a small llama trained on CPython's stdlib (scripts/train_tiny.py).
BUNDLED_MODEL = BUNDLED_DIR / "tiny-code"
# Random weights, same architecture family: for tests of mechanics on another shape.
RANDOM_MODEL = BUNDLED_DIR / "tiny-llama"

__all__ = ["BUNDLED_MODEL", "DATA_DIR", "RANDOM_MODEL", "load", "resolve"]


def resolve(path_or_name: str | Path) -> str:
    """Where :func:`load` will read a model from: a folder path, or a repo id for mlx-lm.

    In order: an existing folder (``~`` expanded); a bundled name (``"tiny-gemma3"``,
    from any working folder); a fetched name (``"smollm2-135m"`` in the user cache folder,
    see :func:`workbench.runtime.models.models_dir`); otherwise the string itself, for
    mlx-lm to try as a Hugging Face repo id.

    Raises:
        FileNotFoundError: for a local-looking path (absolute, or starting with ``.`` or
            ``~``) that does not exist, and for a catalog name not fetched yet (the message
            says which command fetches it).
    """
    text = str(path_or_name)
    path = Path(text).expanduser()
    if path.exists():
        return str(path)
    if path.is_absolute() or text.startswith((".", "~")):
        raise FileNotFoundError(f"model path {text!r} does not exist")
    folder = resolve_name(text)
    if folder is not None:
        return str(folder)
    if text in CATALOG:
        raise FileNotFoundError(f"model {text!r} is not fetched yet: run `workbench models fetch {text}`")
    return text


def load(path_or_repo: str | Path = BUNDLED_MODEL, *, dequantize: bool | None = None) -> tuple[Any, Any]:
    """Load an mlx-lm model and its tokenizer.

    Mirrors ``mlx_lm.load``: ``path_or_repo`` is a local folder in mlx-lm's format
    (config.json, safetensors weights, tokenizer files), a bundled model's name
    (``"tiny-gemma3"``), a fetched model's name (``"smollm2-135m"``, after ``workbench
    models fetch``), or a Hugging Face repo id, which mlx-lm downloads (this needs network
    access). Defaults to the bundled trained model, ``tiny-code``.

    Args:
        dequantize: for a quantized model, replace every quantized layer by its float32
            dequantized form (``mlx_lm.utils.dequantize_model``, then ``set_dtype(float32)``).
            Same function, more memory (SmolLM2-135M: 98 MB → about 540 MB) and, on CPU,
            faster: MLX's quantized CPU matmul does not use the BLAS, float32 does.
            ``None`` (the default): dequantize where MLX's default device is the CPU, and
            say so in one line on stderr; keep the quantized layers on Metal and CUDA.
            ``False`` keeps them everywhere. A model without quantized layers is never
            changed.

    Returns:
        ``(model, tokenizer)``: an ``mlx.nn.Module`` and an mlx-lm ``TokenizerWrapper``.

    Raises:
        FileNotFoundError: for a local-looking path that does not exist, a catalog model
            not fetched yet, or a name that is neither a folder nor a reachable repo id
            (one line naming the bundled and fetched models, no network traceback);
            mlx-lm's own errors for an unknown architecture.
    """
    target = resolve(path_or_repo)
    if not Path(target).exists():
        from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

        try:
            model, tokenizer = mlx_lm.load(target)
        except (HFValidationError, HfHubHTTPError, LocalEntryNotFoundError, ConnectionError) as exc:
            raise FileNotFoundError(
                f"no model {target!r}: not a folder, not a bundled or fetched name, and not a "
                f"reachable Hugging Face repo id ({type(exc).__name__}). Known models: "
                f"{known_models_text()}"
            ) from None
    else:
        model, tokenizer = mlx_lm.load(target)
    if dequantize is False or not is_quantized(model):
        return model, tokenizer
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model

    if dequantize is None:
        if mx.default_device() != mx.cpu:
            return model, tokenizer
        print(
            f"workbench: {Path(str(path_or_repo)).name} has quantized layers: on the CPU they run dequantized "
            f"to float32, which is faster here (wb.load(..., dequantize=False) keeps them)",
            file=sys.stderr,
        )
    model = dequantize_model(model)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model, tokenizer


def is_quantized(model: Any) -> bool:
    """True when ``model`` has a quantized layer (mlx's ``QuantizedLinear`` /
    ``QuantizedEmbedding``: a module holding ``scales``), as ``mlx_lm.utils.dequantize_model``
    finds them."""
    return any(hasattr(module, "scales") for _, module in model.named_modules())
