"""The README's "Done when" on the real chat model: SmolLM2-135M-Instruct served, the openai
client's streamed chat answer equal to ``Request(messages=...)`` run alone (its chat template)."""

from __future__ import annotations

import openai
import pytest

import workbench as wb
from tests.real_model import dense_real_model

pytestmark = pytest.mark.realmodel


def test_a_streamed_chat_answer_is_the_chat_templates_request_alone():
    model, tokenizer = dense_real_model()
    assert tokenizer.has_chat_template
    messages = [{"role": "user", "content": "What is a batch?"}]
    with wb.serve(wb.Scheduler(model, tokenizer, max_batch=4), port=0, model_id="smollm2-135m") as server:
        alone = wb.Scheduler(model, tokenizer)  # run while served: MLX's compile is off for both
        uid = alone.submit(wb.Request(messages=messages, max_tokens=12))
        alone.run()
        client = openai.OpenAI(base_url=server.url, api_key="-", max_retries=0, timeout=120)
        stream = client.chat.completions.create(
            model="smollm2-135m", messages=messages, max_tokens=12, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == alone.text(uid) and text
