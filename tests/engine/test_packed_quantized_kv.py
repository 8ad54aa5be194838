"""The packed layout with ``kv_bits``: pages held quantized
(``workbench.engine.packed.quantized_pages``), a row's first forward on float keys and every
later one on quantized keys, as mlx-lm's ``generate_step(kv_bits=, quantized_kv_start=0)``.

Held to: mlx-lm's ``generate_step`` with ``kv_bits`` (the solo oracle), the same request alone
in the same settings, the padded layout with ``kv_bits``, and an independent count of the
quantized bytes.
"""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

import workbench as wb
from workbench.engine.levers.quantized_kv import KVQuant
from workbench.engine.packed.plan import Want, plan_chunks
from workbench.engine.packed.quantized_pages import QuantizedPools, first_forward
from workbench.runtime.device import on_gpu
from workbench.verify import oracle

from .test_quantized_kv import _assert_rows_match  # tokens only on CUDA (quantization steps)

G = 32  # the bundled model's head dim: one group per position
# bit-equal on the CPU; on CUDA float noise can move a key across a quantization step (docs/gpu.md)
ALONE_ATOL, TWIN_ATOL = (1e-3, 1e-3) if on_gpu() else (0.0, 1e-4)
SPECS = ((3, 12), (60, 9), (17, 14), (1, 5), (33, 10), (1, 8))  # (prompt tokens, max_tokens)


def _packed(make_sched, bits=4, **kw):
    return make_sched(layout="packed", kv_bits=bits, kv_group_size=G, **kw)


def _submit(sched, prompt, specs=SPECS, seed=13):
    return [
        sched.submit(wb.Request(prompt=prompt(n, seed * i), max_tokens=m)) for i, (n, m) in enumerate(specs)
    ]


@pytest.mark.parametrize(
    "bits,options",
    [
        (4, dict(max_batch=3)),
        (8, dict(max_batch=3, page_size=4)),
        (4, dict(max_batch=4, prefill_step_size=8)),  # a float first chunk of 8, then quantized chunks
        (8, dict(max_batch=3, prefill_step_size=16, max_num_batched_tokens=24, pipeline=False)),
        (4, dict(max_batch=3, prefill_step_size=8, packed_schedule="prefill-first")),
    ],
)
def test_every_packed_row_equals_generate_step_with_kv_bits(make_sched, prompt, bits, options):
    sched = _packed(make_sched, bits, **options)
    mixed = 0
    _submit(sched, prompt)
    while not sched.idle:
        sched.admit(), sched.step(), sched.filter()
        kinds = {c.kind for c in sched.snapshot().packed.last_chunks}
        mixed += kinds == {"decode", "prefill"}
    assert sched.check().ok
    report = oracle.solo_check(sched.model, sched)
    _assert_rows_match(report)
    assert (
        mixed or options.get("packed_schedule") == "prefill-first"
    )  # decode and prefill tokens shared forwards


def test_a_rows_first_forward_is_its_reference_first_chunk_whole(make_sched, prompt):
    """While rows decode, a joiner's first chunk (on float keys) is all of its
    min(prefill_step_size, prompt - 1) tokens, never split by the budget: with no room beside
    the decode tokens it runs without them (they wait that one forward, not until the batch
    drains); later chunks share forwards with the decode tokens and take what is left."""
    sched = _packed(make_sched, 4, max_batch=3, prefill_step_size=8, max_num_batched_tokens=9)
    _submit(sched, prompt, ((3, 20), (2, 20)))
    for _ in range(3):
        sched.admit(), sched.step(), sched.filter()
    late = sched.submit(wb.Request(prompt=prompt(30, 5), max_tokens=4))
    forwards = []
    while not sched.idle:
        sched.admit(), sched.step(), sched.filter()
        forwards.append(sched.snapshot().packed.last_chunks)
    mine = [(f, c) for f in forwards for c in f if c.uid == late and c.kind == "prefill"]
    (first, chunk), rest = mine[0], [c for _, c in mine[1:]]
    assert chunk.start == 0 and chunk.n_tokens == first_forward(30, 8) == 8 and len(first) == 1
    assert rest[0].n_tokens == 7 and any(c.kind == "decode" for c in forwards[forwards.index(mine[1][0])])
    _assert_rows_match(oracle.solo_check(sched.model, sched))


