"""The packed forward's index arrays built by numpy in one pass (``packed/indices.py``) equal
the ones built position by position from the page table (``PageTable.slots``), on page
tables shaped by reserves, frees (pages reused out of order), forks (shared pages) and
copy-on-write; ``PageTable.prepare`` equals copy-on-write then reserve span by span; and
the request state's ``n_inputs`` / ``inputs_slice`` equal ``inputs``."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.engine.packed.indices import forward_index
from workbench.engine.packed.pages import PageTable
from workbench.observe.packed import Chunk


def loop_arrays(t: PageTable, chunks):
    """The index arrays as the packed forward built them before ``indices.py``."""
    positions = [p for c in chunks for p in range(c.start, c.end)]
    write = [s for c in chunks for s in t.slots(c.uid, c.start, c.end)]
    ends = np.cumsum([c.n_tokens for c in chunks]) - 1
    sampled = [int(e) for c, e in zip(chunks, ends) if c.samples]
    L = max(c.end for c in chunks)
    grid = np.zeros((len(chunks), L), np.int32)
    for r, c in enumerate(chunks):
        grid[r, : c.end] = t.slots(c.uid, 0, c.end)
    return positions, write, sampled, grid


@st.composite
def tables(draw):
    """A page table after random reserves, frees, forks and copy-on-writes, and chunks over
    its requests (each at most its pages' positions)."""
    P = draw(st.integers(1, 5))
    t, lengths = PageTable(P), {}
    for uid in range(draw(st.integers(1, 7))):
        op = draw(st.sampled_from(["reserve", "free", "fork"]))
        if op == "free" and lengths:
            gone = draw(st.sampled_from(sorted(lengths)))
            t.free(gone)
            lengths.pop(gone)
        elif op == "fork" and lengths:
            src = draw(st.sampled_from(sorted(lengths)))
            t.fork(src, uid)
            lengths[uid] = lengths[src]
            t.copy_on_write(uid, max(lengths[uid] - 1, 0), lengths[uid])
        n = draw(st.integers(1, 30))
        lengths[uid] = max(lengths.get(uid, 0), n)
        t.reserve(uid, lengths[uid])
    chunks = []
    for uid, n in sorted(lengths.items()):
        end = draw(st.integers(1, n))
        start = draw(st.integers(0, end - 1))
        kind = "decode" if end - start == 1 else "prefill"
        chunks.append(Chunk(uid, start, end - start, kind, samples=draw(st.booleans())))
    return t, chunks


@settings(max_examples=200, deadline=None)
@given(tables())
def test_the_index_arrays_equal_the_page_tables_slots_position_by_position(case):
    t, chunks = case
    ix = forward_index(t, chunks)
    ix.check(chunks)
    positions, write, sampled, grid = loop_arrays(t, chunks)
    assert ix.positions().tolist() == positions
    assert ix.write().tolist() == write
    assert ix.sampled().tolist() == sampled
    assert ix.slot_grid(0, len(chunks)).tolist() == grid.tolist()
    assert (
        ix.slot_grid(1, len(chunks)).tolist()
        == (grid[1:, : max([c.end for c in chunks[1:]] or [0])]).tolist()
    )
    for r, c in enumerate(chunks):
        pages = t.pages[c.uid][: t.pages_for(c.end)]
        assert ix.page_grid(r, r + 1)[0].tolist() == pages


def test_a_chunk_past_its_pages_is_refused_naming_the_uid():
    t = PageTable(4)
    t.reserve(0, 8)
    t.reserve(3, 2)
    chunks = [Chunk(0, 7, 1, "decode"), Chunk(3, 0, 5, "prefill")]
    with pytest.raises(ValueError, match="uid 3: positions up to 4 but only 1 page"):
        forward_index(t, chunks).check(chunks)


def test_n_inputs_and_inputs_slice_equal_the_inputs_list():
    model, tok = wb.load("tiny-code")
    sched = wb.Scheduler(model, tok, layout="packed")
    s = sched.state.requests[sched.submit(wb.Request(prompt=[5, 6, 7], max_tokens=4))]
    s.tokens += [8, 9]
    assert s.n_inputs == len(s.inputs) == 5
    for a in range(6):
        for b in range(a, 6):
            assert s.inputs_slice(a, b) == s.inputs[a:b]


@settings(max_examples=200, deadline=None)
@given(tables(), st.integers(1, 6))
def test_prepare_equals_copy_on_write_then_reserve_span_by_span(case, grow):
    t, chunks = case
    spans = [(c.uid, c.start, c.end + grow * (c.kind == "decode")) for c in chunks]
    loop = t.clone()
    expected = []
    for uid, start, end in spans:
        expected += loop.copy_on_write(uid, start, end)
        loop.reserve(uid, end)
    assert t.prepare(spans) == expected
    assert (t.pages, t.refs, t.free_list, t.capacity) == (
        loop.pages,
        loop.refs,
        loop.free_list,
        loop.capacity,
    )
    assert t.problems() == []
