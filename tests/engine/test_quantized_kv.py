"""The batched quantized KV cache (``Scheduler(kv_bits=4 | 8)``): its storage against
mlx-lm's float ``BatchKVCache`` on hand-built caches, every row against the same request
run alone through mlx-lm's ``generate_step(kv_bits=, kv_group_size=,
quantized_kv_start=0)``, free slots, checkpoints, bytes and the KV budget."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache

import workbench as wb
from tests.engine.alone import row_record
from workbench.engine.kv import cache_internals as internals
from workbench.engine.kv.profile import kv_profile, projected_bytes
from workbench.engine.kv.trim import trim_rows
from workbench.engine.levers.quantized_kv import BatchQuantizedKVCache, KVQuant, quantize_batch
from workbench.verify import oracle

pytestmark = pytest.mark.quantized_kv  # skipped, with the reason, where the device lacks the kernels

H, D, G = 2, 32, 32  # KV heads, head dim, group size of the hand-built caches


def _rows(lengths, seed=0):
    """Per-row float keys ``[1, H, n, D]`` (values = 2 * keys + 1)."""
    rng = np.random.default_rng(seed)
    return [mx.array(rng.standard_normal((1, H, n, D)).astype(np.float32)) for n in lengths]


def _solo(rows, quantized, bits):
    out = []
    for k in rows:
        c = QuantizedKVCache(group_size=G, bits=bits) if quantized else KVCache()
        if k.shape[2]:
            c.update_and_fetch(k, 2 * k + 1)
        out.append(c)
    return out


def _real_positions(q: BatchQuantizedKVCache, f: BatchKVCache, bits: int):
    """Per row, the quantized cache's parts over its real positions and mx.quantize of the
    float cache's keys there: (ours, expected) pairs of lists of numpy arrays."""
    lp = np.array(f.left_padding).tolist()
    assert (
        np.array(q.left_padding).tolist() == lp and np.array(q.offset).tolist() == np.array(f.offset).tolist()
    )
    assert q.size() == f.size()
    pairs = []
    for b, pad in enumerate(lp):
        if pad == f.size():  # an empty row: nothing to compare (mx.quantize of no positions crashes on CUDA)
            continue
        for ours, floats in ((q.keys, f.keys), (q.values, f.values)):
            want = mx.quantize(floats[b : b + 1, :, pad : f.size()], group_size=G, bits=bits)
            pairs.append(
                ([np.array(a[b : b + 1, :, pad : q.size()]) for a in ours], [np.array(a) for a in want])
            )
    return pairs


def _assert_matches_float(q, f, bits):
    for ours, want in _real_positions(q, f, bits):
        for a, b in zip(ours, want):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantizing_a_buffer_equals_quantizing_each_position(bits):
    (k,) = _rows([7])
    whole = mx.quantize(k, group_size=G, bits=bits)
    for s in range(7):
        one = mx.quantize(k[:, :, s : s + 1], group_size=G, bits=bits)
        for a, b in zip(whole, one):
            assert mx.array_equal(a[:, :, s : s + 1], b).item()


@pytest.mark.parametrize("bits", [4, 8])
def test_merge_extend_filter_extract_follow_the_float_batch_cache(bits):
    lengths, more = [5, 2, 0], [3, 7]
    q = BatchQuantizedKVCache.merge(_solo(_rows(lengths), True, bits))
    f = BatchKVCache.merge(_solo(_rows(lengths), False, bits))
    _assert_matches_float(q, f, bits)
    assert np.array(q.left_padding).tolist() == [0, 3, 5]  # the module docstring's merge
    step = _rows([1, 1, 1], seed=3)
    keys = mx.concatenate(step)  # one decode step [3, H, 1, D]
    q.update_and_fetch(keys, 2 * keys + 1)
    f.update_and_fetch(keys, 2 * keys + 1)
    _assert_matches_float(q, f, bits)
    assert mx.array_equal(q.make_mask(1), f.make_mask(1)).item()
    q.extend(BatchQuantizedKVCache.merge(_solo(_rows(more, 5), True, bits)))
    f.extend(BatchKVCache.merge(_solo(_rows(more, 5), False, bits)))
    _assert_matches_float(q, f, bits)
    q.filter([1, 3, 4])
    f.filter([1, 3, 4])
    _assert_matches_float(q, f, bits)
    solo = q.extract(2)
    assert isinstance(solo, QuantizedKVCache) and solo.offset == 7 and solo.bits == bits
    want = mx.quantize(f.extract(2).keys, group_size=G, bits=bits)
    assert all(mx.array_equal(a, b).item() for a, b in zip(solo.keys, want))


