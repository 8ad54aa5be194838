"""Snapshots of the engine: what the next decode step will see, captured from the
batch's public read-only fields without waiting for the forward in flight.

Knows: :class:`workbench.engine.batch.Batch`, mlx-lm's caches through
:mod:`workbench.engine.kv.caches`, :class:`workbench.observe.snapshot.Snapshot`. Must not
know: how the engine changes that state. Reads only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..observe.snapshot import LayerGroup, Snapshot, frozen
from .batch import Batch
from .kv import caches as kv
from .kv.ledger import measured_memory


def _group_geometries(batch: Batch) -> list[tuple[str, tuple[str, ...], int, kv.Geometry]]:
    """Per layer group: name, layer labels, bytes allocated (free slots counted) and a
    geometry capture (free slots left out)."""
    B = len(batch)
    view = batch.view
    shown = kv.layer_groups(view) if view else {}
    allocated = shown if view is batch.caches else kv.layer_groups(batch.caches)
    out = []
    for name, layers in shown.items():
        first = layers[0][1]
        nbytes = sum(int(c.nbytes) for _, c in allocated[name])
        if name == "ssm":
            geo = kv.ssm_geometry(first, B)
        elif hasattr(first, "left_padding") and hasattr(first, "offset"):
            geo = _with_allocation(kv.attention_geometry(first), [c for _, c in allocated[name]])
        else:
            geo = lambda: {"mask": np.ones((B, 1), bool)}  # noqa: E731
        out.append((name, tuple(label for label, _ in layers), nbytes, geo))
    return out


def _with_allocation(geo: kv.Geometry, layers: list) -> kv.Geometry:
    """``geo`` plus the group's allocation (free slots included): ``token_bytes``,
    ``allocated_width_tokens``, ``allocated_capacity_tokens``."""
    held = [c for c in layers if c.keys is not None]
    token_bytes = sum(int(c.nbytes) // (kv.keys_shape(c)[0] * kv.keys_shape(c)[2]) for c in held)
    width, capacity = (int(held[0].size()), kv.keys_shape(held[0])[2]) if held else (0, 0)
    return lambda: dict(
        geo(), token_bytes=token_bytes, allocated_width_tokens=width, allocated_capacity_tokens=capacity
    )


def capture(batch: Batch, step: int, **fields: Any) -> Callable[[], Snapshot]:
    """Everything a :class:`Snapshot` of ``batch`` at decode step ``step`` shows, captured
    now without evaluating MLX arrays; the returned function converts to numpy (and may
    wait for the forward in flight).

    Args:
        fields: the engine-level fields (``queue``, ``prefilling``, ``kv_budget_bytes``,
            ``kv_projected_bytes``, ``adapters_loaded``, ``adapter_bytes``) passed through
            to the snapshot.
    """
    B = len(batch)
    groups = _group_geometries(batch)
    rows = dict(
        step=step,
        uids=tuple(r.uid for r in batch.rows),
        finished=tuple(r.finished for r in batch.rows),
        generated_tokens=tuple(len(r.tokens) for r in batch.rows),
        context_tokens=tuple(r.context_tokens for r in batch.rows),
        kv_bytes=batch.kv_bytes,
        free_slots=len(batch.free),
        fast_path=batch.fast_path,
        adapters=tuple(r.valid.request.adapter for r in batch.rows),
        constraints=tuple(r.constraint for r in batch.rows),
    )

    def build() -> Snapshot:
        built = []
        for name, labels, nbytes, geo in groups:
            values = {k: (frozen(v) if isinstance(v, (list, np.ndarray)) else v) for k, v in geo().items()}
            built.append(LayerGroup(name=name, layers=labels, kv_bytes=nbytes, **values))
        attn = next((g for g in built if g.name == "full"), None) or next(
            (g for g in built if g.window_tokens is not None), None
        )
        return Snapshot(
            left_padding=attn.left_padding if attn else frozen(np.zeros(B, np.int64)),
            offset=attn.offset if attn else frozen(np.zeros(B, np.int64)),
            kv_width_tokens=attn.kv_width_tokens if attn else 0,
            capacity_tokens=attn.capacity_tokens if attn else 0,
            groups=tuple(built),
            **rows,
            **fields,
        )

    return build


def engine_capture(
    st: Any, ledger: Any, kv_budget_bytes: int | None, layout_fields: dict, fields: dict
) -> Callable[[], Snapshot]:
    """:func:`capture` of engine state ``st`` with ``ledger``'s byte readings, MLX's measured
    memory, ``layout_fields`` and ``fields``."""
    held = ledger.held(st)
    active, peak = measured_memory()
    return capture(
        st.batch,
        st.step_index,
        kv_budget_bytes=kv_budget_bytes,
        kv_projected_bytes=ledger.projected_bytes(st),
        prefilling=tuple(st.prefilling.progress()) if st.prefilling else (),
        prefill_kv_bytes=held.prefill_bytes,
        prompt_cache_bytes=held.prompt_cache_bytes,
        shared_prompt_bytes=held.shared_prompt_bytes,
        active_memory_bytes=active,
        peak_memory_bytes=peak,
        **layout_fields,
        **fields,
    )
