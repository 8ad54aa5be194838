"""A packed forward of one row's prefill run as mlx-lm runs a prompt chunk
(``packed/row_prefill.py``): its index (a slice where the slots are contiguous, the request's
slots where it attends earlier keys), its logits and pools against mlx-lm and the masked
reference path, and a scheduler whose prompts arrive alone takes it with rows equal to their
runs alone, snapshots and events unchanged."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

import workbench as wb
from tests.engine.test_packed import check_books, packed
from workbench.engine.packed import attention, grouped
from workbench.engine.packed import row_prefill as row_prefill_mod
from workbench.engine.packed.attention import Pools, packed_forward
from workbench.engine.packed.pages import PageTable
from workbench.engine.packed.row_prefill import row_index, row_prefill
from workbench.observe.packed import Chunk
from workbench.verify import oracle
from workbench.workloads.workload import prompt_of_length


def test_only_one_chunk_is_a_row_prefill():
    assert row_prefill([Chunk(0, 0, 5, "prefill")])
    assert row_prefill([Chunk(0, 8, 3, "prefill", samples=False)])
    assert row_prefill([Chunk(0, 16, 1, "prefill")])
    assert not row_prefill([])
    assert not row_prefill([Chunk(0, 4, 1, "decode"), Chunk(1, 0, 5, "prefill")])
    assert not row_prefill([Chunk(0, 0, 3, "prefill"), Chunk(1, 0, 5, "prefill")])


def test_the_row_index_writes_a_slice_where_the_slots_are_contiguous_and_reads_the_requests_slots():
    t = PageTable(4)
    t.reserve(0, 6)  # pages [0, 1]
    ix = row_index(t, Chunk(0, 0, 6, "prefill"))
    assert ix.start == 0 and ix.write == slice(0, 6) and ix.keys is None
    t.reserve(9, 4)  # page 2 to a decoy, so uid 0's next page is 3
    t.reserve(0, 11)
    later = row_index(t, Chunk(0, 6, 5, "prefill"))
    assert later.start == 6
    assert later.write.tolist() == t.slots(0, 6, 11) == [6, 7, 12, 13, 14]
    assert later.keys.tolist() == t.slots(0, 0, 11) and later.keys.dtype == np.int32
    t.free(9)
    assert row_index(t, Chunk(0, 8, 3, "prefill")).write == slice(12, 15)


def test_a_row_prefill_beyond_its_pages_is_refused_naming_the_uid():
    t = PageTable(4)
    t.reserve(3, 5)
    with pytest.raises(ValueError, match="uid 3: positions up to 8 but only 2 page"):
        row_index(t, Chunk(3, 2, 7, "prefill"))


@pytest.mark.model
def test_a_prompt_in_chunks_over_scattered_pages_gives_mlx_lms_logits_and_the_masked_paths_pools(bundled):
    """The prompt in two chunks (the second attends the first's keys from the pool), its pages
    out of order; the logits equal mlx-lm's over one cache, the pools the reference path's."""
    model, tok = bundled
    ids = tok.encode("def add(a, b):\n    return a + b\n\nclass A:\n    pass\n")
    cut = 11
    cache = make_prompt_cache(model)
    want = [model(mx.array([part]), cache=cache)[0, -1] for part in (ids[:cut], ids[cut:])]

    def run(masked):
        table, pools = PageTable(4), Pools(len(model.model.layers))
        table.reserve(9, 8)
        table.reserve(0, cut)
        table.free(9)  # uid 0's next pages come from the freed decoy's, before its own
        out = [packed_forward(model, pools, table, [Chunk(0, 0, cut, "prefill")], ids[:cut], masked)]
        table.reserve(0, len(ids))
        out.append(
            packed_forward(model, pools, table, [Chunk(0, cut, len(ids) - cut, "prefill")], ids[cut:], masked)
        )
        return out, pools, table.slots(0, 0, len(ids))

    (fast, pools, slots), (ref, ref_pools, ref_slots) = run(False), run(True)
    assert slots == ref_slots and slots != sorted(slots)
    for got, expected, reference in zip(fast, want, ref, strict=True):
        assert got.shape == (1, model.args.vocab_size)
        assert mx.allclose(got[0], expected, atol=1e-4).item()
        assert mx.allclose(got, reference, atol=1e-5).item()
    at = mx.array(slots)
    for a, b in zip(pools.keys + pools.values, ref_pools.keys + ref_pools.values, strict=True):
        assert mx.allclose(a[at], b[at], atol=1e-5).item()


@pytest.mark.model
def test_a_chunk_that_does_not_sample_writes_its_keys_and_returns_no_logits(bundled):
    model, tok = bundled
    ids = tok.encode("import os\nimport sys\n")
    table, pools = PageTable(4), Pools(len(model.model.layers))
    table.reserve(0, len(ids))
    out = packed_forward(model, pools, table, [Chunk(0, 0, len(ids), "prefill", samples=False)], ids)
    assert out.shape[0] == 0
    keys = pools.keys[0][mx.array(table.slots(0, 0, len(ids)))]
    assert float(mx.abs(keys).sum()) > 0


@pytest.mark.model
def test_prompts_alone_take_the_row_path_with_rows_equal_to_their_runs_alone(bundled, monkeypatch):
    """Requests arriving one after another's end: every forward carrying a prefill is one row's
    chunk (16 tokens a forward: longer prompts in several chunks), none of them goes by groups or
    by per-token RoPE, the books hold after every call, and each row equals mlx-lm alone."""
    model, tok = bundled
    by_groups, rows, per_token = [], [], []
    original, row_forward = grouped.grouped_attention, attention.row_prefill_forward
    monkeypatch.setattr(
        attention, "grouped_attention", lambda *a, **k: by_groups.append(1) or original(*a, **k)
    )
    monkeypatch.setattr(
        attention, "row_prefill_forward", lambda *a, **k: rows.append(a[3]) or row_forward(*a, **k)
    )
    rope_call = attention.PerTokenRoPE.__call__
    monkeypatch.setattr(
        attention.PerTokenRoPE,
        "__call__",
        lambda self, x, offset=0: per_token.append(1) or rope_call(self, x, offset),
    )
    sched = packed(model, tok, history_size=8)
    uids = []
    for i, n in enumerate((3, 40, 17)):
        uids.append(
            sched.submit(wb.Request(prompt=prompt_of_length(tok, n, 7 * i), max_tokens=5, stop_ids=[]))
        )
        while not sched.idle:
            for call in (sched.admit, sched.step, sched.filter):
                call()
                check_books(sched)
    assert [(c.start, c.n_tokens) for c in rows] == [(0, 3), (0, 16), (16, 16), (32, 8), (0, 16), (16, 1)]
    assert not by_groups and not per_token
    assert [e.n_tokens for e in sched.events if e.kind == "prefill"] == [3, 16, 16, 8, 16, 1]
    check = oracle.solo_check(model, sched, uids, atol=1e-4)
    assert check.ok, check.text()


@pytest.mark.model
def test_the_last_layer_of_a_sampling_chunk_attends_for_its_last_token_only(bundled, monkeypatch):
    """In a chunk that samples only the last layer takes the last-query attention (the LM head
    reads its last token alone); the logits are mlx-lm's and the masked path's, every position's
    keys are in the pools; a chunk that does not sample attends every query in every layer."""
    model, tok = bundled
    ids = prompt_of_length(tok, 90, 5)
    n_layers = len(model.model.layers)
    calls, attend = [], row_prefill_mod.RowPrefillLayer.last_query_attention
    monkeypatch.setattr(
        row_prefill_mod.RowPrefillLayer,
        "last_query_attention",
        lambda self, q, scale: calls.append((self.layer, q.shape[2])) or attend(self, q, scale),
    )

    def forward(masked, samples=True):
        table, pools = PageTable(4), Pools(n_layers)
        table.reserve(9, 12)
        table.reserve(0, len(ids))
        table.free(9)
        chunk = Chunk(0, 0, len(ids), "prefill", samples=samples)
        return packed_forward(model, pools, table, [chunk], ids, masked), pools, table

    (got, pools, table), (ref, ref_pools, _) = forward(False), forward(True)
    assert calls == [(n_layers - 1, len(ids))]
    assert mx.allclose(got[0], model(mx.array(ids)[None])[0, -1], atol=1e-4).item()
    assert mx.allclose(got, ref, atol=1e-5).item()
    at = mx.array(table.slots(0, 0, len(ids)))
    for a, b in zip(pools.keys + pools.values, ref_pools.keys + ref_pools.values, strict=True):
        assert mx.allclose(a[at], b[at], atol=1e-5).item()
    calls.clear()
    quiet, quiet_pools, _ = forward(False, samples=False)
    mx.eval(quiet_pools.keys, quiet_pools.values)
    assert quiet.shape[0] == 0 and not calls
    for a, b in zip(quiet_pools.keys + quiet_pools.values, pools.keys + pools.values, strict=True):
        assert mx.allclose(a[at], b[at], atol=1e-5).item()


@pytest.mark.model
def test_a_long_prompt_alone_in_one_forward_gives_its_row_equal_to_its_run_alone(bundled):
    model, tok = bundled
    sched = packed(model, tok, max_num_batched_tokens=256, history_size=4)
    uid = sched.submit(wb.Request(prompt=prompt_of_length(tok, 150, 3), max_tokens=6, stop_ids=[]))
    while not sched.idle:
        for call in (sched.admit, sched.step, sched.filter):
            call()
            check_books(sched)
    assert [e.n_tokens for e in sched.events if e.kind == "prefill"] == [150]
    check = oracle.solo_check(model, sched, [uid], atol=1e-4)
    assert check.ok, check.text()