def test_prepare_finalize_roll_right_padding_to_the_left_like_the_float_cache():
    bits, lengths = 4, [4, 2]
    keys = mx.concatenate([mx.concatenate(_rows([4], 7), axis=2)] * 2)  # [2, H, 4, D], row 1 padded by 2
    f = BatchKVCache([0, 0])
    f.prepare(lengths=lengths, right_padding=[0, 2])
    f.update_and_fetch(keys, 2 * keys + 1)
    q = quantize_batch([f], KVQuant(bits, G))[0]  # quantized between the forward and finalize
    q.finalize()
    f.finalize()
    assert np.array(q.left_padding).tolist() == [0, 2] and np.array(q.offset).tolist() == [4, 2]
    _assert_matches_float(q, f, bits)


@pytest.mark.parametrize("bits", [4, 8])
def test_trimming_rows_by_different_counts_follows_the_float_cache(bits):
    """Speculative decoding's per-row trim (``trim_rows``) on the quantized batch cache: after
    a verify forward of 3 positions per row, the rows drop 2, 3 and 0 of them; offsets, left
    padding, the mask and every kept position equal the float cache trimmed alike, and the
    next step writes each row's next position right after its kept ones."""
    lengths = [5, 2, 4]
    q = BatchQuantizedKVCache.merge(_solo(_rows(lengths), True, bits))
    f = BatchKVCache.merge(_solo(_rows(lengths), False, bits))
    verify = mx.concatenate(_rows([3, 3, 3], seed=4))  # [3, H, 3, D]: pending token + 2 drafts per row
    for c in (q, f):
        c.update_and_fetch(verify, 2 * verify + 1)
        trim_rows([c], [2, 3, 0])
    assert np.array(q.offset).tolist() == [6, 2, 7] and np.array(q.left_padding).tolist() == [2, 6, 1]
    _assert_matches_float(q, f, bits)
    assert mx.array_equal(q.make_mask(1), f.make_mask(1)).item()
    step = mx.concatenate(_rows([1, 1, 1], seed=5))
    for c in (q, f):
        c.update_and_fetch(step, 2 * step + 1)
    _assert_matches_float(q, f, bits)
    solo = q.extract(1)  # the row that rejected everything: its 2 tokens and the new one
    want = mx.quantize(mx.concatenate([_rows(lengths)[1], step[1:2]], axis=2), group_size=G, bits=bits)
    assert solo.offset == 3 and all(mx.array_equal(a, b).item() for a, b in zip(solo.keys, want))


def test_extend_refuses_another_quantization():
    q4 = BatchQuantizedKVCache.merge(_solo(_rows([2]), True, 4))
    q8 = BatchQuantizedKVCache.merge(_solo(_rows([2]), True, 8))
    with pytest.raises(ValueError, match="4-bit group-32"):
        q4.extend(q8)


def test_free_slot_fill_and_trim_move_packed_scales_and_biases_together():
    bits = 8
    running = BatchQuantizedKVCache.merge(_solo(_rows([6, 6, 6]), True, bits))
    joiner = BatchQuantizedKVCache.merge(_solo(_rows([2], 9), True, bits))
    internals.fill_slots([running], [1], [joiner], [0], [2])
    assert np.array(running.left_padding).tolist() == [0, 4, 0] and np.array(running.offset).tolist() == [
        6,
        2,
        6,
    ]
    for ours, src in zip(running.keys, joiner.keys):
        assert mx.array_equal(ours[1:2, :, 4:6], src[0:1, :, 0:2]).item()
        assert not np.array(ours[1, :, :4]).any()  # the slot's older positions are zeros
    running.filter([1])
    assert running.size() == 2 and np.array(running.left_padding).tolist() == [0]  # shared padding dropped


# -- the scheduler against mlx-lm's generate_step with kv_bits ---------------------------
SPECS = ((3, 12), (60, 9), (17, 14), (1, 5), (33, 10), (1, 8))


