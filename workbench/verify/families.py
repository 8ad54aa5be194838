"""Every model family mlx-lm ships, tried in the workbench: does it batch (oracle-checked),
run in the serial lane, or is it refused — and why. ``workbench families`` writes the
table (``docs/families.md``); nothing in it is typed by hand.

Knows: ``mlx_lm.models`` (each module's ``ModelArgs`` / ``Model``), the scheduler's
public calls, the solo oracle. Must not know: views.

Each architecture is built as a random 2-layer instance from one small base config
(:data:`BASE_CONFIG`, passed through mlx-lm's ``ModelArgs.from_dict``, which keeps the
fields the architecture knows), plus the few fields some architectures name their own way
(:data:`ARCHITECTURE_CONFIG`: phixtral's ``model_dim``, gemma4's nested ``text_config`` and
per-layer embeddings). An architecture whose ``ModelArgs`` needs fields the base
config does not have is listed as "not built" with the error: it is untested, not
refused. A built one is given to a ``Scheduler`` (which refuses cache types that cannot
batch and probes batching, :mod:`workbench.engine.probe`); two greedy requests of 3 and
7 tokens run batched and are compared with each run alone through mlx-lm.

The walk is deterministic and bounded: each architecture's random weights come from
``mx.random.seed`` of a fixed :data:`SEED` set just before it is built, and one whose
config still asks for more than :data:`MAX_PARAMETER_BYTES` of weights (deepseek_v41's
fixed expert sizes) is listed as "not built" with its size before a byte of it is
allocated (MLX builds parameters lazily). MLX's buffer cache is cleared after each.
"""

from __future__ import annotations

import copy
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import pandas as pd
from mlx.utils import tree_flatten

# One small size per kind (units: features, layers, heads, tokens), under every name the
# architectures give it; BASE_CONFIG holds each name with its kind's size.
BASE_SIZES = dict(width=64, layers=2, mlp=128, heads=4, kv_heads=2, context=512, norm_eps=1e-5)
SIZE_NAMES = {
    "width": ("hidden_size", "n_embd", "d_model", "dim"),
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "mlp": ("intermediate_size", "n_inner", "hidden_dim", "ffn_dim"),
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "context": ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"),
    "norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps"),
}
BASE_CONFIG = {name: BASE_SIZES[kind] for kind, names in SIZE_NAMES.items() for name in names} | dict(
    vocab_size=256, head_dim=16, rope_theta=10000.0, tie_word_embeddings=True, sliding_window=8
)
# Small values for fields an architecture names its own way (defaults of gigabytes otherwise)
_GEMMA4_TEXT = dict(
    num_kv_shared_layers=0,
    vocab_size_per_layer_input=256,
    hidden_size_per_layer_input=16,
    global_head_dim=16,
    sliding_window_pattern=2,
)
ARCHITECTURE_CONFIG = {
    "gemma4_text": _GEMMA4_TEXT,
    "gemma4": dict(text_config=dict(BASE_CONFIG, **_GEMMA4_TEXT)),  # its text model's config, nested
    "phixtral": dict(num_vocab=256, model_dim=64, rotary_dim=8),
}
COLUMNS = ["architecture", "result", "detail"]
SEED = 0  # mx.random.seed before each architecture is built: the same weights on every run
MAX_PARAMETER_BYTES = 256 << 20  # an architecture asking for more is not built (see the module docstring)
SKIPPED_MODULES = ("base", "cache", "rope_utils", "switch_layers", "activations", "pipeline")


