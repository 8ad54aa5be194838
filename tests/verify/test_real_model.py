"""SmolLM2-135M-Instruct (converted from its GGUF) through the engine: it answers, and every
batched row equals the same request run alone through mlx-lm (the solo oracle)."""

from __future__ import annotations

import pytest

import workbench as wb
from tests.real_model import NAME, chat_ids, quantized_real_model
from workbench.verify import oracle

# solo_references_once: the packed test's rows are the joining test's requests on the same
# model, so their mlx-lm solo runs are reused (tests/references.py).
pytestmark = [pytest.mark.realmodel, pytest.mark.usefixtures("solo_references_once")]


@pytest.fixture(scope="module")
def smollm2():
    return quantized_real_model()  # 4-bit, as converted (the CPU default would dequantize)


def test_the_converted_model_answers_the_capital_of_france_through_its_chat_template(smollm2):
    model, tokenizer = smollm2
    ids = chat_ids(tokenizer, "What is the capital of France?")
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") == 1
    sched = wb.Scheduler(model, tokenizer, max_batch=1)
    uid = sched.submit(wb.Request(prompt=ids, max_tokens=10))
    sched.run()
    text = tokenizer.decode(sched.tokens(uid))
    assert "Paris" in text, text


def test_chat_rows_joining_a_running_batch_equal_each_request_run_alone(smollm2):
    model, tokenizer = smollm2
    sched = wb.Scheduler(model, tokenizer, max_batch=2)
    questions = ["What is 2+2?", "Name a primary colour.", "Say hello."]
    first = sched.submit(wb.Request(prompt=chat_ids(tokenizer, questions[0]), max_tokens=6))
    sched.admit()
    sched.step()
    sched.step()  # the second and third join a batch already decoding (different prompt lengths)
    later = [sched.submit(wb.Request(prompt=chat_ids(tokenizer, q), max_tokens=6)) for q in questions[1:]]
    sched.run()
    assert all(len(sched.tokens(u)) >= 1 for u in [first, *later])
    check = oracle.solo_check(model, sched)
    assert len(check.rows) == 3
    assert check.ok, [row.describe() for row in check.rows if not row.match]
    assert check.n_match == 3  # token for token, not only within a near-tie


def test_dequantized_load_is_float32_and_gives_the_4bit_models_logits(smollm2):
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np

    model, tokenizer = smollm2
    dense, _ = wb.load(NAME, dequantize=True)
    assert isinstance(model.model.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    q_proj = dense.model.layers[0].self_attn.q_proj
    assert (
        type(q_proj) is nn.Linear and q_proj.weight.dtype == mx.float32 and q_proj.weight.shape == (576, 576)
    )
    ids = mx.array([chat_ids(tokenizer, "Hi")])
    quantized, dequantized = np.array(model(ids)[0, -1]), np.array(dense(ids)[0, -1])
    assert quantized.argmax() == dequantized.argmax()
    np.testing.assert_allclose(dequantized, quantized, atol=0.05 * np.abs(quantized).max())


def test_by_default_load_dequantizes_on_the_cpu_saying_so_in_one_line_and_keeps_4_bits_on_a_gpu(
    smollm2, capsys
):
    import mlx.core as mx
    import mlx.nn as nn

    capsys.readouterr()
    model, _ = wb.load(NAME)
    err = capsys.readouterr().err
    q_proj = model.model.layers[0].self_attn.q_proj
    if mx.default_device() == mx.cpu:
        assert type(q_proj) is nn.Linear and q_proj.weight.dtype == mx.float32
        assert err.count("\n") == 1 and "dequantized to float32" in err and "dequantize=False" in err
    else:
        assert isinstance(q_proj, nn.QuantizedLinear) and err == ""


def test_chat_rows_in_the_packed_layout_equal_each_request_run_alone(smollm2):
    model, tokenizer = smollm2
    sched = wb.Scheduler(
        model, tokenizer, layout="packed", max_batch=3, page_size=16, max_num_batched_tokens=24
    )
    questions = ["What is 2+2?", "Name a primary colour.", "Say hello."]
    first = sched.submit(wb.Request(prompt=chat_ids(tokenizer, questions[0]), max_tokens=6))
    sched.admit()
    sched.step()
    later = [sched.submit(wb.Request(prompt=chat_ids(tokenizer, q), max_tokens=6)) for q in questions[1:]]
    sched.run()
    kinds = {tuple(sorted({c.kind for c in s.packed.last_chunks})) for s in sched.history}
    assert ("decode", "prefill") in kinds, "a forward carried decode and prefill tokens together"
    check = oracle.solo_check(model, sched, [first, *later], atol=1e-4)
    assert check.ok, check.text()
