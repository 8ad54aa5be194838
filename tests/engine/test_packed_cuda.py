"""The packed layout's CUDA paged-attention kernel (``workbench.engine.packed.cuda_attention``):
its MLX-ops reference equals the gather path (``grouped_attention``'s decode group) on the CPU;
the dispatch (decode rows to the kernel, prefill chunks by groups, on CUDA only, off with
``decode_kernel=False``) is checked on the CPU with the reference standing in for the kernel;
the kernels' own CUDA source is run on the CPU by an emulation (``tests/engine/cuda_emulation.py``,
skipped without g++ and CUDA's headers) against the reference; the kernel itself is compared
with the reference on the GPU (``gpu`` tests: skipped elsewhere, with the reason)."""

import mlx.core as mx
import numpy as np
import pytest

import workbench as wb
from tests.engine.test_packed import SPECS, packed, staggered
from workbench.engine.packed import attention as pa
from workbench.engine.packed import cuda_attention as ca
from workbench.engine.packed.attention import Pools, packed_forward
from workbench.engine.packed.grouped import grouped_attention, groups_of
from workbench.engine.packed.pages import PageTable
from workbench.observe.packed import Chunk
from workbench.runtime import device
from workbench.verify import oracle


def scattered_table(page_size, lengths, seed=0):
    """A page table whose rows ``0 .. B-1`` hold ``lengths`` tokens in interleaved, out-of-order
    pages: a freed decoy's pages come back first, then the rows grow one page at a time in turn."""
    table = PageTable(page_size)
    rng = np.random.default_rng(seed)
    table.reserve(-1, int(rng.integers(1, 4)) * page_size)
    table.free(-1)
    for step in range(1, max(table.pages_for(n) for n in lengths) + 1):
        for uid in rng.permutation(len(lengths)):
            table.reserve(int(uid), min(int(lengths[uid]), step * page_size))
    return table


def decode_case(page_size, lengths, n_heads, n_kv, head_dim=64, dtype=mx.float32, seed=0):
    """``(table, chunks, queries [1, H, R, D], keys pool, values pool)`` of decode rows of ``lengths``."""
    table = scattered_table(page_size, lengths, seed)
    chunks = [Chunk(u, int(n) - 1, 1, "decode") for u, n in enumerate(lengths)]
    key = mx.random.key(seed)
    kq, kk, kv = mx.random.split(key, 3)
    N = table.capacity * page_size
    pools = [mx.random.normal((N, n_kv, head_dim), key=k).astype(dtype) for k in (kk, kv)]
    queries = mx.random.normal((1, n_heads, len(lengths), head_dim), key=kq).astype(dtype)
    return table, chunks, queries, *pools


def lengths_for(page_size, B, seed=0):
    """``B`` row lengths that include 1, a whole page, one past it, pages ending mid-page."""
    edge = [1, page_size, page_size + 1, 3 * page_size - 1, 2048]
    if B <= 1:
        return [1000]
    rng = np.random.default_rng(seed)
    return (edge + [int(n) for n in rng.integers(1, 2049, B)])[:B]


# -- on the CPU: the reference, the pages, the selection, the dispatch --


@pytest.mark.parametrize("n_heads, n_kv", [(32, 8), (8, 8), (9, 3)])
@pytest.mark.parametrize("page_size", [16, 32, 1, 7])
def test_the_reference_equals_the_gather_path(page_size, n_heads, n_kv):
    lengths = [1, page_size, page_size + 1, 3 * page_size - 1, 130, 77]
    table, chunks, q, k, v = decode_case(page_size, lengths, n_heads, n_kv)
    pages = ca.decode_pages(table, chunks)
    ref = ca.paged_decode_reference(q, k, v, pages, 64**-0.5)
    gathered = grouped_attention(q, k, v, groups_of(table, chunks), 64**-0.5)
    assert ref.shape == gathered.shape == (1, n_heads, len(lengths), 64) and ref.dtype == mx.float32
    assert mx.abs(ref - gathered).max().item() < 1e-5