class ByteTokenizer:
    """The smallest tokenizer the scheduler needs for id prompts: no EOS, ids as text."""

    eos_token_ids: set = set()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Bytes of ``text`` as ids ``[0, 256)``."""
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        """Ids as space-separated numbers."""
        return " ".join(map(str, ids))

    def get_vocab(self) -> dict[str, int]:
        """256 byte ids."""
        return {str(i): i for i in range(256)}


def config_for(name: str) -> dict[str, Any]:
    """The config architecture ``name`` is built from: :data:`BASE_CONFIG` with its
    :data:`ARCHITECTURE_CONFIG` fields (a fresh copy: mlx-lm may change nested dicts)."""
    return copy.deepcopy(dict(BASE_CONFIG, **ARCHITECTURE_CONFIG.get(name, {}), model_type=name))


def build(name: str, config: dict[str, Any] | None = None) -> Any:
    """A random 2-layer instance of mlx-lm's architecture ``name`` from ``config``
    (default :func:`config_for`).

    Raises:
        MemoryError: the architecture's weights would take more than :data:`MAX_PARAMETER_BYTES`
            (raised before they are allocated).
        Exception: whatever mlx-lm raises for a config it cannot build from."""
    module = importlib.import_module(f"mlx_lm.models.{name}")
    mx.random.seed(SEED)
    model = module.Model(module.ModelArgs.from_dict(config_for(name) if config is None else config))
    nbytes = sum(p.nbytes for _, p in tree_flatten(model.parameters()))  # lazy arrays: nothing allocated yet
    if nbytes > MAX_PARAMETER_BYTES:
        raise MemoryError(
            f"the base config still builds {nbytes / 2**20:,.0f} MiB of weights "
            f"(limit {MAX_PARAMETER_BYTES >> 20} MiB)"
        )
    mx.eval(model.parameters())
    model(mx.array([[1, 2, 3]]))  # one forward: built for real
    return model


def try_family(name: str) -> tuple[str, str]:
    """``(result, detail)`` for architecture ``name`` (see the module docstring)."""
    from ..engine.request import Request
    from ..engine.scheduler import Scheduler
    from . import oracle

    try:
        model = build(name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001  some modules exit or raise at import without extras
        return "not built", f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    try:
        sched = Scheduler(model, ByteTokenizer(), max_batch=2, history_size=0)
    except ValueError as exc:
        return "refused", str(exc).splitlines()[0][:160]
    except Exception as exc:  # noqa: BLE001  the engine could not even size this model's caches
        return "fails", f"Scheduler(): {type(exc).__name__}: {str(exc)[:120]}"
    for prompt in ([5, 6, 7], [9, 10, 11, 12, 13, 14, 15]):
        sched.submit(Request(prompt=prompt, max_tokens=4, stop_ids=[]))
    try:
        sched.run()
        check = oracle.solo_check(model, sched, atol=1e-3)
    except Exception as exc:  # noqa: BLE001  reported in the table, not hidden
        return "fails", f"{type(exc).__name__}: {str(exc)[:120]}"
    lane = "serial lane" if sched.serial_reason else "batches"
    detail = (
        sched.serial_reason or f"2 rows of 3 and 7 tokens, {sum(r.match for r in check.rows)}/2 match solo"
    )
    return (lane if check.ok else "differs from solo"), detail


def architectures() -> list[str]:
    """Names of ``mlx_lm.models``' architecture modules, sorted (helpers in
    :data:`SKIPPED_MODULES` and subpackages left out)."""
    import mlx_lm.models as models

    return sorted(
        info.name
        for info in pkgutil.iter_modules(models.__path__)
        if not info.ispkg and info.name not in SKIPPED_MODULES
    )


def walk_families(
    names: list[str] | None = None, progress: Callable[[str], None] | None = None
) -> pd.DataFrame:
    """One row per architecture module of ``mlx_lm.models`` (or of ``names``) with ``COLUMNS``.

    Args:
        names: architecture module names (default :func:`architectures`).
        progress: called with each name before it is tried (``workbench families``' progress bar).
    """
    rows = []
    for name in architectures() if names is None else names:
        if progress is not None:
            progress(name)
        try:
            module = importlib.import_module(f"mlx_lm.models.{name}")
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001  some modules exit at import without their extras
            rows.append((name, "not built", f"import: {type(exc).__name__}"))
            continue
        if hasattr(module, "Model") and hasattr(module, "ModelArgs"):
            rows.append((name, *try_family(name)))
        mx.clear_cache()  # the raised buffer-cache limit would keep this architecture's freed buffers
    return pd.DataFrame(rows, columns=COLUMNS)


def families_markdown(table: pd.DataFrame, versions: str) -> str:
    """``docs/families.md``: counts per result, then the table."""
    counts = table.result.value_counts()
    lines = [
        "# Model families: batched, serial lane, or refused",
        "",
        f"Written by `workbench families --out docs` ({versions}); see `workbench/verify/families.py` for how each "
        'architecture is built and checked. "not built" means the walk\'s small base config did not fit '
        "that architecture's config: it is untested, not refused.",
        "",
        ", ".join(f"{k}: {v}" for k, v in counts.items()),
        "",
        "| architecture | result | detail |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {r.architecture} | {r.result} | {r.detail.replace('|', '/')} |" for r in table.itertuples()]
    return "\n".join(lines) + "\n"