def _run(make_sched, prompt, bits, **kwargs):
    sched = make_sched(kv_bits=bits, kv_group_size=G, **kwargs)
    uids = [
        sched.submit(wb.Request(prompt=prompt(n, 13 * i), max_tokens=m)) for i, (n, m) in enumerate(SPECS)
    ]
    sched.run()
    return sched, uids


@pytest.mark.parametrize(
    "bits,options",
    [
        (4, dict(max_batch=3)),  # joins by free slot and extend
        (8, dict(max_batch=3)),
        (4, dict(max_batch=4, prefill_step_size=8)),  # chunked prefill: float first chunk, then quantized
        (8, dict(max_batch=2, reuse_slots=False, pipeline=False)),
    ],
)
def test_every_row_equals_generate_step_with_kv_bits(make_sched, prompt, bits, options):
    sched, uids = _run(make_sched, prompt, bits, **options)
    assert sched.check().ok
    report = oracle.solo_check(sched.model, sched)
    assert len(report.rows) == len(SPECS)
    _assert_rows_match(report)
    joined = {e.join_mode for e in sched.events if e.kind == "join"}
    assert ("free slot" in joined) == options.get("reuse_slots", True)


def _trace(model, ids, steps, bits, **kw):
    out = [
        (int(t), lp) for t, lp in generate_step(mx.array(ids, dtype=mx.uint32), model, max_tokens=steps, **kw)
    ]
    return [t for t, _ in out], [float(lp[t].item()) for t, lp in out]


def test_the_first_forward_runs_on_float_keys_as_in_generate_step(bundled, prompt, make_sched):
    """The oracle can tell: a cache quantized from the very first forward (an empty
    QuantizedKVCache per layer) gives other numbers than generate_step's kv_bits, and the
    batch gives generate_step's."""
    model, _ = bundled
    ids = prompt(40, 5)
    sched = make_sched(kv_bits=4, kv_group_size=G)
    uid = sched.submit(wb.Request(prompt=ids, max_tokens=8))
    sched.run()
    tokens, logprobs = _trace(model, ids, 8, 4, kv_bits=4, kv_group_size=G, quantized_kv_start=0)
    early = [QuantizedKVCache(group_size=G, bits=4) for _ in model.layers]
    _, early_logprobs = _trace(model, ids, 8, 4, prompt_cache=early)
    assert sched.tokens(uid) == tokens
    np.testing.assert_allclose(sched.logprobs(uid), logprobs, atol=1e-4)
    assert np.abs(np.array(early_logprobs) - np.array(logprobs)).max() > 1e-3


def test_checkpoint_restore_repeats_the_quantized_run(make_sched, prompt):
    sched = make_sched(kv_bits=4, kv_group_size=G, max_batch=3)
    uids = [sched.submit(wb.Request(prompt=prompt(n, 7 * i), max_tokens=m)) for i, (n, m) in enumerate(SPECS)]
    for _ in range(4):
        sched.admit(), sched.step(), sched.filter()
    cp = sched.checkpoint()
    sched.run()
    first = [sched.tokens(u) for u in uids]
    sched.restore(cp)
    assert sched.check().ok
    sched.run()
    assert [sched.tokens(u) for u in uids] == first
    assert oracle.solo_check(sched.model, sched).n_match == len(SPECS)


