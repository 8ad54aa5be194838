"""Context limits come from whichever config field an mlx-lm model uses (issue 14, item 5)."""

import pytest

import workbench as wb
from workbench.engine.request import context_limit
from workbench.verify.families import build, config_for


def _tiny(name: str, tokenizer, **fields):
    """mlx-lm's architecture ``name`` as a random 2-layer model over ``tokenizer``'s vocabulary
    (:func:`workbench.verify.families.build` from its base config and ``fields``)."""
    return build(name, dict(config_for(name), vocab_size=len(tokenizer.get_vocab()), **fields))


def test_a_gpt2_prompt_past_n_positions_is_refused_at_submit_naming_the_field(bundled):
    _, tokenizer = bundled
    model = _tiny("gpt2", tokenizer, n_positions=32, n_ctx=32)
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


def test_a_model_that_cannot_batch_is_found_when_the_scheduler_is_built_and_served_one_row_at_a_time(bundled):
    _, tokenizer = bundled
    model = _tiny("gpt_bigcode", tokenizer)  # mlx-lm's gpt_bigcode takes int(cache.offset): fails on two rows
    sched = wb.Scheduler(model, tokenizer, max_batch=4)
    assert sched.config.max_batch == 1 and "Only length-1 arrays can be converted" in sched.serial_reason
    uids = [
        sched.submit(wb.Request(prompt=list(range(1 + i, 4 + 2 * i)), max_tokens=3, stop_ids=[]))
        for i in range(3)
    ]
    sched.run()  # never fails mid-step: the queue drains one row at a time
    assert all(len(sched.tokens(u)) == 3 for u in uids) and sched.check().ok
    assert "serial lane (one row at a time)" in sched.snapshot().text()
    for u in uids:  # each equals the same request alone
        alone = wb.Scheduler(model, tokenizer, max_batch=1)
        alone.submit(wb.Request(prompt=list(sched.request_of(u).prompt_ids), max_tokens=3, stop_ids=[]))
        alone.run()
        assert alone.tokens(0) == sched.tokens(u)


def test_every_bundled_family_passes_the_batch_probe(bundled):
    from workbench.engine.probe import probe
    from workbench.runtime.loading import DATA_DIR

    for name, max_kv_size in [
        ("tiny-llama", None),
        ("tiny-gemma3", None),
        ("tiny-qwen3-next", None),
        ("tiny-mamba2", None),
        ("tiny-qwen3", 8),
    ]:
        model, _ = wb.load(DATA_DIR / "models" / name)
        assert probe(model, max_kv_size) == "", name


def test_the_batching_probe_uses_ordinary_tokens_and_a_reduced_precision_tolerance():
    """On an H200 in bf16 the probe's former prompts (ids 1..8: a real vocabulary's special
    tokens) swung SmolLM2's likely log-probs by 5.8 nats batched vs alone and sent it to the
    serial lane, while ordinary ids differed by 0.4 (docs/gpu.md)."""
    import mlx.core as mx
    from mlx.utils import tree_map

    from workbench.engine import probe as P

    model, _ = wb.load()  # its own copy: a shared fixture's model may carry another test's LoRA wrappers
    prompts = P._prompts(model)
    assert [len(p) for p in prompts] == list(P.PROMPT_LENGTHS)
    assert min(min(p) for p in prompts) >= model.args.vocab_size // 4  # clear of the special tokens
    assert P._tolerance(model) == P.TOLERANCE  # float32 weights: the strict tolerance
    half = type(model)(model.args)
    half.update(tree_map(lambda a: a.astype(mx.bfloat16), model.parameters()))
    assert P._tolerance(half) == P.LOW_PRECISION_TOLERANCE
    assert P.probe(half) == ""
