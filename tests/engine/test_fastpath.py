"""Decode fast paths (workbench/engine/levers/fastpath.py): attention without a mask where no row
is padded, compiled MLPs. Each is checked against what it replaces: the caches' own
``left_padding`` (read from the arrays) and the tokens / log-probs of the plain path."""

import numpy as np
import pytest

import workbench as wb
from workbench.engine.levers import fastpath
from workbench.runtime import device
from workbench.verify.mask_oracle import recorded_masks


def _run(model, tokenizer, prompts, **kwargs):
    sched = wb.Scheduler(model, tokenizer, max_batch=4, **kwargs)
    for p in prompts:
        sched.submit(wb.Request(prompt=p, max_tokens=6))
    sched.run()
    return {uid: (r.tokens, r.logprobs) for uid, r in sched.requests.items()}


def test_unpadded_agrees_with_the_caches_left_padding_at_every_step(bundled, prompt, monkeypatch):
    """Each decode launch decides "no mask" from Python fields alone; the caches' own
    ``left_padding`` array must then be all zeros, and it must decide so where it is."""
    model, tokenizer = bundled
    seen = []
    real = fastpath.unpadded

    def checked(caches, held):
        answer = real(caches, held)
        pads = np.array(caches[0].left_padding).tolist()
        seen.append((answer, pads))
        return answer

    monkeypatch.setattr(fastpath, "unpadded", checked)
    sched = wb.Scheduler(model, tokenizer, max_batch=3, prefill_step_size=8)
    for n in (5, 5, 9, 3):  # two equal lengths: an unpadded batch first, then padded joiners
        sched.submit(wb.Request(prompt=prompt(n), max_tokens=4 if n == 9 else 8))
    sched.run()
    assert seen, "no decode step ran"
    for answer, pads in seen:
        assert answer == (max(pads) == 0), (answer, pads)
    assert any(a for a, _ in seen) and not all(a for a, _ in seen), "both cases should occur"


def test_no_mask_is_what_the_model_sees_and_tokens_are_bit_equal(bundled, prompt):
    """At B = 1 the model gets no mask at all (``None``), and tokens and log-probs equal the
    run through mlx-lm's own mask bit for bit."""
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=1)
    sched.submit(wb.Request(prompt=prompt(7), max_tokens=5))
    sched.admit()
    with recorded_masks(model) as seen:
        sched.step()
    assert seen and all(s.mask is None for s in seen)

    fast = _run(model, tokenizer, [prompt(7)])
    plain = _run(model, tokenizer, [prompt(7)], fast_decode=False)
    assert fast == plain


def test_padded_rows_keep_their_mask(bundled, prompt):
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=2)
    sched.submit(wb.Request(prompt=prompt(4), max_tokens=3))
    sched.submit(wb.Request(prompt=prompt(9), max_tokens=3))
    sched.admit()
    with recorded_masks(model) as seen:
        sched.step()
    assert seen and all(s.mask is not None and not s.mask.all() for s in seen)


def test_the_mask_patch_is_undone_even_when_the_forward_raises(bundled, prompt):
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=1)
    sched.submit(wb.Request(prompt=prompt(6), max_tokens=4))
    sched.admit()
    caches = sched.state.batch.caches
    with pytest.raises(RuntimeError):
        with fastpath.without_mask(caches):
            assert caches[0].make_mask(1) is None
            raise RuntimeError("boom")
    assert caches[0].make_mask(1) is not None
    assert "make_mask" not in caches[0].__dict__


def test_compiled_mlps_give_equal_tokens_and_are_restored(random_llama):
    model, tokenizer = random_llama
    assert fastpath.compilable(model)
    plain_mlps = [layer.mlp for layer in model.layers]
    ids = [[(7 * i + n) % 1000 for i in range(n)] for n in (3, 8, 12)]
    compiled = _run(model, tokenizer, ids, fast_decode=True)
    plain = _run(model, tokenizer, ids, fast_decode=False)
    assert [layer.mlp for layer in model.layers] == plain_mlps
    for uid in plain:
        assert compiled[uid][0] == plain[uid][0]
        np.testing.assert_allclose(compiled[uid][1], plain[uid][1], rtol=0, atol=1e-5)


