"""Context limits come from whichever config field an mlx-lm model uses (issue 14, item 5)."""

import mlx.core as mx
import pytest
from mlx_lm.models import gpt2

import workbench as wb
from workbench.engine.budget import context_limit


def test_a_gpt2_prompt_past_n_positions_is_refused_at_submit_naming_the_field(bundled):
    _, tokenizer = bundled
    args = gpt2.ModelArgs(model_type="gpt2", n_ctx=32, n_embd=32, n_head=2, n_layer=2, n_positions=32,
                          layer_norm_epsilon=1e-5, vocab_size=len(tokenizer.get_vocab()))
    model = gpt2.Model(args)
    mx.eval(model.parameters())
    sched = wb.Scheduler(model, tokenizer)
    assert context_limit(model) == (32, "n_positions")
    with pytest.raises(ValueError, match=r"= 42 exceeds the model's context of 32 tokens \(n_positions\)"):
        sched.submit(wb.Request(prompt=list(range(1, 41)), max_tokens=2))
    assert sched.queue == ()
    uid = sched.submit(wb.Request(prompt=list(range(1, 11)), max_tokens=22))  # 32: exactly the limit
    sched.run()
    assert len(sched.tokens(uid)) == 22 and sched.check().ok


def test_a_model_without_a_context_field_has_no_limit():
    class Bare:
        args = object()

    assert context_limit(Bare()) == (None, "")
