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
