"""The paged-KV counterfactual: hand-worked examples on hand-built snapshots, and the
padded side against the bytes the engine's real caches allocate."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import workbench as wb
from workbench.observe.paged import (
    blocks_for,
    group_layout,
    padding_tax,
    paged_summary,
    paged_table,
    paged_text,
    step_layout,
    window_blocks,
)
from workbench.observe.snapshot import LayerGroup, Snapshot, frozen

TB = 2048  # token bytes of the hand-built full-attention group


def full_group(offsets, width, capacity, tb=TB, free=0, allocated_width=0):
    """A full-attention group whose rows hold ``offsets`` tokens, left-padded to ``width``."""
    offsets = np.asarray(offsets)
    rows = len(offsets) + free
    return LayerGroup(
        name="full",
        layers=("0",),
        kv_bytes=rows * capacity * tb,
        mask=frozen(np.ones((len(offsets), 1), bool)),
        left_padding=frozen(width - offsets),
        offset=frozen(offsets),
        kv_width_tokens=width,
        capacity_tokens=capacity,
        token_bytes=tb,
        allocated_width_tokens=allocated_width or width,
        allocated_capacity_tokens=capacity,
    )


def snapshot(groups, n_rows, free=0, step=0, context=None, budget=None):
    return Snapshot(
        step=step,
        uids=tuple(range(n_rows)),
        finished=(False,) * n_rows,
        generated_tokens=(0,) * n_rows,
        context_tokens=tuple(context or (0,) * n_rows),
        left_padding=frozen(np.zeros(n_rows, int)),
        offset=frozen(np.zeros(n_rows, int)),
        kv_width_tokens=0,
        capacity_tokens=0,
        kv_bytes=sum(g.kv_bytes for g in groups),
        kv_budget_bytes=budget,
        groups=tuple(groups),
        free_slots=free,
    )


def test_blocks_round_each_row_up_to_whole_blocks():
    assert blocks_for([5, 37], 16).tolist() == [1, 3]
    assert blocks_for([16, 17, 0, 1], 16).tolist() == [1, 2, 0, 1]
    assert blocks_for([5, 37], 1).tolist() == [5, 37]
    with pytest.raises(ValueError, match="block_tokens"):
        blocks_for([5], 0)


def test_window_rows_hold_only_the_blocks_covering_their_window():
    # offset 37, window 8: positions 29..36 lie in blocks 1 (16..31) and 2 (32..47)
    assert window_blocks([37], 8, 16).tolist() == [2]
    assert window_blocks([32], 8, 16).tolist() == [1]  # 24..31: block 1 only
    assert window_blocks([5, 0], 8, 16).tolist() == [1, 0]
    assert window_blocks([1000], 64, 16).tolist() == [5]  # 936..999: blocks 58..62


def test_two_rows_of_5_and_37_tokens_worked_example():
    """The module docstring's example: rows of 5 and 37 tokens, width 37, capacity 256."""
    snap = snapshot([full_group([5, 37], width=37, capacity=256)], 2, context=(5, 37))
    row = step_layout(snap, blocks=(16, 32))
    assert row["padded_bytes"] == 2 * 256 * TB == snap.kv_bytes
    assert row["padded_data_bytes"] == 42 * TB
    assert row["padded_padding_bytes"] == 32 * TB
    assert row["padded_growth_bytes"] == 2 * 219 * TB
    assert row["padded_free_bytes"] == 0
    assert row["paged_bytes_b16"] == (1 + 3) * 16 * TB == 131_072
    assert row["paged_waste_bytes_b16"] == (64 - 42) * TB
    assert row["paged_bytes_b32"] == (1 + 2) * 32 * TB
    assert row["paged_row_bytes_b16"] == 2 * 16 * TB
    assert row["tokens"] == 42