@pytest.mark.parametrize("bits,step", [(4, 2048), (4, 5), (8, 8)])
def test_a_prompt_cache_hit_resumes_its_quantized_prefix_as_generate_step_does(bundled, bits, step):
    """With ``prompt_cache``, a row resuming a cached prefix runs every forward on it quantized,
    as mlx-lm's ``generate_step(rest, prompt_cache=<QuantizedKVCache prefix>, kv_bits=)`` does
    (the prefix itself from ``generate_step(kv_bits=)`` over the first prompt, as
    ``mlx_lm.cache_prompt`` makes it). A row takes only a prefix that holds its own first
    forward on float keys, so every row also equals its run without a cache. One batch holds a
    multi-turn prompt (the first prompt and its answer cached, more tokens after), a repeated
    prompt (a whole-tail hit) and a one-token miss. In 2048-token chunks the multi-turn prompt's
    own first forward covers all of it, the cached prefix does not hold that: a miss (mlx-lm
    resuming the prefix gives other numbers, more than 1e-3 away); in chunks of 5 or 8, a hit
    equal to the mlx-lm reference."""
    from mlx_lm.models.cache import LRUPromptCache, make_prompt_cache, trim_prompt_cache

    from workbench.engine.kv.cache_internals import clone_prompt_cache

    model, tok = bundled
    settings = dict(kv_bits=bits, kv_group_size=G, prefill_step_size=step)
    lru = LRUPromptCache(max_size=8)
    sched = wb.Scheduler(model, tok, max_batch=3, prompt_cache=lru, **settings)
    first = tok.encode("def add(a, b):\n    return a + b\n")
    a = sched.submit(wb.Request(prompt=first, max_tokens=8))
    sched.run()
    answer = sched.tokens(a)
    turn = first + answer + tok.encode("\ndef mul(a, b):")
    before = clone_prompt_cache(lru)
    requests = [
        wb.Request(prompt=turn, max_tokens=10),
        wb.Request(prompt=first, max_tokens=8),
        wb.Request(prompt=[first[0]], max_tokens=6),
    ]
    uids = [sched.submit(r) for r in requests]
    sched.run()
    hit = len(first) + len(answer)
    resumed = step < len(first)  # both first forwards ran `step` tokens on float keys
    assert [sched.requests[u].cached_tokens for u in uids] == [hit if resumed else 0, len(first) - 1, 0]
    assert len({e.step for e in sched.events if e.kind == "join" and e.uid in uids}) == 1  # one group
    assert sched.check().ok

    kw = dict(kv_bits=bits, kv_group_size=G, quantized_kv_start=0, prefill_step_size=step)
    prefix = make_prompt_cache(model)
    assert [
        int(t) for t, _ in generate_step(mx.array(first), model, prompt_cache=prefix, max_tokens=8, **kw)
    ] == answer
    assert all(type(c) is QuantizedKVCache for c in prefix)
    trim_prompt_cache(prefix, prefix[0].offset - hit)
    tokens, from_prefix = _trace(model, turn[hit:], 10, bits, prompt_cache=prefix, **kw)
    uncached_tokens, uncached = _trace(model, turn, 10, bits, **kw)
    gap = np.abs(np.array(uncached) - np.array(from_prefix)).max()
    if resumed:
        assert sched.tokens(uids[0]) == tokens and gap < 1e-4
        np.testing.assert_allclose(sched.logprobs(uids[0]), from_prefix, rtol=0, atol=1e-4)
    else:
        assert gap > 1e-3, "resuming the prefix would change the numbers"
        assert sched.tokens(uids[0]) == uncached_tokens
        np.testing.assert_allclose(sched.logprobs(uids[0]), uncached, rtol=0, atol=1e-4)

    rec = row_record  # bit-equal on the CPU; on a GPU (matmuls round by shape) log-probs within 1e-4
    assert rec(sched, uids[1]) == rec(sched, a)  # the repeated prompt: its first run again
    for uid, request in zip(uids, requests):
        for cache in (clone_prompt_cache(before), None):  # alone with the same entries; without a cache
            alone = wb.Scheduler(model, tok, prompt_cache=cache, **settings)
            solo = alone.submit(request)
            alone.run()
            assert rec(alone, solo) == rec(sched, uid), (uid, cache)


@pytest.mark.parametrize("bits,ratio", [(4, 24), (8, 40)])
def test_the_cache_holds_the_quantized_bytes(make_sched, prompt, bits, ratio):
    """head dim 32 in float32 is 128 bytes; quantized it is 32 * bits / 8 packed bytes plus
    a float32 scale and bias (one group of 32)."""
    seen = {}
    for kv_bits in (None, bits):
        sched = make_sched(kv_bits=kv_bits, kv_group_size=G, max_batch=3)
        for i in range(3):
            sched.submit(wb.Request(prompt=prompt(20, 3 * i), max_tokens=4))
        while len(sched.batch) < 3:
            sched.admit()
        seen[kv_bits] = sched.snapshot().kv_bytes
    assert seen[None] > 0 and seen[bits] * 128 == seen[None] * ratio