def test_the_plan_runs_a_first_chunk_whole_or_not_at_all():
    wants = [Want(0, 5, 6, True), Want(1, 0, 30, False, first=8), Want(2, 0, 4, False)]
    assert [(c.uid, c.n_tokens) for c in plan_chunks(wants, 8)] == [(0, 1), (2, 4)]  # uid 1 waits
    assert [(c.uid, c.n_tokens) for c in plan_chunks(wants, 9)] == [(0, 1), (1, 8)]
    # nothing else fits beside the decode token: the first chunk runs alone, the decode waits once
    assert [(c.uid, c.n_tokens) for c in plan_chunks(wants[:2], 8)] == [(1, 8)]
    assert [(c.uid, c.n_tokens) for c in plan_chunks(wants[:2], 7)] == [(0, 1)]  # never fits: decodes go on
    one = plan_chunks([Want(3, 0, 1, False, first=1)], 4)
    assert [(c.n_tokens, c.samples) for c in one] == [(1, True)]  # a one-token prompt samples at once
    assert [c.n_tokens for c in plan_chunks([Want(4, 8, 30, False, first=8)], 4)] == [4]  # held: any chunk


def test_each_row_equals_its_run_alone_and_the_padded_layout_with_kv_bits(make_sched, prompt):
    specs = ((9, 10), (1, 6), (40, 8), (17, 12))
    sched = _packed(make_sched, 8, max_batch=3, prefill_step_size=16)
    uids = _submit(sched, prompt, specs, seed=7)
    twin = make_sched(kv_bits=8, kv_group_size=G, max_batch=3, prefill_step_size=16)
    twins = _submit(twin, prompt, specs, seed=7)
    sched.run(), twin.run()
    for i, (uid, other) in enumerate(zip(uids, twins)):
        alone = _packed(make_sched, 8, max_batch=3, prefill_step_size=16)
        solo = alone.submit(wb.Request(prompt=prompt(specs[i][0], 7 * i), max_tokens=specs[i][1]))
        alone.run()
        assert sched.tokens(uid) == alone.tokens(solo) == twin.tokens(other)
        np.testing.assert_allclose(sched.logprobs(uid), alone.logprobs(solo), rtol=0, atol=ALONE_ATOL)
        np.testing.assert_allclose(sched.logprobs(uid), twin.logprobs(other), atol=TWIN_ATOL)


@pytest.mark.parametrize(
    "options", [dict(max_batch=3), dict(max_batch=3, prefill_step_size=8, pipeline=False)]
)
def test_preempted_and_aborted_rows_resume_with_their_reference_first_forward(make_sched, prompt, options):
    """A preempted row prefills prompt + generated tokens again from position 0: its first
    (float) chunk is again the reference's first forward; an abort mid-run frees its pages."""
    sched = _packed(make_sched, 4, **options)
    uids = _submit(sched, prompt, ((3, 12), (60, 9), (17, 14), (1, 9), (33, 10), (1, 8)))
    preempted = []
    for call in itertools.count(1):
        if sched.idle:
            break
        sched.admit(), sched.step(), sched.filter()
        decoding = [r.uid for r in sched.batch.rows if r.tokens and not r.finished]
        if decoding and not call % 3 and len(preempted) < 3:  # the newest decoding row goes back
            preempted.append(decoding[-1])
            sched.preempt(preempted[-1])
        if call == 4:
            sched.abort(uids[2])
    assert preempted and sched.check().ok
    kept = [u for u in uids if u != uids[2]]
    report = oracle.solo_check(sched.model, sched, kept)
    _assert_rows_match(report)


