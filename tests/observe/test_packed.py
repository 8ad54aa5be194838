"""The packed layout as data: the block-diagonal causal mask, the page table, the budget split."""

import numpy as np
import pytest

from workbench.observe.packed import (
    Chunk,
    PackedState,
    budget_rows,
    budget_split,
    chunks_text,
    mask_text,
    packed_layout,
    packed_mask,
    page_table_text,
)

EXAMPLE = (Chunk(0, 3, 1, "decode"), Chunk(1, 0, 3, "prefill"))


def test_the_packed_mask_keeps_each_token_to_its_own_requests_earlier_positions():
    expected = np.array(
        [[1, 1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1]], bool
    )
    assert (packed_mask(EXAMPLE) == expected).all()
    qu, qp, ku, kp = packed_layout(EXAMPLE)
    assert qu.tolist() == [0, 1, 1, 1] and qp.tolist() == [3, 0, 1, 2]
    assert ku.tolist() == [0] * 4 + [1] * 3 and kp.tolist() == [0, 1, 2, 3, 0, 1, 2]


def test_a_prefill_chunk_after_cached_pages_attends_them_all():
    mask = packed_mask((Chunk(5, 2, 2, "prefill"),))
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_two_chunks_of_one_request_are_refused():
    with pytest.raises(ValueError, match="one chunk per request"):
        packed_mask((Chunk(0, 0, 1, "prefill"), Chunk(0, 1, 1, "prefill")))


def test_the_mask_text_labels_tokens_by_uid_and_position():
    assert mask_text(EXAMPLE).splitlines()[1:] == [
        "       0@3 ####|...",
        "       1@0 ....|#..",
        "       1@1 ....|##.",
        "       1@2 ....|###",
    ]


def test_the_page_table_text_and_the_bytes_it_counts():
    state = PackedState(
        4,
        100,
        4,
        pages=((0, (0, 2)), (1, (1,))),
        free_pages=(3,),
        held_tokens=((0, 5), (1, 4)),
        last_chunks=EXAMPLE,
        token_budget=8,
    )
    assert state.used_pages == 3 and state.held_bytes == 300 and state.token_bytes == 225
    assert page_table_text(state).splitlines() == [
        "page table: 3/4 pages of 4 tokens (100 bytes each): 300 bytes held, 225 bytes of tokens",
        "  uid 0: 5 tokens in pages [0, 2]",
        "  uid 1: 4 tokens in pages [1]",
        "  free pages: [3]",
    ]
    assert (
        chunks_text(EXAMPLE, 8).splitlines()[0]
        == "packed forward: decode 1 + prefill 3 = 4 tokens of a 8 budget"
    )


def test_a_shared_page_counts_once_and_the_text_marks_it_and_the_cached_pages():
    state = PackedState(
        4,
        100,
        6,
        pages=((0, (0, 1, 2)), (1, (0, 1, 3))),
        free_pages=(5,),
        held_tokens=((0, 9), (1, 10)),
        cached_pages=(4,),
    )
    assert state.used_pages == 4 and state.shared_pages == (0, 1)
    assert state.held_bytes == 400 and state.cached_bytes == 100
    assert page_table_text(state).splitlines() == [
        "page table: 4/6 pages of 4 tokens (100 bytes each): 400 bytes held, 475 bytes of tokens",
        "  uid 0: 9 tokens in pages [0*, 1*, 2]",
        "  uid 1: 10 tokens in pages [0*, 1*, 3]",
        "  free pages: [5]",
        "  cached pages (least recently used first): [4] (100 bytes); * shared: 2 page(s)",
    ]


def test_the_budget_rows_of_a_history_count_each_forward_once():
    class Snap:
        def __init__(self, step, chunks):
            self.step, self.packed = step, PackedState(4, 1, 0, last_chunks=chunks, token_budget=8)

    rows = budget_rows([Snap(1, EXAMPLE), Snap(1, EXAMPLE), Snap(2, (Chunk(0, 4, 1, "decode"),))])
    assert [(r.step, r.decode_tokens, r.prefill_tokens, r.budget_tokens) for r in rows] == [
        (1, 1, 3, 8),
        (2, 1, 0, 8),
    ]
    assert budget_split(()) == {"decode_tokens": 0, "prefill_tokens": 0, "tokens": 0}