def test_the_reference_equals_the_gather_path_over_128_rows():
    lengths = lengths_for(16, 128)
    lengths = [min(n, 300) for n in lengths]  # the CPU's time
    table, chunks, q, k, v = decode_case(16, lengths, 32, 8, seed=3)
    ref = ca.paged_decode_reference(q, k, v, ca.decode_pages(table, chunks), 0.125)
    gathered = grouped_attention(q, k, v, groups_of(table, chunks), 0.125)
    assert mx.abs(ref - gathered).max().item() < 1e-5


def test_the_reference_reads_only_each_rows_own_positions():
    """Poisoning every slot no row holds (and the positions past each row's length in its last
    page) changes nothing: the length mask and the page table are honoured."""
    table, chunks, q, k, v = decode_case(16, [5, 17, 40], 8, 2)
    pages = ca.decode_pages(table, chunks)
    before = ca.paged_decode_reference(q, k, v, pages, 0.125)
    held = np.zeros(k.shape[0], bool)
    for c in chunks:
        held[table.slots(c.uid, 0, c.end)] = True
    poison = mx.array(~held)[:, None, None]
    k2, v2 = mx.where(poison, mx.nan, k), mx.where(poison, mx.nan, v)
    assert mx.array_equal(ca.paged_decode_reference(q, k2, v2, pages, 0.125), before).item()


def test_decode_pages_are_each_rows_page_table_and_length():
    table = scattered_table(4, [5, 1, 12])
    chunks = [Chunk(0, 4, 1, "decode"), Chunk(1, 0, 1, "decode"), Chunk(2, 11, 1, "decode")]
    pages = ca.decode_pages(table, [*chunks, Chunk(7, 0, 3, "prefill")])
    assert pages.n_rows == 3 and pages.page_size == 4 and pages.max_length == 12
    assert pages.lengths.tolist() == [5, 1, 12]
    grid = pages.page_table.tolist()
    assert grid == [table.pages[0] + [0], table.pages[1] + [0, 0], table.pages[2]]
    assert ca.decode_pages(table, [Chunk(2, 0, 12, "prefill"), *chunks]) is None
    assert ca.leading_decodes([*chunks[:2], Chunk(2, 8, 4, "decode"), chunks[2]]) == 2
    with pytest.raises(ValueError, match=r"uid 1: 6 keys but only 1 page\(s\) of 4"):
        ca.decode_pages(table, [Chunk(1, 5, 1, "decode")])


def test_split_plan_fills_the_gpu_and_covers_every_page():
    assert ca.split_plan(128, 8, 128) == (1, 128)  # 1,024 blocks: no split
    for rows, pages in [(1, 128), (1, 3), (4, 64), (32, 128), (2, 1)]:
        splits, per = ca.split_plan(rows, 8, pages)
        assert splits * per >= pages > (splits - 1) * per
        assert per >= min(ca.LAYOUT.warps, pages)
        assert splits == 1 or rows * 8 * splits <= 2 * ca.TARGET_BLOCKS
    assert ca.split_plan(1, 8, 128, splits=7) == (7, 19)
    assert ca.split_plan(1, 8, 3, splits=7) == (3, 1)


def test_the_kernel_is_selected_on_cuda_only_for_the_shapes_it_serves(monkeypatch):
    pool = mx.zeros((8, 8, 64), mx.bfloat16)
    monkeypatch.setattr(device, "backend", lambda: "cpu")
    assert not pa.selected(None, 32, pool)
    assert pa.selected(True, 32, pool)  # forced: the CPU tests' stand-in
    monkeypatch.setattr(device, "backend", lambda: "cuda")
    assert pa.selected(None, 32, pool) and pa.selected(None, 8, pool)
    assert not pa.selected(False, 32, pool)
    assert not pa.selected(None, 32, None)  # no pool yet (no forward has written one)
    assert not pa.selected(None, 128, pool)  # 16 query heads per KV head: more than MAX_GROUP
    assert not pa.selected(None, 12, pool)  # not a multiple of the KV heads
    assert not pa.selected(None, 0, pool)
    assert not pa.selected(None, 32, mx.zeros((8, 8, 16), mx.float32))  # head dim 16
    assert not pa.selected(None, 32, mx.zeros((8, 8, 64), mx.int32))


