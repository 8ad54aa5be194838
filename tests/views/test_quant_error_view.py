"""The quantization-error view: numpy's unpacking equals mx.dequantize, the engine's quantized
cache holds mx.quantize of the float keys, and every group's error is within one step (|scale|)."""

import mlx.core as mx
import numpy as np
import pytest
from matplotlib.figure import Figure

import workbench as wb
from workbench.views.quant_error import dequantize, group_errors, key_error_text, render_key_error, unpack
from workbench.workloads.workload import prompt_maker


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("group_size", [32, 64])
def test_dequantize_is_mlx_dequantize(bits, group_size):
    w = mx.random.normal((3, 128), key=mx.random.key(bits * group_size))
    parts = mx.quantize(w, group_size=group_size, bits=bits)
    ours = dequantize(*(np.array(a) for a in parts), bits, group_size)
    assert np.abs(ours - np.array(mx.dequantize(*parts, group_size=group_size, bits=bits))).max() < 1e-6
    rows = group_errors(np.array(w), [np.array(a) for a in parts], bits, group_size)
    assert len(rows) == 3 * 128 // group_size and all(r["within_step"] for r in rows)


def test_unpack_order_and_refusals():
    assert unpack(np.array([0x87654321], np.uint32), 4).tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    with pytest.raises(ValueError, match="bits must be 2, 4 or 8"):
        unpack(np.zeros(1, np.uint32), 3)
    with pytest.raises(ValueError, match="32 values need 1 groups of 32, got 2 scales"):
        dequantize(np.zeros(4, np.uint32), np.ones(2), np.zeros(2), 4, 32)


def test_the_engines_quantized_key_against_the_float_cache(bundled):
    model, tok = bundled
    prompt = prompt_maker(tok)
    specs = [(5, 8), (12, 8), (2, 8)]

    def admitted(**kw):
        sched = wb.Scheduler(model, tok, max_batch=3, kv_group_size=32, **kw)
        for i, (n, m) in enumerate(specs):
            sched.submit(wb.Request(prompt=prompt(n, 40 * i), max_tokens=m))
        sched.admit()
        return sched

    q4, flt = admitted(kv_bits=4), admitted(kv_bits=None)
    quantized = [np.array(a[1, :, 11]) for a in q4.batch_cache[0].keys]
    original = np.array(
        flt.batch_cache[0].keys[1, :, 11]
    )  # [2 heads, 32]: layer 0, uid 1's last prompt token
    expected = mx.quantize(mx.array(original), group_size=32, bits=4)
    assert all(np.array_equal(np.array(e), a) for e, a in zip(expected, quantized))
    text = key_error_text(original, quantized, 4, 32, ["head 0", "head 1"])
    assert text.startswith(
        "4-bit, groups of 32: 2 group(s) of key vector values\n  head 0 (values 0-31): scale "
    )
    assert text.count("<= |scale| ") == 2
    errors = [r["max_error"] for r in group_errors(original, quantized, 4, 32)]
    assert all(e > 0 for e in errors)  # 4 bits lose something on a real key
    assert isinstance(render_key_error(original, quantized, 4, 32), Figure)