def test_checkpoint_restore_and_submit_n_repeat_the_quantized_run(make_sched, prompt):
    sched = _packed(make_sched, 4, max_batch=4, page_size=4)
    uids = _submit(sched, prompt, ((9, 8), (22, 8)))
    uids += sched.submit_n(wb.Request(prompt=prompt(13, 3), max_tokens=6, temperature=0.9, seed=5), 2)
    while sched.step_index < 4:  # the followers have copied the shared last page by now
        sched.admit(), sched.step(), sched.filter()
    saved, runs = sched.checkpoint(), []
    for restored in (False, True):
        if restored:
            sched.restore(saved)
            assert sched.check().ok
        sched.run()
        runs.append({u: sched.tokens(u) for u in uids})
    assert runs[0] == runs[1]
    _assert_rows_match(oracle.solo_check(sched.model, sched, uids[:2]))


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_page_bytes_are_what_the_pools_hold(make_sched, prompt, bundled, bits):
    """Held and pool bytes of the snapshot and the ledger, against a count from the model's
    shapes: per position, layer and KV head, keys and values each D * bits / 8 packed bytes plus
    a scale and a bias per group, in the activations' dtype."""
    model, _ = bundled
    attn = model.model.layers[0].self_attn
    n_kv, D = attn.n_kv_heads, model.args.hidden_size // model.args.num_attention_heads
    itemsize = model.model.embed_tokens.weight.dtype.size
    per_slot = len(model.model.layers) * 2 * n_kv * (D * bits // 8 + 2 * (D // G) * itemsize)
    sched = _packed(make_sched, bits, max_batch=3, page_size=8)
    _submit(sched, prompt, ((20, 6), (5, 6), (9, 6)))
    peak = 0
    while not sched.idle:
        sched.admit(), sched.step()
        snap, batch = sched.snapshot(), sched.batch
        pages = len({p for _, ps in snap.packed.pages for p in ps})
        assert snap.kv_bytes == batch.kv_bytes == pages * 8 * per_slot
        assert batch.pools.nbytes == batch.pool_bytes == batch.pools.slots * per_slot
        peak = max(peak, snap.kv_bytes)
        sched.filter()
    float_page = make_sched(layout="packed", max_batch=3, page_size=8).layout.page_bytes
    assert float_page == 8 * len(model.model.layers) * 2 * n_kv * D * itemsize > sched.layout.page_bytes
    assert peak > 0 and sched.layout.page_bytes == 8 * per_slot


def test_quantized_pools_copy_and_clone_every_part():
    pools = QuantizedPools(1, KVQuant(4, G))
    pools.slots = 8
    x = mx.random.normal((8, 2, 32))
    parts = pools.quantize(x)
    pools.fit(0, parts)
    for pool in (pools.keys, pools.values):
        for stored, new in zip(pool[0], parts):
            stored[mx.arange(8)] = new
    copy = pools.clone()
    pools.copy_pages([(0, 1)], 4)  # page 0 (slots 0-3) into page 1 (slots 4-7)
    for got, want in zip(pools.keys[0], parts):
        assert mx.array_equal(got[4:], want[:4]).item() and mx.array_equal(got[:4], want[:4]).item()
    for got, want in zip(copy.keys[0], parts):  # the checkpoint's handles kept what they held
        assert mx.array_equal(got, want).item()
    assert pools.nbytes == 2 * sum(int(a.nbytes) for a in parts)


@pytest.mark.parametrize(
    "settings, name",
    [
        (dict(prompt_cache=8, kv_bits=8), "kv_bits"),  # refused with the prompt cache, both layouts
        (
            dict(kv_bits=8, prefill_step_size=64, max_num_batched_tokens=32),
            "kv_bits with max_num_batched_tokens=32",
        ),
    ],
)
def test_settings_packed_kv_bits_does_not_take_are_refused_naming_them(make_sched, settings, name):
    with pytest.raises(ValueError, match=name):
        make_sched(layout="packed", kv_group_size=G, **settings)


def test_a_device_without_the_quantized_kernel_attends_to_the_pages_by_dequantizing(
    make_sched, prompt, monkeypatch
):
    """Where MLX has no quantized_matmul for the shape, the packed layout takes the padded one's
    dequantizing path (chosen at construction), and every row equals generate_step(kv_bits=4)
    with the same path."""
    from workbench.engine.levers.quantized_attention import attention_path, dequantized_attention

    from .test_quantized_kv import _without_quantized_matmul

    _without_quantized_matmul(monkeypatch)
    sched = _packed(make_sched, 4, max_batch=3, prefill_step_size=8)
    assert sched.batch.pools.attention is dequantized_attention
    _submit(sched, prompt)
    sched.run()
    with attention_path(sched.model, "dequantize"):
        report = oracle.solo_check(sched.model, sched)
    _assert_rows_match(report)
