"""The packed layout's pure parts: the page table, the iteration plan, the settings."""

import pytest

import workbench as wb
from workbench.engine.kv.allocation import RowTokens
from workbench.engine.packed.ledger import PagePlan
from workbench.engine.packed.pages import PageTable
from workbench.engine.packed.plan import Want, plan_chunks
from workbench.observe.packed import Chunk


def test_a_freed_page_is_the_next_one_handed_out():
    t = PageTable(4)
    assert t.reserve(0, 6) == [0, 1] and t.reserve(1, 3) == [2]
    assert t.slots(0, 4, 6) == [4, 5] and t.slots(1, 0, 3) == [8, 9, 10]
    assert t.free(0) == [0, 1]
    assert t.free_list == [0, 1]
    assert t.reserve(2, 1) == [0]  # reused at once: no new page
    assert t.capacity == 3 and t.used == 2


def test_reserving_more_positions_adds_pages_only_at_page_boundaries():
    t = PageTable(4)
    t.reserve(7, 4)
    assert t.reserve(7, 4) == [] and t.reserve(7, 5) == [1]
    assert t.pages_for(0) == 0 and t.pages_for(9) == 3


def test_a_position_past_the_pages_is_refused_naming_the_uid():
    t = PageTable(4)
    t.reserve(3, 2)
    with pytest.raises(ValueError, match="uid 3: positions up to 4 but only 1 page"):
        t.slots(3, 0, 5)


def test_a_clone_of_the_page_table_is_independent():
    t = PageTable(2)
    t.reserve(0, 3)
    c = t.clone()
    t.free(0)
    assert c.pages == {0: [0, 1]} and c.free_list == [] and t.free_list == [0, 1]


def test_hybrid_plan_puts_every_decode_token_first_then_prefill_chunks_up_to_the_budget():
    wants = [Want(0, 5, 6, True), Want(1, 0, 10, False), Want(2, 2, 3, True), Want(3, 0, 4, False)]
    assert plan_chunks(wants, 8) == (
        Chunk(0, 5, 1, "decode"),
        Chunk(2, 2, 1, "decode"),
        Chunk(1, 0, 6, "prefill", samples=False),
    )
    assert plan_chunks(wants, 16) == (
        Chunk(0, 5, 1, "decode"),
        Chunk(2, 2, 1, "decode"),
        Chunk(1, 0, 10, "prefill"),
        Chunk(3, 0, 4, "prefill"),
    )


def test_prefill_first_stalls_decodes_and_decode_first_holds_prefills_back():
    wants = [Want(0, 5, 6, True), Want(1, 0, 10, False)]
    assert plan_chunks(wants, 4, "prefill-first") == (Chunk(1, 0, 4, "prefill", samples=False),)
    assert plan_chunks(wants, 4, "decode-first") == (Chunk(0, 5, 1, "decode"),)
    assert plan_chunks([Want(1, 0, 10, False)], 4, "decode-first") == (
        Chunk(1, 0, 4, "prefill", samples=False),
    )


def test_a_plan_with_more_decoding_rows_than_budget_is_refused():
    with pytest.raises(ValueError, match="3 decoding rows but a token budget of 2"):
        plan_chunks([Want(u, 1, 2, True) for u in range(3)], 2)
    with pytest.raises(ValueError, match="schedule must be one of"):
        plan_chunks([], 2, "fastest")


def test_the_page_plan_reserves_prompt_plus_max_tokens_in_whole_pages():
    plan = PagePlan(16, 1000, rows=((0, 2), (1, 3)))
    assert plan.projected_bytes() == 5000
    assert plan.projected_bytes([RowTokens(9, 10, 33)], dropped=[1]) == (2 + 3) * 1000


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(layout="ragged"), "layout must be one of"),
        (dict(page_size=0), "page_size must be an int >= 1"),
        (dict(page_size=129), r"page_size must be an int in \[1, 128\].*got 129"),
        (dict(layout="packed", page_size=1_000_000), r"page_size must be an int in \[1, 128\]"),
        (dict(max_num_batched_tokens=0), "max_num_batched_tokens must be an int >= 1"),
        (
            dict(layout="packed", max_batch=8, max_num_batched_tokens=4),
            r"max_num_batched_tokens must be >= max_batch \(8\)",
        ),
        (dict(packed_schedule="greedy"), "packed_schedule must be one of"),
    ],
)
def test_packed_settings_outside_their_limits_are_refused_naming_the_field(settings, message):
    with pytest.raises(ValueError, match=message):
        wb.SchedulerConfig(**settings)


def test_the_padded_layout_stays_the_default_and_the_budget_defaults_to_the_prefill_chunk():
    cfg = wb.SchedulerConfig(prefill_step_size=64)
    assert cfg.layout == "padded" and cfg.page_size == 16 and cfg.token_budget == 64
    assert wb.SchedulerConfig(max_num_batched_tokens=32).token_budget == 32


@pytest.mark.parametrize("page_size", [1, 128])
def test_the_page_size_limits_are_accepted(page_size):
    assert wb.SchedulerConfig(layout="packed", page_size=page_size).page_size == page_size
