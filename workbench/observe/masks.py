"""Mask and padding math: pure numpy, no MLX, no scheduler.

Axis letters used here and across the workbench:

- ``B``: rows in the running batch
- ``S``: key positions the next decode step attends over = KV width + 1 (the cached
  positions plus the slot of the token being fed)

Worked example (mirrors mlx-lm's ``BatchKVCache``: rows are left-padded). Two rows with
3 and 1 cached tokens, KV width 3, so ``left_padding = [0, 2]``. The next decode step
feeds one token per row; its mask over ``S = 4`` key positions is::

    uid 7  | # # # @     # = cached token attended, . = left padding (masked),
    uid 9  | . . # @     @ = the fed token's own slot (attended)

``decode_mask([0, 2], 3)`` returns exactly that as booleans. It equals
``mlx_lm.models.base.create_causal_mask(1, offset=3, left_padding=lp)[:, 0, 0, :]``,
which is what ``BatchKVCache.make_mask(1)`` gives the attention layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def decode_mask(left_padding: Sequence[int], kv_width_tokens: int) -> np.ndarray:
    """Attention mask of the next decode step.

    Args:
        left_padding: ``[B]`` pad positions at the start of each row (tokens).
        kv_width_tokens: the batch cache's sequence length (tokens).

    Returns:
        ``[B, S]`` bool with ``S = kv_width_tokens + 1``; True where the row attends.

    Raises:
        ValueError: if a left padding is negative or larger than the KV width.
    """
    lp = np.asarray(left_padding, dtype=np.int64).reshape(-1)
    if lp.size and (lp.min() < 0 or lp.max() > kv_width_tokens):
        raise ValueError(f"left_padding must be in [0, {kv_width_tokens}], got {lp.tolist()}")
    cols = np.arange(kv_width_tokens + 1)
    return cols[None, :] >= lp[:, None]


def padding_waste(left_padding: Sequence[int], kv_width_tokens: int) -> float:
    """Share of the batch cache's slots that hold padding: ``sum(lp) / (B * width)``.

    Returns 0.0 for an empty batch or zero width.
    """
    lp = np.asarray(left_padding, dtype=np.int64)
    slots = lp.size * kv_width_tokens
    return float(lp.sum()) / slots if slots else 0.0


def mask_grid(mask: np.ndarray, uids: Sequence[int], fed_slot: bool | int = True, mark: str = "@") -> str:
    """ASCII form of a ``[B, S]`` bool mask, one line per row labelled by uid.

    ``#`` attended cached position, ``.`` masked (padding), and ``mark`` for the slot of the
    token fed at the next step: the last column when ``fed_slot`` is True, column
    ``fed_slot`` when it is an int (a ring buffer's write index), none when False.
    ``mark`` is ``@`` (the fed token, in temporal order) or ``w`` (the ring slot it is
    written to, in storage order), so two grids side by side never give one symbol two
    meanings. An empty batch renders as ``(no rows)``.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.shape[0] == 0:
        return "(no rows)"
    width = max(len(str(u)) for u in uids)
    lines = []
    for uid, row in zip(uids, mask):
        cells = ["#" if m else "." for m in row]
        col = -1 if fed_slot is True else fed_slot
        if col is not False and cells:
            cells[col] = mark if row[col] else "."
        lines.append(f"uid {uid:>{width}} | " + " ".join(cells))
    return "\n".join(lines)
