"""The packed layout's decode-only forward run as ``[R, 1]`` rows (``packed/decode_rows.py``):
its index arrays equal the general ones (``packed/indices.py``) and are made on the host, its
logits equal the ``[1, T]`` forward's bit for bit, and its host work per forward does not grow
with the rows."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.bench.step_nodes import graph_nodes
from workbench.engine.packed import attention
from workbench.engine.packed.attention import Pools, packed_forward
from workbench.engine.packed.decode_rows import DecodeRowsLayer, decode_index, decode_only
from workbench.engine.packed.grouped import flat_indices
from workbench.engine.packed.indices import forward_index
from workbench.engine.packed.pages import PageTable
from workbench.observe.packed import Chunk


@st.composite
def decode_tables(draw):
    """A page table after reserves, frees (pages reused out of order) and forks, and one
    decode chunk per request at a position within its pages."""
    P = draw(st.integers(1, 5))
    t, lengths = PageTable(P), {}
    for uid in range(draw(st.integers(1, 7))):
        if lengths and draw(st.booleans()):
            gone = draw(st.sampled_from(sorted(lengths)))
            t.free(gone)
            lengths.pop(gone)
        if lengths and draw(st.booleans()):
            src = draw(st.sampled_from(sorted(lengths)))
            t.fork(src, uid)
            lengths[uid] = lengths[src]
        lengths[uid] = max(lengths.get(uid, 0), draw(st.integers(1, 30)))
        t.reserve(uid, lengths[uid])
    chunks = [Chunk(u, draw(st.integers(0, n - 1)), 1, "decode") for u, n in sorted(lengths.items())]
    return t, chunks


@settings(max_examples=200, deadline=None)
@given(decode_tables())
def test_the_decode_index_equals_the_general_index_arrays(case):
    t, chunks = case
    assert decode_only(chunks)
    ix, general = decode_index(t, chunks), forward_index(t, chunks)
    assert ix.write.tolist() == general.write().tolist()
    assert ix.positions.tolist() == general.positions().tolist()
    assert ix.slots.tolist() == general.slot_grid(0, len(chunks)).tolist()
    assert ix.slots.dtype == ix.write.dtype == ix.positions.dtype == np.int32
    ends = np.array([c.end for c in chunks])
    if ends.min() < ends.max():
        assert ix.mask.tolist() == (np.arange(ends.max())[None, :] < ends[:, None]).tolist()
    else:
        assert ix.mask is None


@settings(max_examples=100, deadline=None)
@given(decode_tables(), st.integers(1, 4))
def test_the_decode_index_makes_the_flat_gather_rows_on_the_host(case, heads):
    """``flat`` is :func:`flat_indices` of the slot grid, made in numpy: the forward's graph
    gets it as one input array, with no index arithmetic of its own."""
    t, chunks = case
    ix = decode_index(t, chunks, heads=heads)
    assert ix.flat.dtype == np.int32 and ix.flat.shape == (len(chunks), heads, ix.slots.shape[1])
    assert ix.flat.tolist() == flat_indices(mx.array(ix.slots), heads).tolist()
    assert decode_index(t, chunks).flat is None


def test_only_one_token_decode_chunks_that_sample_run_as_rows():
    assert decode_only([Chunk(0, 3, 1, "decode"), Chunk(1, 9, 1, "decode")])
    assert not decode_only([])
    assert not decode_only([Chunk(0, 3, 1, "decode"), Chunk(1, 0, 4, "prefill")])
    assert not decode_only([Chunk(0, 3, 1, "decode", samples=False)])


def test_a_decode_chunk_past_its_pages_is_refused_naming_the_uid():
    t = PageTable(4)
    t.reserve(0, 8)
    t.reserve(3, 2)
    with pytest.raises(ValueError, match="uid 3: positions up to 4 but only 1 page"):
        decode_index(t, [Chunk(0, 7, 1, "decode"), Chunk(3, 4, 1, "decode")])


def _decode_forward(model, tok, general: bool, monkeypatch) -> mx.array:
    """Prefill three prompts of different lengths, then one decode forward of all three
    (rows unequal: the padded decode group with its mask); ``general``: the ``[1, T]`` path."""
    prompts = [
        tok.encode(t) for t in ("def add(a, b):\n    return", "import os\n", "class A:\n    pass\n\nx = 1")
    ]
    table, pools = PageTable(4), Pools(len(model.model.layers))
    for u, p in enumerate(prompts):
        table.reserve(u, len(p))
    first = [Chunk(u, 0, len(p), "prefill") for u, p in enumerate(prompts)]
    packed_forward(model, pools, table, first, [t for p in prompts for t in p])
    for u, p in enumerate(prompts):
        table.reserve(u, len(p) + 1)
    with monkeypatch.context() as m:
        if general:
            m.setattr(attention, "decode_only", lambda chunks: False)
        chunks = [Chunk(u, len(p), 1, "decode") for u, p in enumerate(prompts)]
        return packed_forward(model, pools, table, chunks, mx.array([11, 12, 13], dtype=mx.uint32))


@pytest.mark.model
def test_the_rows_forward_gives_the_logits_of_the_packed_sequence_bit_for_bit(bundled, monkeypatch):
    model, tok = bundled
    rows, general = (
        _decode_forward(model, tok, False, monkeypatch),
        _decode_forward(model, tok, True, monkeypatch),
    )
    assert rows.shape == general.shape == (3, model.args.vocab_size)
    assert mx.array_equal(rows, general).item()


@pytest.mark.model
def test_the_host_arrays_a_decode_forward_builds_do_not_grow_with_the_rows(bundled, monkeypatch):
    """The ``[R, 1]`` rows path on every device: ``decode_kernel=False``, since on CUDA the
    default sends decode rows to the paged-attention kernel (``packed/cuda_attention.py``),
    another route whose per-shape cached arrays (``_dims``) make its count depend on the
    shapes seen before."""
    model, _ = bundled
    made = []
    real = mx.array

    class Counting(type):  # mx.array as a type that counts its calls (isinstance still works)
        def __instancecheck__(cls, x):
            return isinstance(x, real)

        def __call__(cls, *args, **kwargs):
            made.append(1)
            return real(*args, **kwargs)

    counting = Counting("array", (), {})

    def arrays_built(R: int) -> int:
        table, pools = PageTable(4), Pools(len(model.model.layers))
        for u in range(R):
            table.reserve(u, 6)
        packed_forward(model, pools, table, [Chunk(u, 0, 5, "prefill") for u in range(R)], [7] * 5 * R)
        made.clear()
        with monkeypatch.context() as m:
            m.setattr(mx, "array", counting)
            logits = packed_forward(
                model,
                pools,
                table,
                [Chunk(u, 5, 1, "decode") for u in range(R)],
                real([9] * R, dtype=mx.uint32),
                decode_kernel=False,
            )
        assert logits.shape[0] == R
        return len(made)

    assert arrays_built(1) == arrays_built(16) <= 4


@pytest.mark.model
def test_a_pipelined_decode_step_feeds_the_unread_tokens_without_building_an_array(bundled, monkeypatch):
    """Every token of a pipelined decode forward is the launched forward's unread one: the
    inputs are that forward's token array (reordered where the rows are), no host array and no
    scatter into one."""
    import workbench as wb

    model, tok = bundled
    sched = wb.Scheduler(model, tok, layout="packed", max_batch=4)
    for n in (5, 9, 14):
        sched.submit(wb.Request(prompt=list(range(3, 3 + n)), max_tokens=12))
    for _ in range(4):
        sched.admit()
        sched.step()
    batch = sched.state.batch
    after = batch.launched
    assert after is not None and after.pending is not None
    unread = batch.carried(after)
    chunks = batch.plan(sched.config.token_budget, sched.config.packed_schedule, unread)
    assert decode_only(chunks) and all(c.uid in unread for c in chunks)
    built = []
    real = mx.array

    class Counting(type):
        def __instancecheck__(cls, x):
            return isinstance(x, real)

        def __call__(cls, *args, **kwargs):
            built.append(1)
            return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(mx, "array", Counting("array", (), {}))
        tokens = batch._tokens(chunks, after)
    assert built == []
    want = [after.pending.tokens[unread[c.uid]].item() for c in chunks]
    assert tokens.dtype == mx.uint32 and tokens.tolist() == want


@pytest.mark.model
@pytest.mark.parametrize("lengths", [(9, 9, 9), (5, 9, 14)])
def test_the_rows_gather_rows_and_mask_reach_the_layers_made_on_the_host(random_llama, lengths, monkeypatch):
    """The CPU rows path: each layer gets its gather rows ``[R, n_kv_heads, L]`` and mask
    ``[R, 1, 1, L]`` as plain input arrays (no graph of their own: before, ``flat_indices``
    and the mask's reshape were 6-8 MLX nodes a step), and the rows' logits stay those of
    the gather rows made by :func:`flat_indices` from the slot grid, bit for bit."""
    model, _ = random_llama
    table, pools = PageTable(4), Pools(len(model.model.layers))
    for u, n in enumerate(lengths):
        table.reserve(u, n)
    prefill = [Chunk(u, 0, n, "prefill") for u, n in enumerate(lengths)]
    mx.eval(packed_forward(model, pools, table, prefill, [7] * sum(lengths)), pools.keys, pools.values)
    for u, n in enumerate(lengths):
        table.reserve(u, n + 1)
    decode = [Chunk(u, n, 1, "decode") for u, n in enumerate(lengths)]
    tokens = mx.array([9, 10, 11], dtype=mx.uint32)
    seen = []
    real = DecodeRowsLayer.attend

    def attend(self, queries, scale):
        seen.append((graph_nodes([self.flat]), self.mask is None or not graph_nodes([self.mask])))
        return real(self, queries, scale)

    with monkeypatch.context() as m:
        m.setattr(DecodeRowsLayer, "attend", attend)
        rows = packed_forward(model, pools, table, decode, tokens, decode_kernel=False)
    assert len(seen) == len(model.model.layers)
    assert all(not flat and mask_is_input for flat, mask_is_input in seen)

    ix = decode_index(table, decode)  # the gather rows as MLX ops made them before
    flat = flat_indices(mx.array(ix.slots), model.model.layers[0].self_attn.n_kv_heads)
    mask = None if ix.mask is None else mx.array(ix.mask)[:, None, None, :]
    assert (mask is None) == (len(set(lengths)) == 1)

    def by_ops(self, pools_, layer, write, positions, flat_, mask_, decode_=None):
        real_init(self, pools_, layer, write, positions, flat, mask, decode_)

    real_init = DecodeRowsLayer.__init__
    with monkeypatch.context() as m:
        m.setattr(DecodeRowsLayer, "__init__", by_ops)
        before = packed_forward(model, pools, table, decode, tokens, decode_kernel=False)
    assert mx.array_equal(rows, before).item()
