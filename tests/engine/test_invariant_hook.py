"""The batch-invariant mode's host work per forward (``levers/invariant_hook.py``): each
projection's plan is worked out once per module, not at every call of every forward, and a
forward's attention works out its rows' columns once, not once per layer (on CUDA the decode
step is host-bound: ``docs/batch-invariance.md``, "Cost"). Counted, not timed."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache

from tests.engine.test_invariant_fuse import Toy, _mode
from workbench.engine.levers import invariant, invariant_attention, invariant_fuse
from workbench.engine.levers.invariant import Invariance


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    """Fusion on for the CPU (off by default), on the CPU device (on a GPU machine too)."""
    monkeypatch.setattr(invariant_fuse, "FUSE_BACKENDS", ("cpu",))
    with mx.stream(mx.cpu):
        yield


def _counting(monkeypatch, owner, name) -> list:
    calls: list = []
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_a_projections_plan_is_worked_out_once_not_at_every_forward(monkeypatch):
    model = Toy()
    tokens = mx.array([[3], [7], [11]])
    inv = Invariance.calibrate(model)
    assert len(inv.fused) == 5  # q / k / v and gate / up
    first = _mode(model, tokens, inv)
    plans = _counting(monkeypatch, Invariance, "plan_for")
    again = [_mode(model, tokens, inv) for _ in range(3)]
    # main (aef8d6a) looked each projection's plan up at every call: 4 a forward here (the two
    # groups, o_proj, down_proj), 65 a step for a 16-layer llama
    assert plans == []
    for out in again:
        assert mx.array_equal(out, first).item()


def test_a_replaced_weight_gets_its_projection_a_new_plan():
    model = Toy()
    tokens = mx.array([[3], [7]])
    inv = Invariance.calibrate(model)
    stale = _mode(model, tokens, inv)
    model.attn.o_proj.weight = 2 * model.attn.o_proj.weight
    out = _mode(model, tokens, inv)
    fresh = Invariance(inv.backend, inv.blocks, inv.fused)  # nothing kept from earlier forwards
    assert mx.array_equal(out, _mode(model, tokens, fresh)).item()
    assert not mx.allclose(out, stale).item()


def test_every_layer_of_a_forward_attends_from_columns_worked_out_once(monkeypatch):
    B, H, Hkv, D, S = 3, 4, 2, 32, 9
    held = [5, 8, 2]
    caches = [BatchKVCache([4, 1, 7]) for _ in range(4)]  # four layers, one width
    layers = []
    for i, cache in enumerate(caches):
        k, v = (mx.random.normal((B, Hkv, S, D), key=mx.random.key(2 * i + j)) for j in (1, 2))
        layers.append(
            (mx.random.normal((B, H, 1, D), key=mx.random.key(9 + i)), *cache.update_and_fetch(k, v))
        )
    made = _counting(monkeypatch, invariant_attention, "starts_array")
    sdpa = invariant._per_row(held)  # one forward's attention hook
    outs = [sdpa(None, q, k, v, cache, 0.3, None) for (q, k, v), cache in zip(layers, caches)]
    assert len(made) == 1  # main (aef8d6a): once per layer, each time a [B] tuple compared
    for (q, k, v), cache, out in zip(layers, caches, outs):
        alone = invariant_attention.per_row_attention(
            None, invariant.row_attention, q, k, v, cache, 0.3, held, cuda=False
        )
        assert mx.array_equal(out, alone).item()
