"""MLX's CPU buffer cache limit (workbench.runtime.memory)."""

import mlx.core as mx
import pytest

from workbench.runtime import memory


@pytest.fixture
def restore_limit():
    before = mx.set_cache_limit(0)
    mx.set_cache_limit(before)
    yield before
    mx.set_cache_limit(before)


def test_import_raised_the_cache_limit_above_mlx_cpu_default(restore_limit):
    assert memory.STATUS.after_bytes >= 32 << 20
    assert restore_limit == memory.STATUS.after_bytes


def test_limit_is_raised_to_the_requested_bytes_and_never_lowered(monkeypatch, restore_limit):
    mx.set_cache_limit(32 << 20)
    monkeypatch.setenv(memory.ENV, str(64 << 20))
    status = memory.raise_cache_limit()
    assert (status.before_bytes, status.after_bytes) == (32 << 20, 64 << 20)
    monkeypatch.setenv(memory.ENV, str(16 << 20))
    status = memory.raise_cache_limit()
    assert status.after_bytes == 64 << 20 and "kept" in status.note


def test_zero_keeps_mlx_default_and_bad_values_name_the_variable(monkeypatch, restore_limit):
    mx.set_cache_limit(32 << 20)
    monkeypatch.setenv(memory.ENV, "0")
    assert memory.raise_cache_limit().after_bytes == 32 << 20
    monkeypatch.setenv(memory.ENV, "lots")
    with pytest.raises(ValueError, match=memory.ENV):
        memory.raise_cache_limit()


# -- what a buffer really takes: MLX's allocator rounding ----------------------------------

SIZES = [4, 8, 12, 400, 4000, 16384, 16385, 98304, 517482, 4_000_000]


def _measured_growth(n_bytes):
    """Independent measurement: MLX's active memory taken by a fresh uint8 buffer."""
    import gc

    mx.synchronize()
    gc.collect()
    mx.clear_cache()  # else MLX may hand back a larger freed buffer (seen in CI: 19,712 bytes for 16,385)
    before = mx.get_active_memory()
    a = mx.zeros((n_bytes,), mx.uint8) + 1
    mx.eval(a)
    mx.synchronize()  # on CUDA the temporaries (the scalars) are freed when the stream completes
    grown = mx.get_active_memory() - before
    del a
    return grown


def _growths_near(n_bytes, tries=3):
    """Up to ``tries`` measurements of ``n_bytes``' growth, stopping at the first within
    [allocation_bytes, allocation_bytes + 64): in a process that ran other tests, a buffer
    freed by earlier work can land between the two readings."""
    want, seen = memory.allocation_bytes(n_bytes), []
    for _ in range(tries):
        seen.append(_measured_growth(n_bytes))
        if 0 <= seen[-1] - want < 64:
            break
    return seen


def test_the_cuda_rounding_rule_of_mlx_allocator():
    """``CudaAllocator::malloc``: <= 8 bytes take 8, < 16 KiB the next power of two, larger
    sizes whole 16 KiB pages (on the H200 a 517,482-byte array took 524,288)."""
    got = [memory.allocation_bytes(n, "cuda") for n in SIZES]
    assert got == [8, 8, 16, 512, 4096, 16384, 32768, 98304, 524288, 4014080]
    assert all(memory.allocation_bytes(n, "cpu") == n for n in SIZES)
    assert memory.allocation_bytes(0, "cuda") == 0
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="nbytes must be an int >= 0"):
            memory.allocation_bytes(bad)
    with pytest.raises(ValueError, match=r"backend must be one of \('cuda', 'metal', 'cpu'\)"):
        memory.allocation_bytes(4, "CUDA")


def test_allocation_bytes_are_what_the_default_device_takes():
    """On whatever device runs the suite (the CPU in CI, CUDA on the lent GPU): each
    buffer's measured active-memory growth is ``allocation_bytes`` of its size (within the
    8-byte blocks of a scalar temporary MLX may still hold)."""
    for n in SIZES[3:]:
        seen = _growths_near(n)
        assert 0 <= seen[-1] - memory.allocation_bytes(n) < 64, (n, seen)


@pytest.mark.gpu
def test_on_the_gpu_buffers_take_the_allocator_rounded_bytes():
    assert any(memory.allocation_bytes(n) != n for n in SIZES)  # the device rounds, unlike the CPU
    for n in SIZES[3:]:
        grown = _growths_near(n)[-1]
        assert 0 <= grown - memory.allocation_bytes(n) < 64, (n, grown)
        if memory.allocation_bytes(n) - n >= 64:  # the rounding is seen, not only allowed
            assert grown - n >= 64, (n, grown)


def test_inside_exact_allocations_a_fresh_buffer_takes_its_allocation_bytes_and_the_limit_comes_back(
    restore_limit,
):
    """With the buffer cache off no larger freed buffer is handed back (the 19,712 bytes for
    16,385 seen in CI): a buffer's growth of the idle device's active memory is its
    ``allocation_bytes`` (within the stray scalars of one op)."""
    big = mx.zeros((40_000,), mx.uint8) + 1  # freed below: a larger buffer the cache would otherwise offer
    mx.eval(big)
    del big
    with memory.exact_allocations():
        assert mx.set_cache_limit(0) == 0  # off inside
        for n in (16385, 4000, 98304):
            before = memory.settled_active_memory()
            a = mx.zeros((n,), mx.uint8) + 1
            mx.eval(a)
            grown = memory.settled_active_memory() - before
            assert 0 <= grown - memory.allocation_bytes(n) < 64, (n, grown)
            del a
    assert mx.set_cache_limit(restore_limit) == restore_limit  # restored after
