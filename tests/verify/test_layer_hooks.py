"""Layer hooks: every layer's output recorded from the model's own forward, the layers put
back afterwards, also where ``model.layers`` is a fresh slice (qwen3-next)."""

import mlx.core as mx
import numpy as np
import pytest

import workbench as wb
from workbench.verify.layer_hooks import hooked_layers, model_layers, recorded_layers

pytestmark = pytest.mark.model


def test_recorded_layers_hold_the_residual_stream_the_logits_come_from(bundled):
    model, _ = bundled
    tokens = mx.array([[5, 6, 7], [8, 9, 10]], dtype=mx.uint32)  # [B=2, L=3]
    with recorded_layers(model) as outputs:
        logits = model(tokens)
    assert len(outputs) == len(model.layers) == 5 and all(len(o) == 1 for o in outputs)
    assert all(o[0].shape == (2, 3, 128) for o in outputs)  # [B, L, hidden]
    again = model.lm_head(model.model.norm(outputs[-1][0]))
    assert np.array_equal(np.array(again), np.array(logits))


def test_hooked_layers_put_the_real_layers_back_even_after_an_error(bundled):
    model, _ = bundled
    before = [id(layer) for layer in model.layers]
    with pytest.raises(RuntimeError):
        with hooked_layers(model, {2: lambda i, layer, args, kwargs: layer(*args, **kwargs)}):
            assert type(model.layers[2]).__name__ == "_Wrapped" and model.layers[2].self_attn is not None
            raise RuntimeError("inside")
    assert [id(layer) for layer in model.layers] == before


def test_a_hook_sees_its_layer_index_and_can_change_the_output(bundled):
    model, _ = bundled
    tokens = mx.array([[5, 6]], dtype=mx.uint32)
    plain = model(tokens)
    seen = []

    def zero(i, layer, args, kwargs):
        seen.append(i)
        return mx.zeros_like(layer(*args, **kwargs))

    with hooked_layers(model, {4: zero}):
        changed = model(tokens)
    assert seen == [4] and not np.allclose(np.array(plain), np.array(changed))
    assert np.array_equal(np.array(model(tokens)), np.array(plain))


def test_layers_held_behind_a_slicing_property_are_hooked():
    model, _ = wb.load("tiny-qwen3-next")
    assert model.layers is not model.layers  # pipeline_layers slices the list on every call
    with recorded_layers(model) as outputs:
        model(mx.array([[1, 2, 3]], dtype=mx.uint32))
    assert [len(o) for o in outputs] == [1] * len(model_layers(model))


def test_hooking_refuses_a_layer_index_out_of_range_and_a_model_without_layers(bundled):
    model, _ = bundled
    with pytest.raises(ValueError, match="out of range"):
        with hooked_layers(model, {5: None}):
            pass
    with pytest.raises(ValueError, match="no `layers`"):
        model_layers(object())
