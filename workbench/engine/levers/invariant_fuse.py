"""The batch-invariant mode's fused projections: sibling projections that read one input
(mlx-lm's ``q_proj`` / ``k_proj`` / ``v_proj`` and ``gate_proj`` / ``up_proj``) run as one
matmul over their weights concatenated along the output axis (``docs/batch-invariance.md``,
"Cost", the eighteenth session).

Why: on CUDA a decode step is host-bound and every matmul the mode launches costs the host
time (an ``M >= 2`` launch about 13 us more than the default path's ``M = 1`` kernel); a
16-layer llama runs 113 projections a step unfused, 65 fused. On the CPU, OpenBLAS's sweep can
give a small sibling a kernel switch a few rows above one (llama-155m's ``[256, 1024]`` ``k_proj``
at 4 rows), where the fused weight runs one call of up to 32 rows unpadded. The fused kernel has another
``N`` than each sibling's, so a row's bits differ from the unfused mode's, but alone and
batched alike: every forward of the mode on a model runs the same fused projections.

Knows: MLX's ``nn.Linear`` / ``nn.QuantizedLinear`` arrays (``weight``, ``scales``,
``biases``, ``bias``) and the projection hook (:mod:`workbench.engine.model_hooks`). Must not
know: row blocks (:mod:`.invariant` calibrates the fused layer like any projection).

Groups are found, not named: one probe forward of the model over one token, built and never
evaluated (no compute), records which projections each input array is passed to; siblings
(direct children of one parent) called with the same array, of one kind (``nn.Linear`` with
the same bias presence and dtype, or ``nn.QuantizedLinear`` with the same bits, group size and
mode) and the same input features, are a group. A projection wrapped by an adapter
(:class:`~workbench.engine.levers.lora.RowLoRALinear`) has the wrapper as its parent and no
sibling, so it stays alone; a model without groups runs as before.

Memory: none extra. The group's arrays are concatenated once (``[N_1 + N_2 + ..., K]``) and
each member's arrays are rebound to its rows of them (a view: contiguous rows of one buffer),
so the model holds each weight once; the default path computes over the same values in the
same layout (measured bit-equal: ``tests/engine/test_invariant_fuse.py``).

Axis letters: ``K`` input features, ``N`` output features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..model_hooks import HOOKS, hooked_class_of, hooks_of

# Where the mode fuses. The CPU since 2026-12-07: on llama-155m with OpenBLAS its fused q / k / v
# runs in the sweep's blocks where k / v alone ran 1-3 rows a call, and the step at B = 1 / 8 / 32
# went from 1.04x / 1.07x / 1.15x to 1.05x / 1.05x / 1.09x the default path's (two runs,
# ``scripts/lab/invariant_fuse_ab.py --device cpu --shape full``; docs/batch-invariance.md).
FUSE_BACKENDS = ("cpu", "cuda", "metal")
FUSED = "_workbench_fused"  # a parent's attribute: member names -> its FusedGroup (kept across schedulers)
ARRAYS = (
    "weight",
    "scales",
    "biases",
    "bias",
)  # a projection's arrays, each [N, ...] (concatenated on axis 0)


@dataclass(eq=False)
class FusedGroup:
    """Sibling projections computed as one.

    Attributes:
        module: an ``nn.Linear`` / ``nn.QuantizedLinear`` (not in the model, not hooked)
            holding the members' arrays concatenated: ``weight`` ``[N_1 + ... + N_n, K]``.
        members: the sibling projections, in the fused output's order.
        bounds: ``[n]`` each member's output columns ``(start, stop)`` in the fused output.
        views: ``[n]`` each member's arrays as rebound (rows of ``module``'s arrays).
    """

    module: Any
    members: tuple
    bounds: tuple
    views: tuple

    def intact(self) -> bool:
        """Whether every member still holds the rows it was given (not reloaded since). Raises nothing."""
        return all(m.get(k) is v for m, arrays in zip(self.members, self.views) for k, v in arrays.items())

    def __call__(self, x: mx.array) -> mx.array:
        """``x`` ``[..., K]`` -> ``[..., N_1 + ... + N_n]``: the fused projection, as MLX computes it."""
        return self.module(x)  # not in the model, so not hooked


def _kind(m: Any) -> tuple | None:
    """What must agree for siblings to share one kernel: class, dtype, bias, quantization,
    input features (``None``: not a fusable projection)."""
    cls = hooked_class_of(m)
    if cls not in (nn.Linear, nn.QuantizedLinear) or HOOKS not in m.__dict__:
        return None  # a subclass with its own call, or not hooked (the hook is the fusing seam)
    w = m["weight"]
    if cls is nn.QuantizedLinear:
        quant = (
            m.bits,
            m.group_size,
            getattr(m, "mode", "affine"),
            m["scales"].dtype,
            m.get("biases") is not None,
        )
        K = w.shape[1] * 32 // m.bits
    else:
        quant, K = (), w.shape[1]
    return (cls.__name__, str(w.dtype), "bias" in m, K) + quant


def sibling_groups(model: Any) -> list[tuple[Any, tuple[str, ...]]]:
    """``(parent, member names)`` of each group of sibling projections of ``model`` that read
    one input (module docstring), found by one probe forward over one token (a graph built,
    not evaluated). A projection in two groups stays in its first only. A model the probe
    cannot call with one token alone (``model(tokens [1, 1])``) has none.

    No mlx-lm counterpart (mlx-lm never fuses a model's projections). Raises nothing: a
    probe forward that fails finds no groups."""
    hooks = hooks_of(model, projections=True)
    inputs: dict[int, list] = {}  # id(x) -> the modules called with x, in call order
    held: list = []  # the inputs, so that no id is reused during the probe

    def record(module: Any, plain: Any, x: mx.array) -> mx.array:
        held.append(x)
        calls = inputs.setdefault(id(x), [])
        if all(m is not module for m in calls):
            calls.append(module)
        return plain(module, x)

    try:
        with hooks.using(projections=record):
            model(mx.array([[0]], dtype=mx.int32))
    except Exception:  # noqa: BLE001  a model that needs more than tokens (a probe, not a forward)
        return []
    parent_of = {
        id(child): (parent, name)
        for _, parent in model.named_modules()
        for name, child in parent.items()
        if isinstance(child, nn.Module)
    }
    groups, taken = [], set()
    for calls in inputs.values():
        by_parent: dict[tuple, list] = {}
        for m in calls:
            kind, where = _kind(m), parent_of.get(id(m))
            if kind is not None and where is not None and id(m) not in taken:
                by_parent.setdefault((id(where[0]), kind), []).append((where[0], where[1], m))
        for members in by_parent.values():
            if len(members) > 1:
                groups.append((members[0][0], tuple(name for _, name, _ in members)))
                taken.update(id(m) for _, _, m in members)
    return groups


def fused_group(parent: Any, names: Sequence[str]) -> FusedGroup:
    """The :class:`FusedGroup` of ``parent``'s projections ``names``: made once (their arrays
    concatenated, each member rebound to its rows of them) and kept on ``parent``, so another
    scheduler on the same model reuses it; made again where a member's arrays were replaced.

    No mlx-lm counterpart. Raises what ``mx.concatenate`` raises for arrays that do not stack
    (the grouping keeps one kind and one input width, so they do)."""
    kept = parent.__dict__.setdefault(FUSED, {})
    group = kept.get(tuple(names))
    if group is not None and group.intact():
        return group
    members = tuple(parent[n] for n in names)
    keys = [k for k in ARRAYS if isinstance(members[0].get(k), mx.array)]
    fused = {k: mx.concatenate([m[k] for m in members]) for k in keys}  # each [sum N, ...]
    mx.eval(fused)
    bounds, start = [], 0
    for m in members:
        bounds.append((start, start + m["weight"].shape[0]))
        start += m["weight"].shape[0]
    views = tuple({k: fused[k][a:b] for k in keys} for a, b in bounds)  # contiguous rows: views
    mx.eval([list(v.values()) for v in views])
    for m, arrays in zip(members, views):
        for k, v in arrays.items():
            m[k] = v
    cls = hooked_class_of(members[0])
    module = cls.__new__(cls)
    nn.Module.__init__(module)
    for k, v in fused.items():
        module[k] = v
    if cls is nn.QuantizedLinear:
        module.group_size, module.bits = members[0].group_size, members[0].bits
        module.mode = getattr(members[0], "mode", "affine")
        if "biases" not in fused:
            module.biases = None
    group = kept[tuple(names)] = FusedGroup(module, members, tuple(bounds), views)
    return group


def fuse(model: Any) -> list[FusedGroup]:
    """Every :class:`FusedGroup` of ``model`` (:func:`sibling_groups`, :func:`fused_group`).
    No mlx-lm counterpart. Raises what :func:`fused_group` raises."""
    return [fused_group(parent, names) for parent, names in sibling_groups(model)]
