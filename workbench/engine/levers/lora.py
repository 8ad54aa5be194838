"""Per-request LoRA adapters in one batch: *available*, *loaded*, *selected*.

- **available**: an adapter folder on disk that fits the model (:func:`available_adapters`).
- **loaded**: ``Scheduler(adapters={name: path})`` checks each mlx-lm adapter folder
  (``adapter_config.json`` + ``adapters.safetensors``) against the model (:func:`read_adapter`)
  and stacks their LoRA matrices per target layer into one :class:`AdapterBank`.
- **selected**: ``Request(adapter=name)`` picks one per request (``None``: the base model).

Each targeted ``Linear`` is wrapped once by a :class:`RowLoRALinear` (weights unchanged); the
runner sets each row's adapter per forward with :func:`selected`, and the wrapper adds mlx-lm's
``LoRALinear`` term per row (``docs/adapters.md``)::

    y[b] = linear(x[b]) + scale[i_b] * ((x[b] @ A[i_b]) @ B[i_b])      i_b = index of row b's adapter

    x [B, L, I] @ A[idx] [B, I, R] -> [B, L, R] @ B[idx] [B, R, O] -> [B, L, O]

Slot 0 of every stack is the base model (zeros: bit for bit the base model); ranks are
zero-padded to ``R``. Axis letters: ``B`` rows, ``L`` tokens per row, ``I`` / ``O`` a Linear's
input / output features, ``r`` one adapter's rank, ``R`` the largest, ``N`` loaded adapters.
Notes: ``docs/lab/engine-notes.md``, "levers/lora.py".
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

FILES = ("adapter_config.json", "adapters.safetensors")


class Selection:
    """Each row's adapter for the forward being built; one per model, shared by its wrappers, set
    only while :func:`selected` is active: ``rows`` ``[B]`` int32 slots, ``scale`` ``[B, 1, 1]``
    float32; ``per_token``: ``rows`` ``[T]`` for a packed ``[1, T, I]`` forward."""

    def __init__(self) -> None:
        self.bank: AdapterBank | None = None
        self.rows: mx.array | None = None
        self.scale: mx.array | None = None
        self.per_token = False


class RowLoRALinear(nn.Module):
    """A ``Linear`` (or ``QuantizedLinear``) plus a per-row LoRA delta: mlx-lm's
    ``LoRALinear.__call__`` with each row's own ``A``, ``B`` and ``scale``.

    Args:
        linear: the model's layer (kept as is, at ``.linear`` like mlx-lm's ``LoRALinear``).
        path: its dotted name (``model.layers.0.self_attn.q_proj``), its stacks' key.
        selection: the model's shared :class:`Selection`.
    """

    def __init__(self, linear: nn.Module, path: str, selection: Selection):
        super().__init__()
        self.linear = linear
        self.path = path
        self.selection = selection

    def __call__(self, x: mx.array) -> mx.array:
        """``x`` ``[B, L, I]`` -> ``[B, L, O]``: ``linear(x)`` plus the selected rows' LoRA term.

        Raises:
            RuntimeError: when the selection has another row count than ``x`` (a runner bug).
        """
        y = self.linear(x)
        sel = self.selection
        stacks = None if sel.rows is None else sel.bank.layers.get(self.path)
        if stacks is None:
            return y
        a, b = stacks  # [N+1, I, R], [N+1, R, O]
        rows = sel.rows  # [B] (per token: [T], each token a row of one: xs [T, 1, I])
        xs = x.reshape(-1, 1, x.shape[-1]) if sel.per_token else x.reshape(x.shape[0], -1, x.shape[-1])
        if rows.shape[0] != xs.shape[0]:
            raise RuntimeError(
                f"{self.path}: adapter selection has {rows.shape[0]} rows, the forward {xs.shape[0]}"
            )
        delta = sel.scale * ((xs @ a[rows]) @ b[rows])  # [B, L, R] -> [B, L, O]
        if delta.dtype != x.dtype:
            delta = delta.astype(x.dtype)
        return y + (delta if x.ndim == 3 and not sel.per_token else delta.reshape(y.shape))


@dataclass(frozen=True)
class Adapter:
    """One adapter folder read and checked against a model (:func:`read_adapter`).

    Attributes:
        name, path: as given. rank: ``r``. scale: mlx-lm's ``lora_parameters.scale``.
        layers: target layer path -> ``(A [I, r], B [r, O])`` (empty once stacked into an
            :class:`AdapterBank`, which then holds the only copy).
        file_bytes: size of ``adapters.safetensors`` (bytes).
        targets: the target layer paths, sorted.
    """

    name: str
    path: str
    rank: int
    scale: float
    layers: Mapping[str, tuple[mx.array, mx.array]]
    file_bytes: int
    targets: tuple[str, ...] = ()


def _linear_dims(module: nn.Module) -> tuple[int, int] | None:
    """``(I, O)`` of a ``Linear`` / ``QuantizedLinear``, else ``None``."""
    if isinstance(module, RowLoRALinear):
        module = module.linear
    if not isinstance(module, (nn.Linear, nn.QuantizedLinear)):
        return None
    out_dims, in_dims = module.weight.shape
    if isinstance(module, nn.QuantizedLinear):
        in_dims = in_dims * 32 // module.bits
    return in_dims, out_dims


def _read_config(name: str, folder: Path) -> tuple[int, float]:
    """``(rank, scale)`` from ``adapter_config.json``. Raises ValueError naming the field."""
    where = f"adapter {name!r} ({folder})"
    missing = [f for f in FILES if not (folder / f).is_file()]
    if missing:
        raise ValueError(f"{where}: missing {missing}; an mlx-lm adapter folder holds {list(FILES)}")
    try:
        config = json.loads((folder / FILES[0]).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: adapter_config.json is not JSON ({exc})") from None
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise ValueError(f"{where}: fine_tune_type is {kind!r}; only 'lora' adapters can be selected per row")
    lora = config.get("lora_parameters")
    if not isinstance(lora, dict):
        raise ValueError(f"{where}: adapter_config.json has no lora_parameters mapping")
    rank, scale = lora.get("rank"), lora.get("scale")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"{where}: lora_parameters.rank must be an int >= 1, got {rank!r}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise ValueError(f"{where}: lora_parameters.scale must be a number, got {scale!r}")
    return rank, float(scale)


def _check_pair(where: str, path: str, a: mx.array, b: mx.array, dims: tuple[int, int], rank: int) -> None:
    """``A [I, r]`` and ``B [r, O]`` fit a layer of ``dims = (I, O)`` and the config's rank."""
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{where}: {path}.lora_a / lora_b must be 2-D, got shapes {a.shape} and {b.shape}")
    if a.shape[1] != rank or b.shape[0] != rank:
        raise ValueError(
            f"{where}: lora_parameters.rank is {rank} but {path}.lora_a has shape {a.shape} "
            f"and lora_b {b.shape} (rank mismatch)"
        )
    if (a.shape[0], b.shape[1]) != dims:
        raise ValueError(
            f"{where}: {path}.lora_a {a.shape} / lora_b {b.shape} need a layer of {a.shape[0]} "
            f"inputs and {b.shape[1]} outputs, this model's has {dims[0]} and {dims[1]} "
            "(an adapter for another architecture)"
        )


