"""Free slots: a joiner written into the cache row of a request evicted since the last
step, instead of mlx-lm's filter (copy) + extend (copy)."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache

import workbench as wb
from workbench.engine.kv import cache_internals as slots
from workbench.verify import oracle


def _kv(tokens: list[list[float]], width: int) -> BatchKVCache:
    """A 1-head, head_dim-1 batch cache whose row b holds ``tokens[b]`` right-aligned."""
    solo = []
    for t in tokens:
        c = KVCache()
        if t:
            a = mx.array(t, dtype=mx.float32).reshape(1, 1, -1, 1)
            c.update_and_fetch(a, a * 10)
        solo.append(c)
    cache = BatchKVCache.merge(solo)
    assert slots.fill_width([cache]) == width  # the write index
    return cache


def test_fill_slots_writes_the_worked_example_of_the_module_docstring():
    running = _kv([[1, 2, 3, 4], [5, 6, 7, 8], [2, 3, 4]], width=4)  # row 1 (uid 7) finished
    joiner = _kv([[9, 9, 9], [8, 9]], width=3)  # joiner row 1: tokens x y = 8 9
    slots.fill_slots([running], [1], [joiner], [1], [2])
    keys = np.array(running.keys[:, 0, : slots.fill_width([running]), 0])
    assert keys.tolist() == [[1, 2, 3, 4], [0, 0, 8, 9], [0, 2, 3, 4]]
    assert np.array(running.values[1, 0, :4, 0]).tolist() == [0, 0, 80, 90]
    assert np.array(running.left_padding).tolist() == [0, 2, 1]
    assert np.array(running.offset).tolist() == [4, 2, 3]


def test_filled_slot_masks_the_same_keys_as_filter_then_extend():
    running = _kv([[1, 2, 3, 4, 5], [6, 7, 8, 9, 1], [3, 4]], width=5)
    joiner = _kv([[7, 8, 9]], width=3)
    slots.fill_slots([running], [0], [joiner], [0], [3])
    reference = _kv([[1, 2, 3, 4, 5], [6, 7, 8, 9, 1], [3, 4]], width=5)
    reference.filter([1, 2])
    reference.extend(_kv([[7, 8, 9]], width=3))

    def attended(cache, b):  # the keys row b attends at the next step, oldest first
        mask = np.array(cache.make_mask(1)).reshape(cache.left_padding.shape[0], -1)[b, :-1]
        return np.array(cache.keys[b, 0, : slots.fill_width([cache]), 0])[mask].tolist()

    for filled_row, reference_row in [(0, 2), (1, 0), (2, 1)]:
        assert attended(running, filled_row) == attended(reference, reference_row)


def test_can_fill_refuses_a_joiner_longer_than_the_write_index():
    running = _kv([[1, 2], [3, 4]], width=2)
    joiner = _kv([[1, 2, 3]], width=3)
    assert not slots.can_fill([running], [joiner], [3])
    with pytest.raises(ValueError, match="cannot take joiners"):
        slots.fill_slots([running], [0], [joiner], [0], [3])
    assert slots.fill_width([running]) == 2 and np.array(running.left_padding).tolist() == [0, 0]


def _staggered(make_sched, prompt, **kw):
    """uid 0 stops after 3 tokens while uid 1 runs; uid 2 arrives at step 2 and joins
    right after uid 0 is evicted."""
    sched = make_sched(max_batch=2, **kw)
    run = sched.run(
        arrivals=[
            (0, wb.Request(prompt=prompt(9, 0), max_tokens=3)),
            (0, wb.Request(prompt=prompt(30, 50), max_tokens=16)),
            (2, wb.Request(prompt=prompt(6, 300), max_tokens=10)),
        ]
    )
    return sched, run


@pytest.mark.model
def test_row_joining_into_a_finished_rows_slot_matches_solo_run(make_sched, prompt, bundled):
    sched, _ = _staggered(make_sched, prompt)
    evicted = next(e for e in sched.events if e.kind == "evict")
    joined = [e for e in sched.events if e.kind == "join" and e.uid == 2][0]
    assert evicted.uid == 0 and joined.row == evicted.row == 0  # the joiner took uid 0's row
    assert joined.join_mode == "free slot"
    check = oracle.solo_check(bundled[0], sched)
    assert len(check.rows) == 3 and all(r.match for r in check.rows), check.describe()


@pytest.mark.model
def test_reusing_slots_or_not_gives_the_same_tokens(make_sched, prompt):
    reused, _ = _staggered(make_sched, prompt)
    copied, _ = _staggered(make_sched, prompt, reuse_slots=False)
    last = [e for e in copied.events if e.kind == "join"][-1]
    assert (last.row, last.join_mode) == (1, "extend")
    for uid in range(3):
        assert reused.tokens(uid) == copied.tokens(uid)
        assert reused.logprobs(uid) == copied.logprobs(uid)


def _one_row_evicted(make_sched, prompt, short_tokens, long_tokens, long_start, long_max_tokens):
    """Two rows; the short one (2 tokens) is evicted by ``filter()`` after two steps."""
    sched = make_sched(max_batch=2)
    sched.submit(wb.Request(prompt=prompt(short_tokens, 0), max_tokens=2))
    sched.submit(wb.Request(prompt=prompt(long_tokens, long_start), max_tokens=long_max_tokens))
    sched.admit()
    sched.step(), sched.step()
    sched.filter()
    return sched


@pytest.mark.model
def test_snapshot_after_filter_shows_free_slots_and_the_compacted_geometry(make_sched, prompt):
    sched = _one_row_evicted(make_sched, prompt, 9, 20, 50, 8)
    snap = sched.snapshot()
    assert snap.uids == (1,) and snap.free_slots == 1
    assert "free slots: 1" in snap.text()
    assert sched.batch_cache[0].keys.shape[0] == 1  # the view leaves the free slot out
    assert sched.batch.caches[0].keys.shape[0] == 2  # still allocated, counted in kv_bytes
    assert snap.kv_bytes == sum(c.nbytes for c in sched.batch.caches)
    sched.admit()  # nobody to join: the free slot is dropped
    after = sched.snapshot()
    assert after.free_slots == 0 and sched.batch.caches[0].keys.shape[0] == 1
    assert after.left_padding.tolist() == snap.left_padding.tolist() == [0]
    assert np.array_equal(after.group("full").mask, snap.group("full").mask)


@pytest.mark.model
def test_joiner_longer_than_the_batch_width_is_appended_and_matches_solo(make_sched, prompt, bundled):
    sched = _one_row_evicted(make_sched, prompt, 4, 5, 20, 12)
    sched.submit(wb.Request(prompt=prompt(40, 100), max_tokens=6))  # 40 > the width of 7
    joined = [e for e in sched.admit() if e.kind == "join"]
    assert (joined[0].row, joined[0].join_mode) == (1, "extend") and sched.snapshot().free_slots == 0
    sched.run()
    check = oracle.solo_check(bundled[0], sched)
    assert len(check.rows) == 3 and all(r.match for r in check.rows), check.describe()


@pytest.mark.model
def test_width_stays_bounded_while_rows_keep_being_replaced(make_sched, prompt, bundled):
    sched = make_sched(max_batch=3)
    for i in range(24):  # a queue that refills every finished row at once
        sched.submit(wb.Request(prompt=prompt(8, 10 * i), max_tokens=5 + 3 * (i % 4)))
    widths = []
    while not sched.idle:
        sched.admit()
        sched.step()
        sched.filter()
        widths.append(sched.snapshot().kv_width_tokens)
    joins = [e.join_mode for e in sched.events if e.kind == "join"]
    assert joins.count("free slot") >= 18  # all but the first rows
    assert max(widths) <= 4 * (8 + 14)  # trimmed: never the sum of the rows' lifetimes
    check = oracle.solo_check(bundled[0], sched)
    assert len(check.rows) == 24 and all(r.match for r in check.rows), check.describe()


def _priority_preemption(make_sched, prompt, bundled, reuse):
    from workbench.engine.kv.ledger import alone_bytes

    one = alone_bytes(bundled[0], 10, 16)  # what one such row holds (256 positions)
    s = make_sched(max_batch=4, kv_budget_bytes=3 * one, policy="priority", reuse_slots=reuse)
    s.submit(wb.Request(prompt=prompt(10, 0), max_tokens=2))  # uid 0: finishes first
    for start in (30, 60):
        s.submit(wb.Request(prompt=prompt(10, start), max_tokens=16))
    s.admit(), s.step(), s.step(), s.filter()
    s.submit(wb.Request(prompt=prompt(10, 90), max_tokens=16))  # uid 3 joins last (into uid 0's slot)
    s.admit(), s.step()
    s.submit(wb.Request(prompt=prompt(10, 120), max_tokens=16, priority=5))
    s.admit()
    return [e.uid for e in s.events if e.kind == "preempt"], [
        e.join_mode for e in s.events if e.kind == "join"
    ]


@pytest.mark.model
def test_preemption_takes_the_latest_joined_row_wherever_its_slot_is(make_sched, prompt, bundled):
    reused, joins = _priority_preemption(make_sched, prompt, bundled, True)
    copied, _ = _priority_preemption(make_sched, prompt, bundled, False)
    assert "free slot" in joins
    assert reused == copied == [3]


@pytest.mark.model
@pytest.mark.parametrize("interleave", [False, True])
def test_every_group_of_one_admit_can_take_a_free_slot(make_sched, prompt, interleave):
    s = make_sched(max_batch=4, prompt_concurrency=1, interleave_prefill=interleave)
    for i in range(3):
        s.submit(wb.Request(prompt=prompt(8, 10 * i), max_tokens=2))
    s.submit(wb.Request(prompt=prompt(30, 100), max_tokens=12))
    while len(s.snapshot().uids) < 4:
        s.admit()
    s.step(), s.step(), s.filter()
    for i in range(3):
        s.submit(wb.Request(prompt=prompt(5, 300 + 10 * i), max_tokens=4))
    joins = [e.join_mode for e in s.admit() if e.kind == "join"]
    if interleave:  # one chunk per admit: the first group joins, the other slots wait for the next calls
        assert joins == ["free slot"]
    else:
        assert joins == ["free slot"] * 3


@pytest.mark.model
def test_record_after_an_admit_that_only_drops_free_slots_is_fresh(make_sched, prompt):
    s = _one_row_evicted(make_sched, prompt, 9, 20, 50, 8)
    assert s.snapshot(record=True).free_slots == 1
    assert s.admit() == []  # nobody to join: the slot is dropped, no event
    assert s.snapshot(record=True).free_slots == 0 and s.record().kv_bytes == s.snapshot().kv_bytes