def test_the_kernel_refuses_what_it_does_not_serve_before_launching():
    table, chunks, q, k, v = decode_case(16, [5, 9], 8, 2)
    pages = ca.decode_pages(table, chunks)
    with pytest.raises(ValueError, match=r"paged_decode_attention serves queries \[1, H, 2, D\]"):
        ca.paged_decode_attention(q.astype(mx.bfloat16), k, v, pages, 0.125)  # dtypes differ
    with pytest.raises(ValueError, match="got queries"):
        ca.paged_decode_attention(q[:, :, :1], k, v, pages, 0.125)  # not one query per row
    with pytest.raises(ValueError, match="got queries"):
        ca.paged_decode_attention(q[..., :16], k[..., :16], v[..., :16], pages, 0.125)


def _stand_in(calls):
    """The reference in the kernel's place (the CPU has no CUDA), recording each call's shapes."""

    def kernel(queries, k_pool, v_pool, pages, scale, splits=None):
        calls.append((queries.shape, pages.n_rows, pages.max_length))
        return ca.paged_decode_reference(queries, k_pool, v_pool, pages, scale)

    return kernel


@pytest.mark.parametrize("with_prefill", [True, False])
def test_decode_rows_go_to_the_kernel_and_prefill_chunks_by_groups(monkeypatch, with_prefill):
    calls = []
    monkeypatch.setattr(ca, "paged_decode_attention", _stand_in(calls))
    lengths = [9, 1, 33, 16]
    table = scattered_table(16, lengths + [40, 7])
    chunks = [Chunk(u, n - 1, 1, "decode") for u, n in enumerate(lengths)]
    if with_prefill:
        chunks += [Chunk(4, 30, 10, "prefill"), Chunk(5, 0, 7, "prefill")]
    T = sum(c.n_tokens for c in chunks)
    q = mx.random.normal((1, 8, T, 64), key=mx.random.key(5))
    k, v = (mx.random.normal((table.capacity * 16, 2, 64), key=mx.random.key(s)) for s in (6, 7))
    pages = ca.decode_pages(table, chunks)
    ours = ca.packed_attention(q, k, v, pages, groups_of(table, chunks[pages.n_rows :]), 0.125)
    theirs = grouped_attention(q, k, v, groups_of(table, chunks), 0.125)
    assert ours.shape == theirs.shape == (1, 8, T, 64)
    assert mx.abs(ours - theirs).max().item() < 1e-5
    assert calls == [((1, 8, 4, 64), 4, 33)]


def _staggered_packed(model, tok):
    """A packed scheduler (pages of 4, 16 tokens a forward) run over staggered arrivals, its books
    checked after every call (``tests/engine/test_packed.py``). Returns ``(scheduler, uids)``."""
    sched = packed(model, tok)
    return sched, staggered(sched, tok, SPECS[:4])


@pytest.mark.model
def test_fast_decode_false_keeps_a_packed_scheduler_off_the_kernel_through_fork_and_restore(
    bundled, monkeypatch
):
    """``Scheduler(fast_decode=False)`` reaches the packed forward (no kernel call where the kernel
    would be selected), and its forks and restores keep the choice; the default takes the kernel."""
    model, tok = bundled
    calls = []
    monkeypatch.setattr(ca, "paged_decode_attention", _stand_in(calls))
    monkeypatch.setattr(
        pa, "selected", lambda choice, n_heads, pool: choice is not False and ca.serves(n_heads, pool)
    )
    off = packed(model, tok, fast_decode=False, history_checkpoints=2)
    staggered(off, tok, SPECS[:2])
    fork = off.fork()
    fork.submit(wb.Request(prompt=tok.encode("import os\n"), max_tokens=3))
    fork.run()
    assert off.state.batch.decode_kernel is False is fork.state.batch.decode_kernel and not calls
    on = packed(model, tok)
    staggered(on, tok, SPECS[:2])
    assert calls, "the default (None) takes the kernel where it is selected"