def read_adapter(name: str, path: str | Path, model: nn.Module) -> Adapter:
    """Read one mlx-lm adapter folder and check it against ``model`` as mlx-lm's
    ``load_adapters`` does, without changing the model. ``name``: what ``Request(adapter=)`` selects.

    Returns:
        The :class:`Adapter` (matrices as stored, float32 for mlx-lm's trainer).

    Raises:
        ValueError: naming the adapter and the field: a missing file, ``fine_tune_type`` not
            ``lora``, a bad rank / scale, a tensor for no Linear of the model, unpaired or
            misshapen matrices.
    """
    folder = Path(path)
    where = f"adapter {name!r} ({folder})"
    rank, scale = _read_config(name, folder)
    weights = mx.load(str(folder / FILES[1]))
    modules = dict(model.named_modules())
    layers = {}
    for key in sorted(weights):
        layer, _, leaf = key.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            raise ValueError(f"{where}: tensor {key!r} is not a LoRA matrix (lora_a / lora_b)")
        if leaf == "lora_b":
            continue
        dims = _linear_dims(modules[layer]) if layer in modules else None
        if dims is None:
            what = (
                "a layer this model does not have"
                if layer not in modules
                else f"a {type(modules[layer]).__name__}"
            )
            raise ValueError(
                f"{where}: tensor {key!r} targets {what}, not a Linear (an adapter for another architecture)"
            )
        if f"{layer}.lora_b" not in weights:
            raise ValueError(f"{where}: tensor {key!r} has no {layer}.lora_b")
        _check_pair(where, layer, weights[key], weights[f"{layer}.lora_b"], dims, rank)
        layers[layer] = (weights[key], weights[f"{layer}.lora_b"])
    orphans = sorted(k for k in weights if k.endswith(".lora_b") and k[: -len(".lora_b")] not in layers)
    if orphans:
        raise ValueError(f"{where}: tensor {orphans[0]!r} has no matching lora_a")
    return Adapter(
        name, str(folder), rank, scale, layers, (folder / FILES[1]).stat().st_size, tuple(sorted(layers))
    )