def _one_request_projection(make_sched, prompt, bits):
    """Projected KV bytes of one 64 + 16-token request alone (``kv_projected_bytes``)."""
    sched = make_sched(kv_bits=bits, kv_group_size=G)
    sched.submit(wb.Request(prompt=prompt(64), max_tokens=16))
    sched.admit()
    return sched.kv_projected_bytes


def test_the_budget_projects_quantized_bytes_and_admits_more_rows(bundled, make_sched, prompt):
    model, _ = bundled
    n_layers = len(model.layers)
    assert projected_bytes(kv_profile(model), 1) == n_layers * 2 * H * D * 4
    assert projected_bytes(kv_profile(model, kv_quant=KVQuant(4, G)), 1) == n_layers * 2 * H * 24
    budget = _one_request_projection(make_sched, prompt, None)
    assert _one_request_projection(make_sched, prompt, 4) * 128 == budget * 24
    most = {}
    for bits in (None, 4):
        sched = make_sched(kv_bits=bits, kv_group_size=G, max_batch=8, kv_budget_bytes=budget)
        for i in range(8):
            sched.submit(wb.Request(prompt=prompt(64, 11 * i), max_tokens=16))
        most[bits] = 0
        while not sched.idle:
            sched.admit()
            most[bits] = max(most[bits], len(sched.batch))
            sched.step(), sched.filter()
        assert sched.check().ok
    # one float request's bytes hold 128 / 24 = 5.33 quantized requests; the projection of
    # a joining group may add a growth step (engine/kv/allocation.py), so 4 or 5 rows run
    assert most[None] == 1 and 4 <= most[4] <= 5


@pytest.mark.parametrize(
    "options,match",
    [
        (dict(kv_bits=3), r"kv_bits must be None \(float cache\) or one of \(4, 8\), got 3"),
        (dict(kv_bits=True), r"kv_bits must be"),
        (dict(kv_bits=4, kv_group_size=16), r"kv_group_size must be one of \(32, 64, 128\), got 16"),
        (dict(kv_group_size=48), r"kv_group_size must be one of \(32, 64, 128\), got 48"),
        (
            dict(kv_bits=4, kv_group_size=64),
            r"kv_group_size=64 does not divide layer 0's head dim \[32\]; allowed for this model: \[32\]",
        ),
    ],
)
def test_bad_kv_settings_are_refused_naming_the_field(make_sched, options, match):
    with pytest.raises(ValueError, match=match):
        make_sched(**options)


def _without_quantized_matmul(monkeypatch, missing_when=lambda q_keys: True):
    """Simulate a device whose MLX lacks ``quantized_matmul`` for some shapes (the CPU has
    every kernel; on an H200 with mlx 0.32.4 head dim 32 had none: ``1x7x32x16``)."""
    import mlx_lm.models.base as mlx_base

    real = mlx_base.quantized_scaled_dot_product_attention

    def missing(queries, q_keys, *args, **kwargs):
        if missing_when(q_keys):
            raise RuntimeError(
                f"[quantized_matmul] No implementation for problem shape: 1x{q_keys[0].shape[2]}x32x16"
            )
        return real(queries, q_keys, *args, **kwargs)

    monkeypatch.setattr(mlx_base, "quantized_scaled_dot_product_attention", missing)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_device_without_the_quantized_kernel_attends_by_dequantizing(make_sched, prompt, monkeypatch, bits):
    """Where MLX has no quantized_matmul for the model's shape, the scheduler takes the
    dequantizing attention path (chosen at construction, not found in a step), and every row
    equals mlx-lm's generate_step(kv_bits=...) alone with the same attention path."""
    from workbench.engine.levers import quantized_kv
    from workbench.engine.levers.quantized_attention import attention_path

    _without_quantized_matmul(monkeypatch)
    assert not quantized_kv.device_runs_quantized_attention(32)
    sched, uids = _run(make_sched, prompt, bits, max_batch=3)
    assert sched.recipe.kv_quant.attention == "dequantize"
    assert all(sched.request(u).status == wb.Status.FINISHED and not sched.request(u).error for u in uids)
    with attention_path(sched.model, "dequantize"):
        report = oracle.solo_check(sched.model, sched)
    _assert_rows_match(report)


