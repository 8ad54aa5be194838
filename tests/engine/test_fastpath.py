"""Decode fast paths (workbench/engine/fastpath.py): attention without a mask where no row
is padded, compiled MLPs. Each is checked against what it replaces: the caches' own
``left_padding`` (read from the arrays) and the tokens / log-probs of the plain path."""

import numpy as np
import pytest

import workbench as wb
from workbench.engine import fastpath
from workbench.verify.mask_oracle import recorded_masks


def _run(model, tokenizer, prompts, **kwargs):
    sched = wb.Scheduler(model, tokenizer, max_batch=4, **kwargs)
    for p in prompts:
        sched.submit(wb.Request(prompt=p, max_tokens=6))
    sched.run()
    return {uid: (r.tokens, r.logprobs) for uid, r in sched.requests.items()}


def test_unpadded_agrees_with_the_caches_left_padding_at_every_step(bundled, prompt, monkeypatch):
    """Each decode launch decides "no mask" from Python fields alone; the caches' own
    ``left_padding`` array must then be all zeros, and it must decide so where it is."""
    model, tokenizer = bundled
    seen = []
    real = fastpath.unpadded

    def checked(caches, held):
        answer = real(caches, held)
        pads = np.array(caches[0].left_padding).tolist()
        seen.append((answer, pads))
        return answer

    monkeypatch.setattr(fastpath, "unpadded", checked)
    sched = wb.Scheduler(model, tokenizer, max_batch=3, prefill_step_size=8)
    for n in (5, 5, 9, 3):  # two equal lengths: an unpadded batch first, then padded joiners
        sched.submit(wb.Request(prompt=prompt(n), max_tokens=4 if n == 9 else 8))
    sched.run()
    assert seen, "no decode step ran"
    for answer, pads in seen:
        assert answer == (max(pads) == 0), (answer, pads)
    assert any(a for a, _ in seen) and not all(a for a, _ in seen), "both cases should occur"


def test_no_mask_is_what_the_model_sees_and_tokens_are_bit_equal(bundled, prompt):
    """At B = 1 the model gets no mask at all (``None``), and tokens and log-probs equal the
    run through mlx-lm's own mask bit for bit."""
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=1)
    sched.submit(wb.Request(prompt=prompt(7), max_tokens=5))
    sched.admit()
    with recorded_masks(model) as seen:
        sched.step()
    assert seen and all(s.mask is None for s in seen)

    fast = _run(model, tokenizer, [prompt(7)])
    plain = _run(model, tokenizer, [prompt(7)], fast_decode=False)
    assert fast == plain


def test_padded_rows_keep_their_mask(bundled, prompt):
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=2)
    sched.submit(wb.Request(prompt=prompt(4), max_tokens=3))
    sched.submit(wb.Request(prompt=prompt(9), max_tokens=3))
    sched.admit()
    with recorded_masks(model) as seen:
        sched.step()
    assert seen and all(s.mask is not None and not s.mask.all() for s in seen)


def test_the_mask_patch_is_undone_even_when_the_forward_raises(bundled, prompt):
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=1)
    sched.submit(wb.Request(prompt=prompt(6), max_tokens=4))
    sched.admit()
    caches = sched.state.batch.caches
    with pytest.raises(RuntimeError):
        with fastpath.without_mask(caches):
            assert caches[0].make_mask(1) is None
            raise RuntimeError("boom")
    assert caches[0].make_mask(1) is not None
    assert "make_mask" not in caches[0].__dict__


def test_compiled_mlps_give_equal_tokens_and_are_restored(random_llama):
    model, tokenizer = random_llama
    assert fastpath.compilable(model)
    plain_mlps = [layer.mlp for layer in model.layers]
    ids = [[(7 * i + n) % 1000 for i in range(n)] for n in (3, 8, 12)]
    compiled = _run(model, tokenizer, ids, fast_decode=True)
    plain = _run(model, tokenizer, ids, fast_decode=False)
    assert [layer.mlp for layer in model.layers] == plain_mlps
    for uid in plain:
        assert compiled[uid][0] == plain[uid][0]
        np.testing.assert_allclose(compiled[uid][1], plain[uid][1], rtol=0, atol=1e-5)


def test_compiled_mlps_are_opt_in_and_never_with_adapters():
    assert fastpath.FastDecode.of(None) == fastpath.FastDecode(True, False)
    assert fastpath.FastDecode.of(True) == fastpath.FastDecode(True, True)
    assert fastpath.FastDecode.of(False) == fastpath.FastDecode(False, False)
    assert fastpath.FastDecode.of(True, adapters=object()) == fastpath.FastDecode(True, False)


@pytest.mark.parametrize("bad", ["yes", 1, 0.0])
def test_fast_decode_takes_none_true_or_false_only(bad):
    with pytest.raises(ValueError, match=r"fast_decode must be None, True or False, got"):
        fastpath.FastDecode.of(bad)