@dataclass(frozen=True, repr=False)
class AdapterBank:
    """The loaded adapters of one scheduler, stacked per target layer.

    Attributes:
        names: the loaded adapters in load order; adapter ``names[i]`` is slot ``i + 1``.
        adapters: name -> :class:`Adapter` (its matrices released to the stacks).
        layers: layer path -> ``(A [N+1, I, R], B [N+1, R, O])``, slot 0 zeros.
        scales: ``[N+1]`` each slot's ``lora_parameters.scale`` (slot 0: ``0.0``).
        selection: the model's shared :class:`Selection`.
        nbytes: bytes the stacks hold (all layers; padding to ``R`` and slot 0 included).
    """

    names: tuple[str, ...]
    adapters: Mapping[str, Adapter]
    layers: Mapping[str, tuple[mx.array, mx.array]]
    scales: tuple[float, ...]
    selection: Selection
    nbytes: int

    def index(self, name: str | None) -> int:
        """Slot of ``name`` in the stacks (``None``, the base model: 0). Raises KeyError."""
        return 0 if name is None else self.names.index(name) + 1

    def check(self, name: Any) -> None:
        """Refuse a ``Request.adapter`` this bank cannot serve.

        Raises:
            ValueError: naming the field ``adapter`` and the loaded names.
        """
        if name is not None and name not in self.names:
            raise ValueError(
                f"adapter {name!r} is not loaded; this scheduler's adapters are {list(self.names)} "
                "(Scheduler(adapters={name: path})), or None for the base model"
            )

    def __repr__(self) -> str:
        parts = ", ".join(f"{n} (rank {a.rank}, {len(a.targets)} layers)" for n, a in self.adapters.items())
        return f"AdapterBank({parts}; {self.nbytes:,} bytes)"


def _selection_of(model: nn.Module) -> Selection:
    """The model's shared :class:`Selection` (that of its wrappers, or a new one)."""
    for _, module in model.named_modules():
        if isinstance(module, RowLoRALinear):
            return module.selection
    return Selection()


def wrap_layers(model: nn.Module, paths: Sequence[str]) -> Selection:
    """Wrap each Linear at ``paths`` in a :class:`RowLoRALinear` in place (mlx-lm's
    ``linear_to_lora_layers``); returns the model's :class:`Selection`."""
    selection = _selection_of(model)
    modules = dict(model.named_modules())
    new = [
        (p, RowLoRALinear(modules[p], p, selection))
        for p in paths
        if not isinstance(modules[p], RowLoRALinear)
    ]
    if new:
        model.update_modules(tree_unflatten(new))
    return selection


def _stack(adapters: Sequence[Adapter], path: str, rank: int) -> tuple[mx.array, mx.array]:
    """One layer's ``(A [N+1, I, R], B [N+1, R, O])``, zero where absent or padded."""
    a0, b0 = next(ad.layers[path] for ad in adapters if path in ad.layers)
    I, O = a0.shape[0], b0.shape[1]  # noqa: E741 (the module's axis letters: I in, O out)
    a_rows, b_rows = [mx.zeros((I, rank), a0.dtype)], [mx.zeros((rank, O), b0.dtype)]
    for ad in adapters:
        a, b = ad.layers.get(path, (mx.zeros((I, ad.rank), a0.dtype), mx.zeros((ad.rank, O), b0.dtype)))
        a_rows.append(mx.pad(a, [(0, 0), (0, rank - ad.rank)]))
        b_rows.append(mx.pad(b, [(0, rank - ad.rank), (0, 0)]))
    return mx.stack(a_rows), mx.stack(b_rows)


def load_adapters(
    model: nn.Module, adapters: Mapping[str, str | Path] | AdapterBank | None
) -> AdapterBank | None:
    """Load ``adapters`` (name -> folder) for per-row selection on ``model``.

    Every folder is checked before the model is wrapped, so a bad one changes nothing; an
    :class:`AdapterBank` is returned as is (a fork shares its parent's).

    Returns:
        The :class:`AdapterBank`, or ``None`` for ``None`` / ``{}``.

    Raises:
        ValueError: ``adapters`` not a mapping of str names to paths, or a bad folder
            (see :func:`read_adapter`).
    """
    if adapters is None or isinstance(adapters, AdapterBank):
        return adapters
    if not isinstance(adapters, Mapping) or not all(isinstance(n, str) and n for n in adapters):
        raise ValueError(f"adapters must be a mapping {{name (non-empty str): folder}}, got {adapters!r}")
    if not adapters:
        return None
    read = [read_adapter(n, p, model) for n, p in adapters.items()]
    paths = sorted({p for ad in read for p in ad.layers})
    selection = wrap_layers(model, paths)
    rank = max(ad.rank for ad in read)
    layers = {p: _stack(read, p, rank) for p in paths}
    mx.eval(layers)
    nbytes = sum(int(x.nbytes) for stacks in layers.values() for x in stacks)
    return AdapterBank(
        tuple(ad.name for ad in read),
        {ad.name: dataclasses.replace(ad, layers={}) for ad in read},
        layers,
        (0.0,) + tuple(ad.scale for ad in read),
        selection,
        nbytes,
    )