def test_speculations_verify_forward_takes_the_dequantizing_path_too(make_sched, monkeypatch):
    """Where MLX lacks quantized_matmul, the verify forward of speculative decoding (1 + K
    positions per row) attends by dequantizing like every other forward: rows draft, accept
    and finish without error, each equal to generate_step(kv_bits=) on that path."""
    from workbench.engine.levers.quantized_attention import attention_path

    _without_quantized_matmul(monkeypatch)
    sched = make_sched(
        kv_bits=4, kv_group_size=G, max_batch=3, speculative="prompt-lookup", num_draft_tokens=3
    )
    assert sched.recipe.kv_quant.attention == "dequantize"
    code = ["def add(a, b):\n    return a + b\n\n", "import os\nimport sys\n", "x = 1\ny = 2\n"]
    uids = [sched.submit(wb.Request(prompt=p * 2, max_tokens=12)) for p in code]
    sched.run()
    assert all(sched.request(u).status == wb.Status.FINISHED and not sched.request(u).error for u in uids)
    assert sum(e.n_accepted for e in sched.events if e.kind == "draft") > 0
    with attention_path(sched.model, "dequantize"):
        report = oracle.solo_check(sched.model, sched)
    _assert_rows_match(report)


def _assert_rows_match(report):
    """Every row equals its solo reference. On CUDA, tokens only: float noise of batched vs
    solo attention (~1e-6) can move a key across an 8-bit quantization step, so log-probs
    differ by up to ~6e-4 there (measured on an H200: docs/gpu.md); on the CPU bit for bit."""
    from workbench.runtime.device import on_gpu

    if on_gpu():
        assert all(r.first_divergence_step is None and r.max_logprob_diff < 1e-3 for r in report.rows), (
            report.text()
        )
    else:
        assert report.n_match == len(report.rows), report.text()


def test_the_dequantizing_path_is_the_quantized_attention_within_rounding():
    """dequantized_attention equals mlx-lm's quantized_scaled_dot_product_attention (scores by
    quantized_matmul) within float32 rounding, with a padding mask and with GQA."""
    import mlx_lm.models.base as mlx_base

    from workbench.engine.levers.quantized_attention import dequantized_attention

    mx.random.seed(3)
    q = mx.random.normal((2, 4, 1, 32))
    k, v = (mx.quantize(mx.random.normal((2, 2, 9, 32)), group_size=32, bits=4) for _ in range(2))
    mask = mx.array([[True] * 9, [False] * 3 + [True] * 6])[:, None, None, :]
    got = dequantized_attention(q, k, v, scale=0.17, mask=mask, group_size=32, bits=4)
    want = mlx_base.quantized_scaled_dot_product_attention(
        q, k, v, scale=0.17, mask=mask, group_size=32, bits=4
    )
    # (mlx-lm's scales its queries in place: `queries *= scale`, so it runs second)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=1e-5)


def test_a_device_without_any_quantized_attention_path_is_refused_at_construction(make_sched, monkeypatch):
    """Neither quantized_matmul nor the dequantizing path runs: the scheduler refuses then,
    naming the shape, not in its first step."""
    from workbench.engine.levers import quantized_attention

    _without_quantized_matmul(monkeypatch)

    def broken(*args, **kwargs):
        raise RuntimeError("[dequantize] not here")

    monkeypatch.setattr(quantized_attention, "dequantized_attention", broken)
    with pytest.raises(
        ValueError,
        match=r"kv_bits=8, kv_group_size=32: MLX cannot run quantized attention for "
        r"head dim 32 on .*No implementation.*nor dequantized",
    ):
        make_sched(kv_bits=8, kv_group_size=32)
    assert make_sched(kv_bits=None) is not None


def test_a_kernel_missing_only_at_longer_keys_is_found_at_construction(make_sched, monkeypatch):
    """On the H200 a probe with one query and one key passed while steps failed at 60 keys
    (``1x60x32x12``) and at 8-query prefill chunks: the probe tries those shapes too, so such
    a device takes the dequantizing path from the start."""
    from workbench.engine.levers import quantized_kv
    from workbench.runtime.device import backend

    if backend() == "cuda":
        pytest.skip("on CUDA the dequantizing path is always taken (the test below)")
    assert quantized_kv.device_runs_quantized_attention(64)  # the CPU has every kernel
    _without_quantized_matmul(monkeypatch, lambda q_keys: q_keys[0].shape[2] == 60)
    assert make_sched(kv_bits=4, kv_group_size=32).recipe.kv_quant.attention == "dequantize"
    assert not quantized_kv.device_runs_quantized_attention(64)


