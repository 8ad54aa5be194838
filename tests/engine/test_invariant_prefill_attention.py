"""The mode's prefill attention of several prompts in one fused-attention call
(:mod:`workbench.engine.levers.invariant_prefill_attention`): the grouping, the shared call's
values against each row's call alone, the device check that decides it (and catches a kernel
that rounds a padded row otherwise), and the engine's rows bit-equal alone through it (bf16 on
the CPU, where the check holds; on CUDA by ``tests/engine/test_invariant_gpu_range.py``)."""

import mlx.core as mx
import pytest

import workbench as wb
from tests.engine.test_invariant import variant
from tests.engine.test_invariant_prefill import _requests
from workbench.engine.levers import invariant_prefill
from workbench.engine.levers import invariant_prefill_attention as pa
from workbench.verify import invariance

pytestmark = pytest.mark.model


def count_calls(monkeypatch):
    """A list whose first item counts ``mx.fast.scaled_dot_product_attention`` calls from now."""
    count, real = [0], mx.fast.scaled_dot_product_attention

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", counted)
    return count


@pytest.fixture(autouse=True)
def _on_the_cpu():
    """These tests stand a GPU's shared call in with the CPU's kernels (``BACKENDS`` patched to
    the CPU), on a GPU machine too: the CPU device. On CUDA the shared call is checked by
    ``test_invariant_gpu_range``'s 96-row test (it asserts the device check held) and
    ``scripts/lab/invariant_prefill_profile.py`` (docs/gpu.md)."""
    with mx.stream(mx.cpu):
        yield


def test_rows_of_one_offset_share_a_call_and_short_or_lone_rows_attend_alone():
    assert pa.groups([0, 0, 0, 16, 16, 0, 16], [12, 3, 20, 9, 20, 1, 10], batched=True) == [
        [0, 2],
        [1],
        [3, 4, 6],
        [5],
    ]
    assert pa.groups([0, 0, 16], [12, 20, 9], batched=False) == [[0], [1], [2]]
    assert pa.groups([0, 0], [8, 9], batched=True) == [[0], [1]]  # 8 queries: SOLO_QUERIES


def test_a_shared_call_gives_each_real_query_its_attention_alone_in_row_order(monkeypatch):
    H, Hkv, D, C = 4, 2, 64, 20
    offsets, lengths = [0, 0, 0, 16, 16, 0, 16], [12, 3, 20, 9, 20, 1, 10]
    B = len(lengths)
    q = mx.random.normal((B, H, C, D), key=mx.random.key(1))
    fresh = tuple(mx.random.normal((B, Hkv, C, D), key=mx.random.key(i)) for i in (2, 3))
    cached = [
        tuple(mx.random.normal((1, Hkv, o, D), key=mx.random.key(10 + b + i)) for i in (0, 1))
        for b, o in enumerate(offsets)
    ]
    # each row's cache as KVCache returns it: the earlier chunks, then this forward's real keys
    fetched = [
        tuple(mx.concatenate([old, new[b : b + 1, :, :n]], axis=2) for old, new in zip(cached[b], fresh))
        for b, n in enumerate(lengths)
    ]
    for b, o in enumerate(offsets):  # a group at offset 0 attends the forward's keys: equal there
        if o == 0:
            fresh[0][b : b + 1, :, : lengths[b]] = fetched[b][0][:, :, : lengths[b]]
    count = count_calls(monkeypatch)
    alone = pa.attend(q, fresh, fetched, offsets, lengths, 0.125, batched=False)
    assert count[0] == B
    shared = pa.attend(q, fresh, fetched, offsets, lengths, 0.125, batched=True)
    assert count[0] == B + 4  # [0, 2], [1], [3, 4, 6], [5]
    assert shared.shape == alone.shape == (B, H, C, D)
    for b, n in enumerate(lengths):
        assert mx.allclose(shared[b, :, :n], alone[b, :, :n], atol=1e-5).item(), b
        assert mx.isfinite(shared[b]).all().item()


def test_the_check_passes_a_kernel_that_keeps_padded_rows_bits_and_fails_one_that_does_not(monkeypatch):
    assert not pa.batched_attention_holds("cpu", 2, 1, 64, mx.bfloat16)  # the CPU is not tried
    monkeypatch.setattr(pa, "BACKENDS", ("cpu",))
    monkeypatch.setattr(pa, "_HOLDS", {})
    # measured: MLX's CPU attention keeps a padded bf16 row's bits (float32's with OpenBLAS not)
    assert pa.batched_attention_holds("cpu", 2, 1, 64, mx.bfloat16)
    monkeypatch.setattr(pa, "BACKENDS", ())  # a backend taken out is out, whatever was checked
    assert not pa.batched_attention_holds("cpu", 2, 1, 64, mx.bfloat16)
    monkeypatch.setattr(pa, "BACKENDS", ("cpu",))
    real = mx.fast.scaled_dot_product_attention

    def rounds_a_shared_call_otherwise(q, k, v, **kwargs):  # one ulp off in the last row of a batch
        out = real(q, k, v, **kwargs)
        return out if q.shape[0] == 1 else mx.concatenate([out[:-1], out[-1:] * (1 + 2**-7)])

    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", rounds_a_shared_call_otherwise)
    monkeypatch.setattr(pa, "_HOLDS", {})
    assert not pa.batched_attention_holds("cpu", 2, 1, 64, mx.bfloat16)


def test_with_the_shared_call_every_row_is_bit_equal_alone_in_fewer_attention_calls(monkeypatch):
    model, tok = variant("llama-bf16")
    reqs, chunk = _requests(tok), 16  # chunks of 9-16 queries share a call (more than SOLO_QUERIES)
    solo = [invariance.alone(model, tok, r, chunk) for r in reqs]

    def run():
        count = count_calls(monkeypatch)
        sched = wb.Scheduler(model, tok, max_batch=len(reqs), prefill_step_size=chunk, batch_invariant=True)
        uids = [sched.submit(r) for r in reqs]
        sched.run()
        return [(sched.tokens(u), sched.logprobs(u)) for u in uids], count[0]

    got, per_row = run()
    assert [i for i, (a, b) in enumerate(zip(got, solo)) if a != b] == []
    monkeypatch.setattr(pa, "BACKENDS", ("cpu",))  # where the check holds (bf16, measured above)
    monkeypatch.setattr(pa, "_HOLDS", {})
    got, shared = run()
    assert list(pa._HOLDS.values()) == [True]
    assert [i for i, (a, b) in enumerate(zip(got, solo)) if a != b] == []
    check = 2 * (1 + 2 * len(pa.CHECK_LENGTHS))  # the check: 2 offsets, the batched call, each row twice
    layers = len(model.layers)
    # at least a forward's 5 rows of 9-16 queries in one call a layer instead of 5
    assert per_row - (shared - check) >= 4 * layers, (per_row, shared)
    # with the padding rows projected too (no gather and scatter): still every row's bits
    monkeypatch.setattr(invariant_prefill, "REAL_ROWS_ONLY", set())
    got, _ = run()
    assert [i for i, (a, b) in enumerate(zip(got, solo)) if a != b] == []