def test_compiled_mlps_are_opt_in_and_never_with_adapters():
    cuda = device.backend() == "cuda"  # the padded-rows kernel: on CUDA only
    rows = fastpath.PADDED_KERNEL_MIN_ROWS
    assert fastpath.FastDecode.of(None) == fastpath.FastDecode(True, False, cuda, rows)
    assert fastpath.FastDecode.of(True) == fastpath.FastDecode(True, True, cuda, rows)
    assert fastpath.FastDecode.of(False) == fastpath.FastDecode(False, False, False, rows)
    assert fastpath.FastDecode.of(True, adapters=object()) == fastpath.FastDecode(True, False, cuda, rows)


@pytest.mark.parametrize("bad", ["yes", 1, 0.0])
def test_fast_decode_takes_none_true_or_false_only(bad):
    with pytest.raises(ValueError, match=r"fast_decode must be None, True or False, got"):
        fastpath.FastDecode.of(bad)


# -- the padded-rows attention kernel (CUDA): dispatch checked on the CPU, the kernel on the GPU --


def _reference_kernel(calls):
    """What ``padded_decode_attention`` computes, in MLX ops: attention over each row's
    ``left_padding .. columns - 1`` (the padding mask rebuilt from the arguments alone)."""
    import mlx.core as mx

    def kernel(queries, keys, values, left_padding, columns, scale):
        calls.append((queries.shape, keys.shape, columns))
        cols = mx.arange(columns)
        mask = (cols[None, :] >= left_padding[:, None])[:, None, None, :]
        return mx.fast.scaled_dot_product_attention(
            queries, keys[..., :columns, :], values[..., :columns, :], scale=scale, mask=mask
        )

    return kernel


def test_the_padded_kernel_is_on_by_default_on_cuda_only(monkeypatch):
    monkeypatch.setattr(device, "backend", lambda: "cpu")
    assert not fastpath.FastDecode.of(None).padded_kernel
    monkeypatch.setattr(device, "backend", lambda: "cuda")
    assert fastpath.FastDecode.of(None).padded_kernel and fastpath.FastDecode.of(True).padded_kernel
    assert not fastpath.FastDecode.of(False).padded_kernel


def test_padded_rows_reach_the_kernel_with_their_padding_and_buffers(bundled, prompt, monkeypatch):
    """Forced on (the CPU has no CUDA kernel: MLX ops stand in for it, from the arguments
    alone): padded decode steps go to the kernel with the cache's whole buffers, its left
    padding and write index, and every token and log-prob equals the plain path's; unpadded
    steps keep the no-mask path; mlx-lm's function is restored after each step."""
    import mlx_lm.models.llama as llama

    from workbench.engine.levers import padded_attention

    model, tokenizer = bundled
    prompts = [prompt(n, 7 * n) for n in (5, 9, 3, 12)]
    plain = _run(model, tokenizer, prompts, fast_decode=False)
    calls = []
    monkeypatch.setattr(padded_attention, "padded_decode_attention", _reference_kernel(calls))
    monkeypatch.setattr(padded_attention, "supported", lambda q, k: q.shape[2] == 1)
    monkeypatch.setattr(padded_attention, "HEAD_DIMS", (16, 32, 64, 128))  # the bundled model's head dim too
    monkeypatch.setattr(
        fastpath.FastDecode, "of", classmethod(lambda cls, f, adapters=None: cls(True, False, True))
    )
    original = llama.scaled_dot_product_attention
    fast = _run(model, tokenizer, prompts)
    assert fast == plain
    assert calls and all(q[2] == 1 and k[2] >= columns for q, k, columns in calls)
    assert llama.scaled_dot_product_attention is original


