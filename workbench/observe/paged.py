"""The paged-KV counterfactual: what a paged cache (vLLM's blocks, SGLang's pages) would
hold for the same rows as the padded batch, step by step, and how many rows each layout
admits under one byte budget. A pure function of snapshots.

Knows: :class:`~workbench.observe.snapshot.Snapshot` and its layer groups. Must not know:
MLX, the engine, views.

Glossary (letters as in the code):

- ``b`` block size (tokens per block; vLLM's ``block_size``, default 16; SGLang's
  ``page_size``, default 1). ``b = 1`` holds exactly the rows' tokens.
- ``tb`` token bytes: one token position of one row over all a group's layers, keys and
  values (``LayerGroup.token_bytes``; ``2 * n_kv_heads * head_dim * dtype bytes`` per
  layer, mlx-lm's ``nbytes / (rows * capacity)``).
- ``P`` cache rows: the ``B`` running rows plus the free slots.
- held tokens of a row: ``clip(offset, 0, KV width)``, the tokens its cache really holds
  (full attention: prompt and generated; a window: at most its ``W`` last).

The padded layout (mlx-lm's ``BatchKVCache``) allocates ``P x capacity`` positions per
group, and they split exactly into::

    padded = data + padding + growth + free slots          (bytes, per attention group)
    data    = sum_r held_r * tb
    padding = (B * width - sum_r held_r) * tb               left padding (rows shorter than the widest)
    growth  = B * (capacity - width) * tb                   mlx-lm's 256-token growth step, not yet used
    free    = free_slots * capacity * tb                    evicted rows' cache rows kept for a joiner

(``width`` and ``capacity`` as allocated, free slots included.) The paged layout holds
whole blocks for the same rows, and nothing for free slots (freed blocks go back to the
pool)::

    paged_b = sum_r blocks_r * b * tb,   blocks_r = ceil(held_r / b)        (full attention)
    waste_b = paged_b - data                                                (each row's last, partly filled block)

Worked example (two rows of 5 and 37 tokens, one full-attention layer group of
``tb = 2048`` bytes, capacity 256, ``b = 16``)::

    row  tokens  padded slots (width 37, capacity 256)            blocks of 16
    r0        5  [32 pad][5 tok][219 growth]                       [5 tok + 11]             1 block
    r1       37  [37 tok][219 growth]                              [16][16][5 tok + 11]    3 blocks
    padded = 2 * 256 * 2048 = 1,048,576 bytes = data 86,016 + padding 65,536 + growth 897,024
    paged  = (1 + 3) * 16 * 2048 = 131,072 bytes (waste 45,056)

Other layer kinds, honestly:

- **Sliding window** (``window<W>``, mlx-lm's ``BatchRotatingKVCache``): a row keeps its
  last ``min(offset, W)`` positions. Paged, it holds the blocks covering those positions
  (vLLM's ``SlidingWindowManager`` frees blocks that fall wholly before the window): from
  block ``max(0, offset - W) // b`` to ``(offset - 1) // b``, so up to ``ceil(W / b) + 1``.
  (vLLM skips ``offset - W + 1`` tokens, one position fewer than the ring keeps; we count
  the ``W`` the ring holds, so both layouts hold the same tokens.)
- **Recurrent state** (``ssm``, mlx-lm's ``ArraysCache``) and any group without a
  sequence axis: a fixed state per row, the same in both layouts (vLLM keeps one state
  per request); the padded layout also keeps the free slots' states.
- Rows still prefilling are not in the batch and not counted in either layout.

The largest batch each layout admits under a byte budget, for rows like the current ones:
``floor(budget / row bytes)``, where a padded row costs the full capacity of every group
(``sum capacity * tb`` plus state) and a paged row costs the mean of the current rows'
paged bytes (plus state).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from .snapshot import LayerGroup, Snapshot

DEFAULT_BLOCKS = (16, 32, 64)  # vLLM's default block size is 16; 32 and 64 for comparison
PADDED_PARTS = ("data", "padding", "growth", "free")
PART_NAMES = {"data": "tokens", "padding": "left padding", "growth": "growth step", "free": "free slots"}


def blocks_for(tokens: Any, block_tokens: int) -> np.ndarray:
    """Blocks of ``block_tokens`` each row needs for ``tokens`` ``[B]`` (``ceil(n / b)``).

    >>> blocks_for([5, 37, 0, 16], 16).tolist()
    [1, 3, 0, 1]

    Raises:
        ValueError: if ``block_tokens < 1`` or a token count is negative.
    """
    n = np.asarray(tokens, np.int64)
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be at least 1, got {block_tokens}")
    if (n < 0).any():
        raise ValueError(f"token counts must be >= 0, got {n.tolist()}")
    return -(-n // block_tokens)


def window_blocks(offset: Any, window_tokens: int, block_tokens: int) -> np.ndarray:
    """Blocks each row ``[B]`` needs to keep the positions of its sliding window: the
    blocks covering positions ``[max(0, offset - W), offset)`` in block-aligned order.

    >>> window_blocks([5, 37, 0], 8, 16).tolist()   # 37: positions 29..36 straddle blocks 1 and 2
    [1, 2, 0]
    """
    o = np.asarray(offset, np.int64)
    first = np.maximum(o - window_tokens, 0) // block_tokens
    last = (o - 1) // block_tokens
    return np.where(o > 0, last - first + 1, 0)


def held_tokens(group: LayerGroup) -> np.ndarray:
    """``[B]`` tokens each row's cache holds in an attention ``group``:
    ``clip(offset, 0, kv_width_tokens)``."""
    return np.clip(np.asarray(group.offset, np.int64), 0, group.kv_width_tokens)


def _attention(group: LayerGroup, rows: int, free: int, blocks: Sequence[int]) -> dict[str, float]:
    tb = group.token_bytes
    if tb <= 0 and group.kv_bytes > 0:
        raise ValueError(
            f"layer group {group.name!r} holds {group.kv_bytes:,} bytes but has no token_bytes "
            "(a snapshot from capture gives it; a hand-built one must set it)"
        )
    capacity = group.allocated_capacity_tokens or group.capacity_tokens
    width = group.allocated_width_tokens or group.kv_width_tokens
    held = held_tokens(group)
    data = int(held.sum())
    out = {
        "data": data * tb,
        "padding": (rows * width - data) * tb,
        "growth": rows * (capacity - width) * tb,
        "free": free * capacity * tb,
        "padded_row": capacity * tb,
    }
    for b in blocks:
        n = (
            blocks_for(held, b)
            if group.window_tokens is None
            else window_blocks(group.offset, group.window_tokens, b)
        )
        out[f"paged_b{b}"] = int(n.sum()) * b * tb
    return out


def _state(group: LayerGroup, rows: int, free: int, blocks: Sequence[int]) -> dict[str, float]:
    per_row = group.kv_bytes // (rows + free) if rows + free else 0
    out = {"data": rows * per_row, "padding": 0, "growth": 0, "free": free * per_row, "padded_row": per_row}
    out.update({f"paged_b{b}": rows * per_row for b in blocks})
    return out


def group_layout(
    group: LayerGroup, rows: int, free_slots: int, blocks: Sequence[int] = DEFAULT_BLOCKS
) -> dict[str, float]:
    """One layer group's bytes in both layouts (see the module docstring).

    Args:
        group: the group, from a snapshot with ``rows`` running rows.
        rows: ``B``. free_slots: the snapshot's free slots.
        blocks: block sizes ``b`` (tokens).

    Returns:
        ``data``, ``padding``, ``growth``, ``free`` (padded bytes, summing to
        ``group.kv_bytes``), ``padded_row`` (bytes one more padded row costs) and
        ``paged_b<b>`` per block size (bytes).

    Raises:
        ValueError: for an attention group holding bytes without ``token_bytes``.
    """
    attention = group.name == "full" or group.window_tokens is not None
    return (_attention if attention else _state)(group, rows, free_slots, blocks)


def step_layout(snap: Snapshot, blocks: Sequence[int] = DEFAULT_BLOCKS) -> dict[str, Any]:
    """One row of :func:`paged_table` (without the budget columns) for one snapshot.

    Columns: ``step``, ``rows`` (``B``), ``free_slots``, ``tokens`` (the rows' context
    tokens, summed), ``padded_bytes`` and its parts
    ``padded_data_bytes``, ``padded_padding_bytes``, ``padded_growth_bytes``,
    ``padded_free_bytes``; ``padded_row_bytes``; per block size ``paged_bytes_b<b>``,
    ``paged_waste_bytes_b<b>`` (``paged - data``) and ``paged_row_bytes_b<b>`` (mean
    paged bytes per row; NaN without rows). Bytes are summed over the groups.
    """
    B, free = snap.batch_size, snap.free_slots
    parts = [group_layout(g, B, free, blocks) for g in snap.groups] if B or free else []
    total = lambda key: int(sum(p[key] for p in parts))  # noqa: E731
    row: dict[str, Any] = {
        "step": snap.step,
        "rows": B,
        "free_slots": free,
        "tokens": int(sum(snap.context_tokens)),
    }
    row["padded_bytes"] = sum(total(k) for k in PADDED_PARTS)
    row.update({f"padded_{k}_bytes": total(k) for k in PADDED_PARTS})
    row["padded_row_bytes"] = total("padded_row")
    for b in blocks:
        paged = total(f"paged_b{b}")
        row[f"paged_bytes_b{b}"] = paged
        row[f"paged_waste_bytes_b{b}"] = paged - row["padded_data_bytes"]
        row[f"paged_row_bytes_b{b}"] = paged / B if B else np.nan
    return row


def block_sizes(table: pd.DataFrame) -> list[int]:
    """The block sizes a :func:`paged_table` has columns for, ascending."""
    return sorted(int(c.rsplit("_b", 1)[1]) for c in table.columns if c.startswith("paged_bytes_b"))


def with_budget(table: pd.DataFrame, budget_bytes: int | None = None) -> pd.DataFrame:
    """``table`` (rows of :func:`step_layout`) with ``budget_bytes``, ``padded_max_batch``
    and ``paged_max_batch_b<b>``: ``floor(budget / row bytes)`` per step (``Int64``; ``<NA>``
    at steps without rows). ``budget_bytes=None`` takes the table's largest ``padded_bytes`` (what
    the padded batch itself reached)."""
    out = table.copy()
    budget = int(budget_bytes if budget_bytes is not None else (out.padded_bytes.max() if len(out) else 0))
    out["budget_bytes"] = budget
    has_rows = (out.rows > 0) & (out.padded_row_bytes > 0)
    rows_fit = lambda per_row: pd.array(
        np.where(has_rows, np.floor(budget / per_row.where(has_rows, 1.0)), np.nan),  # noqa: E731
        dtype="Int64",
    )
    out["padded_max_batch"] = rows_fit(out.padded_row_bytes)
    for b in block_sizes(out):
        out[f"paged_max_batch_b{b}"] = rows_fit(out[f"paged_row_bytes_b{b}"])
    return out


def paged_table(
    snaps: Iterable[Snapshot], blocks: Sequence[int] = DEFAULT_BLOCKS, budget_bytes: int | None = None
) -> pd.DataFrame:
    """Per snapshot (one per step of a run, e.g. ``sched.history``), the padded batch's
    bytes and their parts beside a paged layout's bytes for each block size, and the
    largest batch each admits under ``budget_bytes`` (see :func:`step_layout`,
    :func:`with_budget`; ``None``: the first snapshot's ``kv_budget_bytes``, else the
    run's padded peak).

    Raises:
        ValueError: for a block size below 1, or a snapshot group without token bytes.
    """
    snaps = list(snaps)
    for b in blocks:
        blocks_for([], b)
    if budget_bytes is None and snaps:
        budget_bytes = snaps[0].kv_budget_bytes
    rows = [step_layout(s, blocks) for s in snaps]
    return with_budget(pd.DataFrame(rows, columns=layout_columns(blocks)), budget_bytes)


def layout_columns(blocks: Sequence[int] = DEFAULT_BLOCKS) -> list[str]:
    """The columns of :func:`step_layout` rows, in table order."""
    head = ["step", "rows", "free_slots", "tokens", "padded_bytes"] + [
        f"padded_{k}_bytes" for k in PADDED_PARTS
    ]
    return (
        head
        + ["padded_row_bytes"]
        + [f"paged_{k}_b{b}" for b in blocks for k in ("bytes", "waste_bytes", "row_bytes")]
    )


def padding_tax(table: pd.DataFrame, block_tokens: int = 16) -> float:
    """Share of the padded layout's bytes, summed over the table's steps, that a paged
    layout of ``block_tokens`` would not hold: ``1 - sum(paged) / sum(padded)`` (NaN when
    the padded layout held nothing). Negative if paging holds more (tiny rows, big blocks)."""
    padded = float(table.padded_bytes.sum()) if len(table) else 0.0
    return 1.0 - float(table[f"paged_bytes_b{block_tokens}"].sum()) / padded if padded else float("nan")


def paged_summary(table: pd.DataFrame) -> dict[str, Any]:
    """The run in a few numbers: ``padded_peak_bytes``, per block size
    ``paged_peak_bytes_b<b>`` and ``padding_tax_b<b>`` (:func:`padding_tax`), and the
    mean largest batch of each layout over steps with rows (when the table has budget
    columns)."""
    out: dict[str, Any] = {"padded_peak_bytes": int(table.padded_bytes.max()) if len(table) else 0}
    for b in block_sizes(table):
        out[f"paged_peak_bytes_b{b}"] = int(table[f"paged_bytes_b{b}"].max()) if len(table) else 0
        out[f"padding_tax_b{b}"] = padding_tax(table, b)
    if "padded_max_batch" in table:
        out["padded_mean_max_batch"] = float(table.padded_max_batch.mean())
        for b in block_sizes(table):
            out[f"paged_mean_max_batch_b{b}"] = float(table[f"paged_max_batch_b{b}"].mean())
    return out


def paged_text(table: pd.DataFrame) -> str:
    """Deterministic text: one line per layout (peak KiB, share of its bytes summed over
    steps not holding tokens, and with budget columns the mean largest batch), and the
    padded bytes' parts (tokens, left padding, growth step, free slots) as shares."""
    if not len(table):
        return "paged vs padded: no steps"
    data = float(table.padded_data_bytes.sum())
    lines = [
        f"paged vs padded over {len(table)} step(s), peak {int(table.rows.max())} row(s)"
        + (f", budget {int(table.budget_bytes.iloc[0]) / 1024:,.1f} KiB" if "budget_bytes" in table else "")
    ]

    def line(name: str, col: str, batch_col: str) -> str:
        total = float(table[col].sum())
        waste = 1 - data / total if total else 0.0
        text = f"  {name:<12} peak {int(table[col].max()) / 1024:>10,.1f} KiB  waste {waste:6.1%}"
        if batch_col in table:
            text += f"  mean max batch {table[batch_col].mean():7.1f}"
        return text

    lines.append(line("padded", "padded_bytes", "padded_max_batch"))
    padded = float(table.padded_bytes.sum())
    if padded:
        lines.append(
            "    of it: "
            + ", ".join(
                f"{PART_NAMES[k]} {float(table[f'padded_{k}_bytes'].sum()) / padded:.1%}"
                for k in PADDED_PARTS
            )
        )
    for b in block_sizes(table):
        lines.append(line(f"paged b={b}", f"paged_bytes_b{b}", f"paged_max_batch_b{b}"))
    return "\n".join(lines)
