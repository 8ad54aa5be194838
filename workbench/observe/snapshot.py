"""Snapshots: frozen numpy data of the running batch, taken between engine calls.

Knows: what a view, a test or a golden needs to see of the batch. Must not know: MLX
(the scheduler converts MLX arrays to numpy once, after ``mx.eval``), widgets.

Axis letters: ``B`` rows in the running batch, ``S`` key positions of the next decode
step (for full attention the KV width + 1; see :mod:`workbench.observe.masks`).

Layers are shown per *layer group* (:class:`LayerGroup`): ``full`` for full-attention
layers (mlx-lm ``BatchKVCache``), ``window<W>`` for sliding-window layers
(``BatchRotatingKVCache`` ring buffers of ``W`` tokens), ``ssm`` for recurrent layers
(``ArraysCache``: conv and SSM states, no sequence axis).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .masks import mask_grid, padding_waste
from .packed import PackedState


def frozen(a) -> np.ndarray:
    """A read-only numpy copy of ``a``."""
    out = np.array(a, copy=True)
    out.setflags(write=False)
    return out


@dataclass(frozen=True)
class LayerGroup:
    """One group of layers that share a cache kind and geometry.

    Attributes:
        name: ``full``, ``window<W>``, ``ssm`` (or a cache class name).
        layers: layer labels (``"3"``, or ``"3.1"`` inside a ``CacheList``).
        kv_bytes: bytes allocated by the group's caches.
        mask: ``[B, S]`` bool, what the group's layers get at the next step (storage
            order for ring buffers; ``[B, 1]`` for ``ssm``: True = the token enters the
            state).
        left_padding, offset: ``[B]`` int (attention groups; empty for ``ssm``).
        kv_width_tokens, capacity_tokens: positions in use / allocated (attention groups).
        window_tokens, write_index, wrapped, mask_temporal: ring-buffer state (window
            groups): the window, the slot written next, whether the ring has wrapped,
            and ``mask`` rolled to oldest-first order.
        state_shapes: per state array its shape, e.g. ``(B, K-1, C)`` (``ssm`` groups).
        token_bytes: bytes one token position of one cache row takes over all the
            group's layers, keys and values (attention groups; 0 for ``ssm``).
        allocated_width_tokens, allocated_capacity_tokens: KV width and capacity of the
            cache rows as allocated, free slots included; they differ from
            ``kv_width_tokens`` / ``capacity_tokens`` only while free slots are held
            (dropping them would trim the left padding every running row shares).
    """

    name: str
    layers: tuple[str, ...]
    kv_bytes: int
    mask: np.ndarray
    left_padding: np.ndarray = field(default_factory=lambda: frozen(np.zeros(0, int)))
    offset: np.ndarray = field(default_factory=lambda: frozen(np.zeros(0, int)))
    kv_width_tokens: int = 0
    capacity_tokens: int = 0
    window_tokens: int | None = None
    write_index: int | None = None
    wrapped: bool | None = None
    mask_temporal: np.ndarray | None = None
    state_shapes: tuple[tuple[int, ...], ...] = ()
    token_bytes: int = 0
    allocated_width_tokens: int = 0
    allocated_capacity_tokens: int = 0

    def text(self, uids) -> str:
        """ASCII form: geometry line(s) and the mask grid labelled by uid."""
        head = f"[{self.name}] layers {','.join(self.layers)}, {self.kv_bytes:,} bytes"
        if self.name == "ssm":
            return "\n".join(
                [
                    f"{head}; state shapes {list(self.state_shapes)}",
                    "  enters the state at the next step ('#' yes):",
                    mask_grid(self.mask, uids, fed_slot=False),
                ]
            )
        if self.window_tokens is not None:
            return "\n".join(
                [
                    f"{head}; window {self.window_tokens} tokens, write index {self.write_index}, "
                    f"wrapped {'yes' if self.wrapped else 'no'}, width {self.kv_width_tokens}",
                    "  mask in ring (storage) order ('#' attended, '.' masked, 'w' write slot of the fed token):",
                    mask_grid(self.mask, uids, fed_slot=self.write_index if self.wrapped else True, mark="w"),
                    "  mask in temporal order (oldest first, '@' = fed token):",
                    mask_grid(self.mask_temporal, uids),
                ]
            )
        return "\n".join(
            [
                f"{head}; KV width {self.kv_width_tokens} tokens",
                "  mask ('#' attended, '.' padding, '@' fed token):",
                mask_grid(self.mask, uids),
            ]
        )


@dataclass(frozen=True)
class Snapshot:
    """The batch as the next decode step will see it.

    Attributes:
        step: decode steps completed so far.
        uids: ``[B]`` uid of each row, in row order.
        finished: ``[B]`` True for rows that finished but are not yet evicted by ``filter``.
        generated_tokens: ``[B]`` tokens generated so far per row.
        context_tokens: ``[B]`` tokens each row's cache holds (prompt and generated).
        left_padding: ``[B]`` int, pad positions at the start of each row (tokens), of
            the first attention group (``full`` if any); zeros for a pure SSM model.
        offset: ``[B]`` int, RoPE position of each row's next token (same group).
        kv_width_tokens: that group's sequence length in use (tokens).
        capacity_tokens: that group's allocated sequence length (tokens).
        kv_bytes: bytes allocated by every layer's batch cache (the sum of the arrays'
            ``nbytes``: capacity, padding and free slots included).
        kv_budget_bytes: the scheduler's KV budget (``None``: no budget); it covers
            ``kv_bytes + prefill_kv_bytes + prompt_cache_bytes + shared_prompt_bytes``.
        kv_projected_bytes: the most bytes the batch and prefilling caches may hold from
            now until every row finishes, as mlx-lm allocates them (256-token growth
            steps, rows padded to the widest; :mod:`workbench.engine.kv.allocation`): what
            admission keeps within the budget.
        groups: the :class:`LayerGroup` s, in first-layer order.
        queue: uids waiting for admission, in arrival order.
        prefilling: ``(uid, prefilled_tokens, tokens_to_prefill)`` of the joining group
            (all prompt tokens but the last are prefilled before the join).
        free_slots: cache rows of evicted requests held for the next joiner (not among
            the ``B`` rows; ``kv_bytes`` counts them): the next join writes into them,
            else the next ``step()`` drops them (see :mod:`workbench.engine.batch`).
        fast_path: the decode fast paths the last decode step took (``"no mask"``,
            ``"padded kernel"``, ``"compiled MLP"``, joined by ``" + "``; ``"none"``: mlx-lm's
            forward as it is, ``Scheduler(fast_decode=False)`` or a step no path applies to;
            ``""`` before the first decode step; kept after the batch empties). Not part of
            :meth:`text`. See :mod:`workbench.engine.levers.fastpath`.
        serial_reason: why the scheduler runs one row at a time (a model that cannot batch
            rows of different lengths, ``Scheduler.serial_reason``), else ``""``.
        prefill_kv_bytes: bytes the prefilling group's caches hold (``nbytes``).
        prompt_cache_bytes: bytes the prompt cache's entries hold (mlx-lm's
            ``LRUPromptCache.nbytes``).
        shared_prompt_bytes: bytes of the prompts held for ``submit_n`` samples still queued
            (:mod:`workbench.engine.shared_prompts`), which they start from instead of a prefill.
        active_memory_bytes, peak_memory_bytes: MLX's measured ``mx.get_active_memory()``
            and ``mx.get_peak_memory()`` when the snapshot was taken: every live array of
            the process (weights included), beside the computed bytes above.
        adapters: ``[B]`` the LoRA adapter each row selected (``Request.adapter``;
            ``None``: the base model).
        adapters_loaded: names of the adapters the scheduler loaded
            (``Scheduler(adapters=...)``), in load order.
        adapter_bytes: bytes the loaded adapters hold (their per-layer stacks,
            :class:`workbench.engine.levers.lora.AdapterBank`); ``0`` without adapters.
        packed: the packed layout's pages and latest forward
            (:class:`workbench.observe.packed.PackedState`); ``None`` in the padded layout.
        constraints: ``[B]`` each row's structured-output constraint as ``field=source``
            (``Request(json_schema= / regex= / choices=)``), ``""`` for a free row.
    """

    step: int
    uids: tuple[int, ...]
    finished: tuple[bool, ...]
    generated_tokens: tuple[int, ...]
    context_tokens: tuple[int, ...]
    left_padding: np.ndarray
    offset: np.ndarray
    kv_width_tokens: int
    capacity_tokens: int
    kv_bytes: int
    kv_budget_bytes: int | None = None
    kv_projected_bytes: int = 0
    groups: tuple[LayerGroup, ...] = ()
    queue: tuple[int, ...] = ()
    prefilling: tuple[tuple[int, int, int], ...] = ()
    free_slots: int = 0
    serial_reason: str = ""
    fast_path: str = ""
    prefill_kv_bytes: int = 0
    prompt_cache_bytes: int = 0
    active_memory_bytes: int = 0
    peak_memory_bytes: int = 0
    adapters: tuple[str | None, ...] = ()
    adapters_loaded: tuple[str, ...] = ()
    adapter_bytes: int = 0
    packed: PackedState | None = None
    constraints: tuple[str, ...] = ()
    shared_prompt_bytes: int = 0

    @property
    def held_bytes(self) -> int:
        """Everything the KV budget covers: ``kv_bytes + prefill_kv_bytes + prompt_cache_bytes +
        shared_prompt_bytes``."""
        return self.kv_bytes + self.prefill_kv_bytes + self.prompt_cache_bytes + self.shared_prompt_bytes

    @property
    def batch_size(self) -> int:
        """``B``, the number of rows in the running batch."""
        return len(self.uids)

    @property
    def masks(self) -> dict[str, np.ndarray]:
        """Per group name, the ``[B, S]`` bool mask its layers use at the next step."""
        return {g.name: g.mask for g in self.groups}

    def group(self, name: str) -> LayerGroup:
        """The group called ``name``. Raises KeyError naming the groups there are."""
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no layer group {name!r}; groups: {[g.name for g in self.groups]}")

    @property
    def padding_waste(self) -> float:
        """Share of the cache's in-use slots that hold left padding (0..1)."""
        return padding_waste(np.clip(self.left_padding, 0, None), self.kv_width_tokens)

    def text(self) -> str:
        """Deterministic text form: a header, per-row geometry and each group's masks."""
        recurrent_only = bool(self.groups) and all(g.name == "ssm" for g in self.groups)
        geometry = (
            "no KV cache (recurrent state only), "
            if recurrent_only
            else f"KV width {self.kv_width_tokens} tokens, "
        )
        lines = [
            f"step {self.step}: {self.batch_size} row(s), {geometry}"
            f"{self.kv_bytes:,} {'state' if recurrent_only else 'KV'} bytes, queue {list(self.queue)}"
        ]
        if self.serial_reason:
            lines.append(f"  serial lane (one row at a time): {self.serial_reason}")
        if self.kv_budget_bytes is not None:
            shared = f" + shared prompts {self.shared_prompt_bytes:,}" if self.shared_prompt_bytes else ""
            lines.append(
                f"  KV budget {self.kv_budget_bytes:,} bytes: {self.held_bytes:,} held (batch "
                f"{self.kv_bytes:,} + prefill {self.prefill_kv_bytes:,} + prompt cache "
                f"{self.prompt_cache_bytes:,}{shared}), {self.kv_projected_bytes:,} projected"
            )
        for uid, done, total in self.prefilling:
            lines.append(f"  prefilling uid {uid}: {min(done, total)}/{total} prompt tokens")
        if self.free_slots:
            lines.append(
                f"  free slots: {self.free_slots} (evicted rows' cache rows: the next admit() writes joiners "
                "into them and drops the rest)"
            )
        if self.adapters_loaded:
            lines.append(
                f"  adapters loaded: {', '.join(self.adapters_loaded)} ({self.adapter_bytes:,} bytes)"
            )
        attention = any(g.name != "ssm" for g in self.groups)
        for r, uid in enumerate(self.uids):
            state = "finished" if self.finished[r] else "running"
            where = (
                f"left_padding {int(self.left_padding[r])}, offset {int(self.offset[r])}"
                if attention or not self.groups
                else f"context {self.context_tokens[r]} tokens"
            )
            adapter = f", adapter {self.adapters[r] or 'none'}" if self.adapters_loaded else ""
            constraint = (
                f", {self.constraints[r]}" if r < len(self.constraints) and self.constraints[r] else ""
            )
            lines.append(
                f"  row {r}: uid {uid} {state}, {where}, generated {self.generated_tokens[r]}{adapter}"
                f"{constraint}"
            )
        if self.packed is not None:
            lines.append(self.packed.text())
        if len(self.groups) == 1 and self.groups[0].name == "full":
            lines.append("mask [full] ('#' attended, '.' padding, '@' fed token):")
            lines.append(mask_grid(self.groups[0].mask, self.uids))
        elif self.uids:
            lines += [g.text(self.uids) for g in self.groups]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()
