"""Prefix caching in the packed layout's pure parts: the prefix index, shared and cached
pages with their reference counts, copy-on-write, LRU eviction under the page limit, and
the page plan counting a shared page once (hand-built tables, exact expected values)."""

from workbench.engine.kv.allocation import RowTokens
from workbench.engine.packed.ledger import PagePlan
from workbench.engine.packed.pages import PageTable
from workbench.engine.packed.prefix import PrefixIndex

A = [10, 11, 12, 13, 14, 15, 16, 17, 18]  # 9 tokens: two whole pages of 4 and one more


def written(table: PageTable, uid: int, tokens: list[int], end: int | None = None) -> None:
    """``uid`` holds ``tokens[:end]`` in its pages, indexed as a forward leaves them."""
    end = len(tokens) if end is None else end
    table.reserve(uid, end)
    table.register(uid, tokens, 0, end)


def test_a_prefix_matches_whole_pages_after_the_same_parents_only():
    ix = PrefixIndex()
    assert ix.add(0, -1, (1, 2), 1) and ix.add(3, 0, (3, 4), 1)
    assert not ix.add(5, -1, (1, 2), 1)  # the key is page 0's
    assert not ix.add(6, 9, (7, 8), 1)  # its parent is not indexed
    handouts = {0: 1, 3: 1}
    assert ix.match([1, 2, 3, 4, 5], 2, handouts) == [0, 3]
    assert ix.match([1, 2, 3, 4], 2, handouts) == [0]  # the last token is always computed
    assert ix.match([3, 4, 1, 2, 0], 2, handouts) == []  # the same tokens at other positions
    assert ix.match([1, 2, 9, 9, 9], 2, handouts) == [0]


def test_forgetting_a_page_forgets_the_pages_keyed_under_it():
    ix = PrefixIndex()
    for page, parent, tokens in ((0, -1, (1, 2)), (3, 0, (3, 4)), (4, 3, (5, 6)), (7, -1, (9, 9))):
        assert ix.add(page, parent, tokens, 1)
    assert ix.forget(3) == [3, 4]
    assert 0 in ix and 7 in ix and 3 not in ix and 4 not in ix
    ix.add(3, -1, (5, 5), 2)  # page 3 reused for another prefix: nothing under it
    assert ix.match([5, 5, 5, 6, 0], 2, {0: 1, 3: 2, 7: 1}) == [3]


def test_an_entry_whose_page_was_handed_out_again_is_stale():
    ix = PrefixIndex()
    ix.add(2, -1, (1, 2), 1)
    assert ix.match([1, 2, 3], 2, {2: 2}) == [] and 2 not in ix


def test_a_later_request_shares_the_full_pages_of_its_prefix_and_counts_go_up():
    t = PageTable(4, cache_pages=8)
    written(t, 0, A)
    assert t.pages[0] == [0, 1, 2] and 2 not in t.index  # the third page is not full
    b = A[:8] + [99, 98]
    hit = t.match(b)
    assert hit == [0, 1]
    t.share(1, hit)
    t.reserve(1, len(b))
    assert t.pages[1] == [0, 1, 3] and t.refs == {0: 2, 1: 2, 2: 1, 3: 1} and t.used == 4
    assert t.problems() == []


def test_freed_pages_come_back_when_their_count_reaches_zero_indexed_ones_cached():
    t = PageTable(4, cache_pages=8)
    written(t, 0, A)
    t.share(1, t.match(A))
    assert t.free(0) == [2]  # pages 0 and 1 are still uid 1's
    assert t.free_list == [2] and t.cached == []
    assert t.free(1) == [0, 1]
    assert t.cached == [1, 0]  # the tail first: the prefix outlives it
    assert t.match(A) == [0, 1] and t.problems() == []


def test_a_write_into_a_shared_page_copies_it_first():
    t = PageTable(4)
    t.reserve(0, 6)  # pages [0, 1], page 1 half full
    t.fork(0, 1)
    assert t.refs == {0: 2, 1: 2}
    assert t.copy_on_write(1, 6, 7) == [(1, 2)]
    assert t.pages == {0: [0, 1], 1: [0, 2]} and t.refs == {0: 2, 1: 1, 2: 1}
    assert t.copy_on_write(0, 6, 7) == []  # page 1 is uid 0's alone now
    assert t.problems() == []


def test_the_least_recently_used_cached_page_is_evicted_at_the_page_limit():
    t = PageTable(4, max_pages=4, cache_pages=8)
    written(t, 0, A[:8] + [0])  # pages 0, 1 indexed; page 2 not
    t.free(0)
    assert t.free_list == [2] and t.cached == [1, 0]
    written(t, 1, [7] * 5)  # free page 2, a new page 3, then the LRU cached page: 1 (evicted)
    assert t.pages[1] == [2, 3] and t.capacity == 4
    t.reserve(1, 9)
    assert t.pages[1] == [2, 3, 1] and t.cached == [0] and 1 not in t.index
    assert t.match(A[:8] + [0]) == [0] and t.problems() == []


def test_at_most_cache_pages_are_kept_cached():
    t = PageTable(2, cache_pages=1)
    written(t, 0, [1, 2, 3, 4, 5])
    t.free(0)
    assert t.cached == [0] and t.free_list == [1, 2]  # page 1 (the tail) went first
    assert t.match([1, 2, 3, 4, 5]) == [0]


def test_a_savepoint_table_sees_a_cached_page_its_call_handed_out_again_as_stale():
    t = PageTable(4, max_pages=3, cache_pages=8)
    written(t, 0, A)
    t.free(0)
    savepoint = t.clone(share_handouts=True)
    t.reserve(1, 12)  # takes the free page, then evicts the cached ones and writes them
    assert t.match(A) == []
    assert savepoint.match(A) == [] and savepoint.cached == [] and savepoint.problems() == []
    checkpoint = PageTable(4, max_pages=3, cache_pages=8)
    written(checkpoint, 0, A)
    checkpoint.free(0)
    kept = checkpoint.clone()  # a checkpoint's pools keep their own buffers: its entries stay valid
    checkpoint.reserve(1, 12)
    assert kept.match(A) == [0, 1]


def test_the_page_plan_counts_a_shared_page_once_and_what_joiners_would_share():
    plan = PagePlan(4, 100, rows=((0, 3), (1, 4)), held=((0, (0, 1)), (1, (0, 1, 2))))
    assert plan.projected_bytes() == 100 * (3 + 1 + 1)  # pages 0, 1, 2 once; 1 + 1 still to come
    joining = lambda joiners: ({0, 1, 5}, 2)  # a joiner sharing pages 0 and 1, taking cached page 5
    plan = PagePlan(4, 100, rows=((0, 3),), held=((0, (0, 1)),), joining=joining)
    assert plan.projected_bytes([RowTokens(9, 0, 14)]) == 100 * (3 + 1 + 2)  # {0, 1, 5}, then 1 + 2
    assert plan.projected_bytes([RowTokens(9, 0, 14)], dropped=[0]) == 100 * (3 + 2)