def test_free_slots_cost_the_padded_layout_a_whole_row_and_the_paged_one_nothing():
    snap = snapshot([full_group([10, 20], width=20, capacity=256, free=1)], 2, free=1)
    row = step_layout(snap, blocks=(16,))
    assert row["padded_free_bytes"] == 256 * TB
    assert row["padded_bytes"] == snap.kv_bytes == 3 * 256 * TB
    assert row["paged_bytes_b16"] == (1 + 2) * 16 * TB


def test_padding_shared_by_all_rows_while_free_slots_are_held_counts_as_padding():
    # the view trimmed 5 shared pad positions: allocated width 25 for a shown width 20
    snap = snapshot([full_group([10, 20], width=20, capacity=256, free=1, allocated_width=25)], 2, free=1)
    row = step_layout(snap, blocks=(16,))
    assert row["padded_padding_bytes"] == (2 * 25 - 30) * TB
    assert row["padded_growth_bytes"] == 2 * (256 - 25) * TB
    assert row["padded_bytes"] == snap.kv_bytes


def test_window_and_state_groups_beside_a_full_group():
    window = LayerGroup(
        name="window8",
        layers=("1",),
        kv_bytes=3 * 8 * 512,
        mask=frozen(np.ones((2, 8), bool)),
        left_padding=frozen(np.array([3, -29])),
        offset=frozen(np.array([5, 37])),
        kv_width_tokens=8,
        capacity_tokens=8,
        window_tokens=8,
        token_bytes=512,
    )
    ssm = LayerGroup(name="ssm", layers=("2",), kv_bytes=3 * 1000, mask=frozen(np.ones((2, 1), bool)))
    full = full_group([5, 37], width=37, capacity=256, free=1)
    snap = snapshot([full, window, ssm], 2, free=1)
    w = group_layout(window, 2, 1, blocks=(16,))
    # window rows hold 5 and 8 tokens; paged: 1 block and 2 blocks (positions 29..36)
    assert w["data"] == 13 * 512 and w["padding"] == 3 * 512 and w["growth"] == 0
    assert w["paged_b16"] == 3 * 16 * 512
    s = group_layout(ssm, 2, 1, blocks=(16,))
    assert s == {"data": 2000, "padding": 0, "growth": 0, "free": 1000, "padded_row": 1000, "paged_b16": 2000}
    row = step_layout(snap, blocks=(16,))
    assert w["data"] + w["padding"] + w["free"] == window.kv_bytes
    assert row["padded_bytes"] == full.kv_bytes + window.kv_bytes + ssm.kv_bytes == snap.kv_bytes
    assert row["paged_bytes_b16"] == 4 * 16 * TB + 3 * 16 * 512 + 2000
    assert row["padded_row_bytes"] == 256 * TB + 8 * 512 + 1000


def test_largest_batch_under_a_budget_for_rows_like_the_current_ones():
    snap = snapshot([full_group([5, 37], width=37, capacity=256)], 2)
    table = paged_table([snap], blocks=(16,), budget_bytes=10 * 256 * TB)
    assert table.padded_max_batch.tolist() == [10]
    # a paged row costs (16 + 48) / 2 = 32 tokens on average: 2560 / 32 = 80 rows
    assert table.paged_max_batch_b16.tolist() == [80]


def test_budget_defaults_to_the_snapshots_budget_then_the_padded_peak():
    a = snapshot([full_group([5, 37], width=37, capacity=256)], 2)
    b = snapshot([full_group([6], width=6, capacity=256)], 1, step=1)
    assert paged_table([a, b]).budget_bytes.tolist() == [2 * 256 * TB] * 2
    budgeted = snapshot([full_group([5, 37], width=37, capacity=256)], 2, budget=12345)
    assert paged_table([budgeted]).budget_bytes.tolist() == [12345]


def test_an_empty_step_has_no_bytes_and_no_admissible_batch():
    table = paged_table([snapshot([], 0)], blocks=(16,))
    assert table.padded_bytes.tolist() == [0] and table.paged_bytes_b16.tolist() == [0]
    assert pd.isna(table.padded_max_batch.iloc[0]) and pd.isna(table.paged_max_batch_b16.iloc[0])