@pytest.mark.model
def test_packed_rows_through_the_kernel_path_equal_their_runs_alone(bundled, monkeypatch):
    """Selected as on CUDA (the reference standing in for the kernel): no decode row of the
    scheduler's forwards goes through the gather path, prefill chunks beside decode rows go by
    groups, and every row equals its run alone through mlx-lm."""
    from workbench.engine.packed import attention

    model, tok = bundled
    calls, by_groups, beside = [], [], []
    original = attention.grouped_attention

    def spy(record):
        def grouped(queries, k_pool, v_pool, groups, scale):
            record.append(groups.n_decode)
            return original(queries, k_pool, v_pool, groups, scale)

        return grouped

    monkeypatch.setattr(ca, "paged_decode_attention", _stand_in(calls))
    monkeypatch.setattr(
        pa, "selected", lambda choice, n_heads, pool: choice is not False and ca.serves(n_heads, pool)
    )
    monkeypatch.setattr(attention, "grouped_attention", spy(by_groups))
    monkeypatch.setattr(ca, "grouped_attention", spy(beside))
    sched, uids = _staggered_packed(model, tok)
    check = oracle.solo_check(model, sched, uids, atol=1e-4)
    assert check.ok, check.text()
    assert calls and len(calls) % len(model.model.layers) == 0
    # a forward of one row's prefill alone runs as mlx-lm's (packed/row_prefill.py), not by groups
    assert beside, "prefill chunks beside decode rows go by groups"
    assert not any(by_groups + beside), "no decode row went through the gather path"


@pytest.mark.model
def test_decode_kernel_false_keeps_the_gather_path(bundled, monkeypatch):
    model, tok = bundled
    calls = []
    monkeypatch.setattr(ca, "paged_decode_attention", _stand_in(calls))
    monkeypatch.setattr(device, "backend", lambda: "cuda")
    a, b = tok.encode("def add(a, b):\n    return"), tok.encode("import os\n")
    table, pools = PageTable(4), Pools(len(model.model.layers))
    table.reserve(0, len(a) + 1)
    table.reserve(1, len(b) + 1)
    first = [Chunk(0, 0, len(a), "prefill"), Chunk(1, 0, len(b), "prefill")]
    packed_forward(model, pools, table, first, a + b)
    step = [Chunk(0, len(a), 1, "decode"), Chunk(1, len(b), 1, "decode")]
    off = packed_forward(model, pools, table, step, [5, 6], decode_kernel=False)
    assert not calls
    on = packed_forward(model, pools, table, step, [5, 6])  # None: on "CUDA", for this model's heads
    assert len(calls) == len(model.model.layers)
    assert mx.abs(on - off).max().item() < 1e-4


# -- the kernel's own source, emulated on the CPU (tests/engine/cuda_emulation.py) --

EMULATION = [  # dtype, query heads, KV heads, head dim, page size, row lengths, splits, pointer shifts, layout
    (mx.float32, 8, 2, 64, 16, [1, 16, 17, 47, 90], (1, 3), {}, ca.LAYOUT),
    (mx.bfloat16, 8, 2, 64, 16, [1, 16, 17, 47, 90], (None,), {}, ca.LAYOUT),
    (mx.bfloat16, 8, 2, 64, 16, [1, 16, 17, 47, 90], (1,), {"k_pool": 2, "v_pool": 4}, ca.LAYOUT),
    (mx.float16, 4, 4, 32, 7, [33, 1, 14, 65], (1,), {}, ca.LAYOUT),
    (mx.bfloat16, 6, 2, 64, 16, [1, 40, 90], (1, 2), {}, ca.Layout(8, 8)),
]


@pytest.mark.parametrize("case", range(len(EMULATION)))
def test_the_kernel_source_run_by_a_cpu_emulation_equals_the_reference(case):
    """The kernels' CUDA source as MLX wraps it, each CUDA thread a CPU thread: the one-split
    kernel and the split kernel with its reduce equal the reference within float rounding, on
    16-byte loads and (pools misaligned) on scalar loads."""
    from tests.engine.cuda_emulation import available, emulated

    why = available()
    if why:
        pytest.skip(f"the CUDA emulation needs g++ and CUDA's headers: {why}")
    dtype, H, n_kv, D, page_size, lengths, splits, shifts, layout = EMULATION[case]
    table, chunks, q, k, v = decode_case(page_size, lengths, H, n_kv, D, dtype, seed=case)
    pages = ca.decode_pages(table, chunks)
    want = reference32(q, k, v, pages, D**-0.5)
    rows = mx.contiguous(q.transpose(2, 1, 0, 3))  # [R, H, 1, D]: the decode rows' queries
    with emulated(shifts, caches=(ca._kernel, ca._reduce_kernel)):
        for n in splits:
            got = ca.paged_decode_attention(q, k, v, pages, D**-0.5, splits=n, layout=layout)
            assert_close(got, want, dtype)
            by_rows = ca.paged_decode_attention(rows, k, v, pages, D**-0.5, splits=n, layout=layout)
            assert by_rows.shape == rows.shape and mx.array_equal(by_rows, got.transpose(2, 1, 0, 3)).item()