def test_a_sliding_window_model_is_refused():
    model, tokenizer = wb.load("tiny-gemma3")
    with pytest.raises(ValueError, match="RotatingKVCache, which mlx-lm cannot quantize"):
        wb.Scheduler(model, tokenizer, kv_bits=4, kv_group_size=32)


@pytest.mark.parametrize(
    "options",
    [
        dict(max_batch=3),
        dict(max_batch=3, prefill_step_size=8),
        dict(max_batch=3, prefill_step_size=16, pacing=True),
    ],
)  # paced chunk sizes
def test_preempted_rows_resume_with_their_reference_first_forward(make_sched, prompt, options):
    """A preempted row re-prefills prompt + generated tokens; its first (float) chunk is
    still the reference's first forward (min(prefill_step_size, prompt - 1) tokens), so
    it still equals generate_step with kv_bits (without that, uid 2 here drifts by 3e-2)."""
    sched = make_sched(kv_bits=4, kv_group_size=G, **options)
    specs = ((3, 12), (60, 9), (17, 14), (1, 9), (33, 10), (1, 8))
    for i, (n, m) in enumerate(specs):
        sched.submit(wb.Request(prompt=prompt(n, 13 * i), max_tokens=m))
    preempted, calls = set(), 0
    while not sched.idle:
        sched.admit(), sched.step(), sched.filter()
        calls += 1
        live = [r.uid for r in sched.batch.rows if not r.finished and r.tokens]
        if calls % 3 == 0 and live and len(preempted) < 3:
            sched.preempt(live[-1])
            preempted.add(live[-1])
    assert preempted and sched.check().ok
    report = oracle.solo_check(sched.model, sched)
    assert report.n_match == len(specs), report.text()


def test_a_model_without_full_attention_layers_is_refused():
    model, tokenizer = wb.load("tiny-mamba2")
    with pytest.raises(
        ValueError, match=r"no full-attention KVCache layer to quantize \(its layers: \['ArraysCache'\]\)"
    ):
        wb.Scheduler(model, tokenizer, kv_bits=8, kv_group_size=32)


def test_per_row_adapters_with_a_quantized_cache_match_mlx_lm_alone(prompt):
    """LoRA adapters (workbench.engine.levers.lora) on a quantized cache: a one-token prompt
    with an adapter joins a prefilled group, so its float first forward runs with its own
    adapter; every row equals mlx_lm.load(adapter_path=...) + generate_step(kv_bits=4)."""
    from pathlib import Path

    from workbench.verify.adapter_oracle import adapter_check

    root = Path(__file__).resolve().parents[2]
    adapters = {"prose": str(root / "data/adapters/prose"), "numbers": str(root / "data/adapters/numbers")}
    model, tokenizer = wb.load(str(wb.BUNDLED_MODEL))  # a private copy: the scheduler wraps its layers
    sched = wb.Scheduler(model, tokenizer, max_batch=3, kv_bits=4, kv_group_size=G, adapters=adapters)
    specs = [(9, "prose"), (1, "numbers"), (14, None), (1, "prose"), (5, "numbers")]
    for i, (n, name) in enumerate(specs):
        sched.submit(wb.Request(prompt=prompt(n, 21 * i), max_tokens=8, adapter=name))
    sched.run()
    report = adapter_check(str(wb.BUNDLED_MODEL), sched)
    assert report.n_match == len(specs), report.text()


def test_on_cuda_the_dequantizing_path_is_always_taken(monkeypatch):
    """MLX's CUDA quantized_matmul failed at shapes the probe cannot cover (head dim 64 at 257
    keys), so on CUDA the scheduler never relies on it; the CPU keeps mlx-lm's path."""
    from workbench.engine.levers.quantized_attention import choose_attention
    from workbench.runtime import device

    assert choose_attention(2, 64, mx.float32, 32, 4) == (
        "dequantize" if device.backend() == "cuda" else "quantized_matmul"
    )
    monkeypatch.setattr(device, "backend", lambda: "cuda")
    assert choose_attention(2, 64, mx.float32, 32, 4) == "dequantize"