def configure(
    model: nn.Module, adapters: Mapping[str, str | Path] | AdapterBank | None
) -> AdapterBank | None:
    """The scheduler's adapters (:func:`load_adapters`; raises as it does)."""
    return load_adapters(model, adapters)


def check_request(bank: AdapterBank | None, name: str | None) -> None:
    """Refuse at ``submit`` an unloaded ``Request.adapter`` (ValueError naming it and the loaded)."""
    if name is None:
        return
    if bank is None:
        raise ValueError(
            f"adapter {name!r}: this scheduler loaded no adapters "
            "(build it with Scheduler(adapters={name: path}))"
        )
    bank.check(name)


def names_of(states: Sequence[Any]) -> list[str | None]:
    """Each request state's selected adapter (``state.valid.request.adapter``), in order."""
    return [s.valid.request.adapter for s in states]


@contextlib.contextmanager
def selected(bank: AdapterBank | None, names: Sequence[str | None]) -> Iterator[None]:
    """While active, the forward built on the bank's model runs row ``b`` with adapter
    ``names[b]`` (``None``: base); the graph captures it, so ``mx.async_eval`` needs nothing after."""
    if bank is None or all(n is None for n in names):
        yield
        return
    sel = bank.selection
    slots = [bank.index(n) for n in names]
    sel.bank, sel.rows = bank, mx.array(slots, dtype=mx.int32)
    sel.scale = mx.array([bank.scales[i] for i in slots], dtype=mx.float32)[:, None, None]  # [B, 1, 1]
    try:
        yield
    finally:
        sel.bank, sel.rows, sel.scale = None, None, None


def base_parameters(model: nn.Module) -> list[tuple[str, mx.array]]:
    """Every ``(name, array)`` of ``model`` named as in the unwrapped model (``...q_proj.linear.weight``
    -> ``...q_proj.weight``): the same whether or not a scheduler wrapped it."""
    wrapped = {path + ".linear." for path, m in model.named_modules() if isinstance(m, RowLoRALinear)}
    out = []
    for name, p in tree_flatten(model.parameters()):
        for prefix in wrapped:
            if name.startswith(prefix):
                name = prefix[: -len("linear.")] + name[len(prefix) :]
                break
        out.append((name, p))
    return out


def weights_digest(bank: AdapterBank | None) -> str | None:
    """A BLAKE2b digest of the loaded adapters' scales and weights, equal in any load order;
    ``None`` without adapters."""
    if bank is None:
        return None
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(bank.names):
        slot = bank.index(name)
        digest.update(f"{name}:{bank.scales[slot]!r}".encode())
        for path in sorted(bank.layers):
            for x in bank.layers[path]:
                row = x[slot]
                digest.update(f"{path}:{row.dtype}:{tuple(row.shape)}".encode())
                digest.update(memoryview(np.array(mx.view(row, mx.uint8))))
    return digest.hexdigest()


def snapshot_fields(bank: AdapterBank | None) -> dict[str, Any]:
    """The snapshot's ``adapters_loaded`` (names) and ``adapter_bytes`` (the bank's bytes)."""
    return {"adapters_loaded": bank.names if bank else (), "adapter_bytes": bank.nbytes if bank else 0}


@dataclass(frozen=True)
class Available:
    """An adapter folder: ``name``, ``path``, ``rank`` (0 if unfit), ``problem`` (``""`` or the
    :func:`read_adapter` error)."""

    name: str
    path: str
    rank: int
    problem: str


def available_adapters(folder: str | Path, model: nn.Module) -> list[Available]:
    """Every sub-folder of ``folder`` holding an mlx-lm adapter, checked against ``model``
    (nothing loaded), sorted by name."""
    out = []
    for sub in sorted(Path(folder).iterdir()):
        if not (sub / FILES[0]).is_file():
            continue
        try:
            out.append(Available(sub.name, str(sub), read_adapter(sub.name, sub, model).rank, ""))
        except ValueError as exc:
            out.append(Available(sub.name, str(sub), 0, str(exc)))
    return out