def test_padding_tax_and_summary_over_steps():
    a = snapshot([full_group([5, 37], width=37, capacity=256)], 2)
    b = snapshot([full_group([6], width=6, capacity=256)], 1, step=1)
    table = paged_table([a, b], blocks=(16,))
    padded, paged = 2 * 256 + 256, 64 + 16
    assert padding_tax(table, 16) == pytest.approx(1 - paged / padded)
    summary = paged_summary(table)
    assert summary["padded_peak_bytes"] == 512 * TB and summary["paged_peak_bytes_b16"] == 64 * TB
    assert summary["padding_tax_b16"] == pytest.approx(1 - paged / padded)
    text = paged_text(table)
    assert "paged b=16" in text and text == paged_text(table.copy())
    # KiB like the figures beside it, never raw bytes
    assert f"{512 * TB / 1024:,.1f} KiB  waste" in text and f"{512 * TB:,}" not in text
    data = (42 + 6) / padded  # tokens over padded positions, summed over both steps
    assert f"tokens {data:.1%}" in text and "free slots 0.0%" in text


def test_an_attention_group_without_token_bytes_is_refused():
    g = full_group([5], width=5, capacity=256, tb=0)
    g = LayerGroup(**{**g.__dict__, "kv_bytes": 1024})
    with pytest.raises(ValueError, match="token_bytes"):
        step_layout(snapshot([g], 1))


def _allocated_bytes(sched) -> int:
    """Sum of the batch caches' arrays' ``nbytes`` (keys, values, SSM states), read from
    the engine's caches directly."""
    caches = sched.state.batch.caches or []
    total = 0
    for c in caches:
        for sub in getattr(c, "caches", (c,)):
            arrays = [sub.keys, sub.values] if hasattr(sub, "keys") else list(sub.cache)
            total += sum(int(a.nbytes) for a in arrays if a is not None)
    return total


@pytest.mark.model
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3", "tiny-qwen3-next", "tiny-mamba2"])
def test_padded_bytes_equal_the_engines_cache_arrays_at_every_step(name):
    model, tokenizer = wb.load(f"data/models/{name}")
    sched = wb.Scheduler(model, tokenizer, max_batch=3)
    for n, m in [(5, 6), (37, 3), (20, 9), (300, 4), (12, 5)]:
        sched.submit(wb.Request(prompt=list(range(1, n + 1)), max_tokens=m))
    seen_free = 0
    while not sched.idle:
        for call in (sched.admit, sched.step, sched.filter):
            call()
            snap = sched.snapshot()
            row = step_layout(snap, blocks=(1, 16))
            assert row["padded_bytes"] == snap.kv_bytes == _allocated_bytes(sched)
            if snap.batch_size:
                assert row["padded_data_bytes"] == row["paged_bytes_b1"] <= row["paged_bytes_b16"]
            if name == "tiny-mamba2":  # states only: paging changes nothing but the free slots
                assert row["paged_bytes_b16"] == row["padded_bytes"] - row["padded_free_bytes"]
            seen_free += snap.free_slots
    assert seen_free > 0  # a filter left free slots, and the sum still matched


@pytest.mark.model
def test_token_bytes_equal_the_kv_profile_and_b1_holds_exactly_the_tokens(random_llama):
    from workbench.engine.kv.profile import kv_profile

    model, tokenizer = random_llama
    sched = wb.Scheduler(model, tokenizer, max_batch=2)
    for n in (5, 37):
        sched.submit(wb.Request(prompt=list(range(1, n + 1)), max_tokens=4))
    sched.admit()
    snap = sched.snapshot()
    full = snap.group("full")
    assert full.token_bytes == sum(lb.per_token_bytes for lb in kv_profile(model))
    row = step_layout(snap, blocks=(1, 16))
    assert row["paged_bytes_b1"] == row["padded_data_bytes"] == sum(snap.context_tokens) * full.token_bytes
    assert row["paged_bytes_b16"] == (1 + 3) * 16 * full.token_bytes
