"""SmolLM2-135M-Instruct with a quantized KV cache (``Scheduler(kv_bits=...)``): every
batched row equals the same request run alone through mlx-lm's ``generate_step`` with the
same ``kv_bits`` and ``kv_group_size`` (``quantized_kv_start=0``)."""

from __future__ import annotations

import pytest

import workbench as wb
from tests.real_model import chat_ids, quantized_real_model
from workbench.verify import oracle

pytestmark = [
    pytest.mark.realmodel,
    pytest.mark.quantized_kv,
]  # quantized_kv: skipped where the device lacks the kernels


@pytest.fixture(scope="module")
def smollm2():
    return quantized_real_model()  # 4-bit weights, as converted


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_chat_rows_joining_a_running_batch_equal_each_request_run_alone(smollm2, bits):
    model, tokenizer = smollm2
    sched = wb.Scheduler(model, tokenizer, max_batch=2, kv_bits=bits, kv_group_size=64, prefill_step_size=16)
    questions = ["What is 2+2?", "Name a primary colour.", "Say hello."]
    sched.submit(wb.Request(prompt=chat_ids(tokenizer, questions[0]), max_tokens=6))
    sched.admit()
    sched.step()
    sched.step()  # the others join a batch already decoding (different prompt lengths, chunked prefill)
    for q in questions[1:]:
        sched.submit(wb.Request(prompt=chat_ids(tokenizer, q), max_tokens=6))
    sched.run()
    assert sched.check().ok
    check = oracle.solo_check(model, sched)
    assert len(check.rows) == 3
    assert check.n_match == 3, check.text()
