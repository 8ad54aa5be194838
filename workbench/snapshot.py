"""Snapshots: frozen numpy data of the running batch, taken between engine calls.

Knows: what a view, a test or a golden needs to see of the batch. Must not know: MLX
(the scheduler converts MLX arrays to numpy once, after ``mx.eval``), widgets.

Axis letters: ``B`` rows in the running batch, ``S`` key positions of the next decode
step (KV width + 1; see :mod:`workbench.masks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .masks import mask_grid, padding_waste


def frozen(a) -> np.ndarray:
    """A read-only numpy copy of ``a``."""
    out = np.array(a, copy=True)
    out.setflags(write=False)
    return out


@dataclass(frozen=True)
class Snapshot:
    """The batch as the next decode step will see it.

    Attributes:
        step: decode steps completed so far.
        uids: ``[B]`` uid of each row, in row order.
        finished: ``[B]`` True for rows that finished but are not yet evicted by ``filter``.
        generated_tokens: ``[B]`` tokens generated so far per row.
        left_padding: ``[B]`` int, pad positions at the start of each row (tokens).
        offset: ``[B]`` int, RoPE position of each row's next token (tokens).
        kv_width_tokens: the batch cache's sequence length in use (tokens).
        capacity_tokens: the batch cache's allocated sequence length (tokens).
        kv_bytes: bytes allocated by every layer's cache.
        masks: per layer group (``"full"`` for full attention) a ``[B, S]`` bool mask that
            the attention layers use at the next step.
        queue: uids waiting for admission, in queue order.
    """

    step: int
    uids: tuple[int, ...]
    finished: tuple[bool, ...]
    generated_tokens: tuple[int, ...]
    left_padding: np.ndarray
    offset: np.ndarray
    kv_width_tokens: int
    capacity_tokens: int
    kv_bytes: int
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    queue: tuple[int, ...] = ()

    @property
    def batch_size(self) -> int:
        """``B``, the number of rows in the running batch."""
        return len(self.uids)

    @property
    def padding_waste(self) -> float:
        """Share of the cache's in-use slots that hold left padding (0..1)."""
        return padding_waste(self.left_padding, self.kv_width_tokens)

    def text(self) -> str:
        """Deterministic text form: a header, per-row geometry and the ASCII masks."""
        lines = [
            f"step {self.step}: {self.batch_size} row(s), KV width {self.kv_width_tokens} tokens, "
            f"{self.kv_bytes:,} KV bytes, queue {list(self.queue)}"
        ]
        for r, uid in enumerate(self.uids):
            state = "finished" if self.finished[r] else "running"
            lines.append(
                f"  row {r}: uid {uid} {state}, left_padding {int(self.left_padding[r])}, "
                f"offset {int(self.offset[r])}, generated {self.generated_tokens[r]}"
            )
        for group, mask in self.masks.items():
            lines.append(f"mask [{group}] ('#' attended, '.' padding, '@' fed token):")
            lines.append(mask_grid(mask, self.uids))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()