def test_steps_of_fewer_rows_than_the_crossover_keep_masked_attention(bundled, prompt, monkeypatch):
    """With ``kernel_min_rows=3``, the kernel (MLX ops standing in for it) serves padded steps
    of 3 or 4 rows only; once rows finish and 2 remain, the steps run mlx-lm's masked
    attention; tokens equal the plain path's throughout."""
    from workbench.engine.levers import padded_attention

    model, tokenizer = bundled
    prompts = [prompt(n, 7 * n) for n in (5, 9, 3, 12)]
    sched = wb.Scheduler(model, tokenizer, max_batch=4, fast_decode=False)
    uids = [sched.submit(wb.Request(prompt=p, max_tokens=m)) for p, m in zip(prompts, (3, 9, 4, 9))]
    sched.run()
    plain = [sched.requests[u].tokens for u in uids]
    calls = []
    monkeypatch.setattr(padded_attention, "padded_decode_attention", _reference_kernel(calls))
    monkeypatch.setattr(padded_attention, "supported", lambda q, k: q.shape[2] == 1)
    monkeypatch.setattr(padded_attention, "HEAD_DIMS", (16, 32, 64, 128))
    monkeypatch.setattr(
        fastpath.FastDecode,
        "of",
        classmethod(lambda cls, f, adapters=None: cls(True, False, True, kernel_min_rows=3)),
    )
    sched = wb.Scheduler(model, tokenizer, max_batch=4)
    uids = [sched.submit(wb.Request(prompt=p, max_tokens=m)) for p, m in zip(prompts, (3, 9, 4, 9))]
    paths = []
    while not sched.idle:
        sched.admit()
        sched.step()
        paths.append((sched.snapshot().batch_size, sched.snapshot().fast_path))
        sched.filter()
    assert [sched.requests[u].tokens for u in uids] == plain
    assert calls and all(q[0] >= 3 for q, _, _ in calls)
    assert any(b == 2 and "padded kernel" not in (path or "") for b, path in paths)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_on_the_gpu_the_padded_kernel_equals_masked_attention(head_dim):
    import mlx.core as mx

    from workbench.engine.levers.padded_attention import padded_decode_attention

    mx.random.seed(0)
    B, n_q, n_kv, S, columns = 5, 8, 2, 512, 300
    q = mx.random.normal((B, n_q, 1, head_dim))
    k, v = mx.random.normal((B, n_kv, S, head_dim)), mx.random.normal((B, n_kv, S, head_dim))
    lp = mx.array([0, 3, 150, 299, 17])
    calls = []
    want = _reference_kernel(calls)(q, k, v, lp, columns, head_dim**-0.5)
    got = padded_decode_attention(q, k, v, lp, columns, head_dim**-0.5)
    assert mx.abs(got - want).max().item() < 1e-5
    half = padded_decode_attention(
        q.astype(mx.bfloat16), k.astype(mx.bfloat16), v.astype(mx.bfloat16), lp, columns, head_dim**-0.5
    )
    assert half.dtype == mx.bfloat16 and mx.abs(half.astype(mx.float32) - want).max().item() < 0.05


def test_snapshots_say_which_fast_path_the_last_decode_step_took(bundled, prompt):
    """``Snapshot.fast_path``: "" before any decode step, "no mask" at B = 1, "none" over
    padded rows where the kernel does not serve (the CPU; the bundled model's head dim) and
    with ``fast_decode=False``; a checkpoint restores it with the rest."""
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=1)
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=4))
    assert sched.snapshot().fast_path == ""
    sched.admit(), sched.step()
    assert sched.snapshot().fast_path == "no mask"
    cp = sched.checkpoint()
    padded = wb.Scheduler(model, tokenizer, max_batch=2)
    for n in (3, 9):
        padded.submit(wb.Request(prompt=prompt(n), max_tokens=4))
    padded.admit(), padded.step()
    assert padded.snapshot().fast_path == "none"  # no kernel on the CPU; on CUDA not for head dim 16 either
    assert not fastpath.kernel_serves(padded.state.batch.caches)
    off = wb.Scheduler(model, tokenizer, max_batch=1, fast_decode=False)
    off.submit(wb.Request(prompt=prompt(5), max_tokens=4))
    off.admit(), off.step()
    assert off.snapshot().fast_path == "none"
    sched.run()
    sched.restore(cp)
    assert sched.snapshot().fast_path == "no mask"