# -- on the GPU: the kernel against the reference --

TOLERANCE = {mx.float32: (1e-5, 1e-5), mx.bfloat16: (2**-8, 1e-5), mx.float16: (2**-10, 1e-5)}  # (rel, abs)


def reference32(q, k, v, pages, scale):
    """The float32 reference on the same (rounded) inputs as the kernel."""
    return ca.paged_decode_reference(
        q.astype(mx.float32), k.astype(mx.float32), v.astype(mx.float32), pages, scale
    )


def assert_close(got, want, dtype):
    """``got`` (the kernel, ``dtype``) against the float32 reference ``want``: within float32
    rounding, plus the output's own rounding to ``dtype``."""
    assert got.shape == want.shape and got.dtype == dtype
    rel, tol = TOLERANCE[dtype]
    err = mx.abs(got.astype(mx.float32) - want) - (rel * mx.abs(want) + tol)
    assert mx.all(err <= 0).item(), f"largest excess {err.max().item():.3g} over {rel} x |want| + {tol}"


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 128])
@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("n_heads, n_kv", [(32, 8), (8, 8)], ids=["gqa", "mha"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16], ids=["fp32", "bf16", "fp16"])
def test_on_the_gpu_the_paged_kernel_equals_the_reference(dtype, n_heads, n_kv, page_size, B):
    lengths = lengths_for(page_size, B)
    table, chunks, q, k, v = decode_case(page_size, lengths, n_heads, n_kv, 64, dtype, seed=B)
    pages = ca.decode_pages(table, chunks)
    want = reference32(q, k, v, pages, 0.125)
    for splits in (None, 1, 5):  # the default plan, no split, five partitions merged by the reduce kernel
        assert_close(ca.paged_decode_attention(q, k, v, pages, 0.125, splits=splits), want, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [32, 128])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n_heads, n_kv, page_size", [(16, 4, 16), (6, 2, 7), (8, 1, 1)])
def test_on_the_gpu_the_kernel_serves_other_head_dims_groups_and_page_sizes(
    dtype, head_dim, n_heads, n_kv, page_size
):
    lengths = [1, 2, page_size, page_size + 3, 300, 1001, 64]
    table, chunks, q, k, v = decode_case(page_size, lengths, n_heads, n_kv, head_dim, dtype, seed=head_dim)
    pages = ca.decode_pages(table, chunks)
    want = reference32(q, k, v, pages, head_dim**-0.5)
    for splits in (None, 3):
        assert_close(ca.paged_decode_attention(q, k, v, pages, head_dim**-0.5, splits=splits), want, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", [ca.Layout(8, 16), ca.Layout(4, 8), ca.Layout(2, 4)], ids=str)
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["fp32", "bf16"])
def test_on_the_gpu_other_kernel_layouts_equal_the_reference(dtype, layout):
    lengths = lengths_for(16, 40)
    table, chunks, q, k, v = decode_case(16, lengths, 32, 8, 64, dtype, seed=7)
    pages = ca.decode_pages(table, chunks)
    want = reference32(q, k, v, pages, 0.125)
    for splits in (None, 1):
        assert_close(
            ca.paged_decode_attention(q, k, v, pages, 0.125, splits=splits, layout=layout), want, dtype
        )


@pytest.mark.gpu
@pytest.mark.model
def test_on_the_gpu_packed_rows_through_the_kernel_equal_their_runs_alone(bundled, monkeypatch):
    """The default on CUDA: the scheduler's decode rows go to the kernel itself, and every row
    equals its run alone through mlx-lm (tokens; log-probs within 1e-4)."""
    model, tok = bundled
    calls, kernel = [], ca.paged_decode_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(ca, "paged_decode_attention", counted)
    sched, uids = _staggered_packed(model, tok)
    check = oracle.solo_check(model, sched, uids, atol=1e-4)
    assert check.ok, check.text()
    assert calls, "the kernel served the decode rows"
