"""The packed layout with LoRA adapters: each packed token runs its request's adapter
(``workbench.engine.packed.adapters``), so rows of no adapter and of two adapters share one
``[1, T]`` forward, decode and prefill tokens together.

Held to: the same request alone in the same settings (bit-equal on the CPU), mlx-lm with the
adapter loaded (``mlx_lm.load(adapter_path=...)``, the adapter oracle), and the padded layout
with the same adapters. The model is a private copy: a scheduler with adapters wraps its
target layers in place.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

import workbench as wb
from workbench.engine.levers import lora
from workbench.engine.packed.adapters import check_bank, selected_tokens, token_slots
from workbench.observe.packed import Chunk
from workbench.runtime.device import on_gpu
from workbench.verify.adapter_oracle import adapter_check
from workbench.verify.compose import GPU_LOGPROB_ATOL

MODEL = str(wb.BUNDLED_MODEL)
ALONE_ATOL = GPU_LOGPROB_ATOL if on_gpu() else 0.0  # bit-equal on the CPU
ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = {"prose": str(ROOT / "data/adapters/prose"), "numbers": str(ROOT / "data/adapters/numbers")}
EARLY = [("The ", "prose"), ("def add(a, b):", None)]  # admitted first: they decode while LATE prefills
LATE = [("12 + 3 = 15\n7 * 8 = 56\n100 - 1 = 99\n9 + 9 =", "numbers"), ("import os\nimport sys\n", None)]


@pytest.fixture(scope="module")
def loaded():
    """``(model, tokenizer)`` loaded for this module: the schedulers wrap its layers in place."""
    return wb.load(MODEL)


def _run(sched, steps_before_late=3, max_tokens=10):
    """EARLY rows, a few steps, then LATE rows; returns uids and each forward's chunks with
    their rows' adapters."""
    uids = [sched.submit(wb.Request(prompt=p, max_tokens=max_tokens, adapter=a)) for p, a in EARLY]
    forwards = []
    adapter = dict(zip(uids, [a for _, a in EARLY]))
    while not sched.idle:
        if len(forwards) == steps_before_late:
            late = [sched.submit(wb.Request(prompt=p, max_tokens=max_tokens, adapter=a)) for p, a in LATE]
            adapter.update(zip(late, [a for _, a in LATE]))
            uids += late
        sched.admit(), sched.step(), sched.filter()
        packed = sched.snapshot().packed  # None in the padded layout
        forwards.append([(c.kind, adapter[c.uid]) for c in (packed.last_chunks if packed else ())])
    return uids, forwards


@pytest.mark.parametrize("options", [dict(), dict(pipeline=False, max_num_batched_tokens=8, page_size=4)])
def test_no_adapter_and_two_adapters_in_one_packed_forward_each_equal_alone_and_mlx_lm(loaded, options):
    model, tok = loaded
    settings = dict(layout="packed", max_batch=4, adapters=ADAPTERS, **options)
    sched = wb.Scheduler(model, tok, **settings)
    uids, forwards = _run(sched)
    mixed = [
        f for f in forwards if {k for k, _ in f} == {"decode", "prefill"} and len({a for _, a in f}) == 3
    ]
    assert mixed, forwards  # decode tokens of prose and no adapter beside numbers' prefill tokens
    assert sched.check().ok
    for uid, (p, a) in zip(uids, EARLY + LATE):
        alone = wb.Scheduler(model, tok, **settings)
        solo = alone.submit(wb.Request(prompt=p, max_tokens=10, adapter=a))
        alone.run()
        assert sched.tokens(uid) == alone.tokens(solo), a
        np.testing.assert_allclose(sched.logprobs(uid), alone.logprobs(solo), rtol=0, atol=ALONE_ATOL)
    report = adapter_check(MODEL, sched, uids)
    assert report.n_match == len(uids), report.text()


def test_packed_rows_equal_the_padded_layout_with_the_same_adapters(loaded):
    model, tok = loaded
    packed = wb.Scheduler(model, tok, layout="packed", max_batch=4, adapters=ADAPTERS)
    padded = wb.Scheduler(model, tok, max_batch=4, adapters=ADAPTERS)
    ours, _ = _run(packed)
    theirs, _ = _run(padded)
    for a, b in zip(ours, theirs):
        assert packed.tokens(a) == padded.tokens(b)
        np.testing.assert_allclose(packed.logprobs(a), padded.logprobs(b), atol=1e-4)
    # and the adapters matter: the numbers row differs from the same prompt on the base model
    base = wb.Scheduler(model, tok, layout="packed", max_batch=4, adapters=ADAPTERS)
    uid = base.submit(wb.Request(prompt=LATE[0][0], max_tokens=10))
    base.run()
    assert base.tokens(uid) != packed.tokens(ours[2])


def test_token_slots_give_each_token_its_requests_adapter(loaded):
    model, _ = loaded
    bank = lora.load_adapters(model, ADAPTERS)
    chunks = [Chunk(0, 4, 1, "decode"), Chunk(1, 7, 1, "decode"), Chunk(2, 0, 3, "prefill", samples=False)]
    names = {0: None, 1: "prose", 2: "numbers"}
    assert token_slots(bank, chunks, names).tolist() == [0, 1, 2, 2, 2]
    with selected_tokens(bank, chunks, names):
        sel = bank.selection
        assert sel.per_token and sel.rows.tolist() == [0, 1, 2, 2, 2]
        assert sel.scale.shape == (5, 1, 1) and sel.scale[0].item() == 0.0
    assert bank.selection.rows is None and not bank.selection.per_token
    with selected_tokens(bank, chunks, {0: None, 1: None, 2: None}):  # base model only: nothing set
        assert bank.selection.rows is None


def test_a_per_token_delta_is_each_tokens_own_adapters(loaded):
    """One [1, T, I] call with per-token slots equals each token run alone with its row's slot."""
    model, _ = loaded
    bank = lora.load_adapters(model, ADAPTERS)
    layer = next(m for _, m in model.named_modules() if isinstance(m, lora.RowLoRALinear))
    x = mx.random.normal((1, 3, layer.linear.weight.shape[1]), key=mx.random.key(0))
    chunks = [Chunk(i, 0, 1, "prefill") for i in range(3)]
    names = {0: "numbers", 1: None, 2: "prose"}
    with selected_tokens(bank, chunks, names):
        together = layer(x)
    for t in range(3):
        with lora.selected(bank, [names[t]]):
            alone = layer(x[:, t : t + 1])
        assert mx.allclose(together[:, t : t + 1], alone, atol=1e-6).item()


def test_adapter_settings_the_packed_layout_does_not_take_are_refused(loaded):
    model, tok = loaded
    with pytest.raises(ValueError, match="layout='packed' does not take adapters with prefix caching"):
        wb.Scheduler(model, tok, layout="packed", adapters=ADAPTERS, prompt_cache=8)
    head = SimpleNamespace(
        adapters={"head": SimpleNamespace(targets=("lm_head", "model.layers.0.mlp.up_proj"))}
    )
    with pytest.raises(ValueError, match="does not take adapters targeting 'lm_head'"):
        check_bank(head)
