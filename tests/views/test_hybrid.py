"""The hybrid step view: a joining prompt's chunk prefills while running rows decode. The text
and the drawn masks are checked against the masks the model's layers received in that step."""

import numpy as np
import pytest

import workbench as wb
from workbench.verify.mask_oracle import recorded_masks
from workbench.views.hybrid import hybrid_step, hybrid_text, render_hybrid


@pytest.fixture
def joining(bundled, prompt):
    """Two rows decoding (prompts of 4 and 3), then a 13-token prompt arrives (chunks of 5)."""
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=4, prefill_step_size=5)
    for n, start in ((4, 0), (3, 40)):
        sched.submit(wb.Request(prompt=prompt(n, start), max_tokens=12))
    sched.admit(), sched.step(), sched.filter()
    sched.submit(wb.Request(prompt=prompt(13, 300), max_tokens=3))
    return model, sched


def engine_step(model, sched):
    """``admit(); snapshot(); step()`` with every mask the layers got: (snapshot, prefill, decode)."""
    with recorded_masks(model, prefill=True) as prefill, recorded_masks(model) as decode:
        sched.admit()
        snap = sched.snapshot()
        sched.step()
    sched.filter()
    return snap, prefill, decode


def test_a_chunk_and_the_decode_are_two_forwards_with_the_masks_the_layers_got(joining):
    model, sched = joining
    snap, prefill, decode = engine_step(model, sched)
    h = hybrid_step(sched.events, snap)
    assert hybrid_text(h).splitlines() == [
        "step 1: 2 separate forwards, one after the other",
        "  forward 1  prefill [1, 5]  uid 2: positions 0-4 of 13 prompt tokens",
        "  forward 2  decode  [2, 1]  uids 0,1: one token each over 6 keys (KV width 5 + the fed token)",
    ]
    assert h.forwards == 2 and h.decoded == (0, 1) and h.joined == ()
    assert {m.mask.shape for m in prefill} == {h.prefill[0].shape}  # every layer: one [1, 5, 5] forward
    assert all(np.array_equal(m.mask, h.prefill[0].mask) for m in prefill)
    assert len(decode) and all(
        np.array_equal(m.mask, h.decode.mask[:, 0]) for m in decode
    )  # uid 1's pad masked
    assert render_hybrid(h).axes[0].get_title(loc="left").startswith("forward 1 [1, 5]: prefill uid 2")


def test_the_last_chunk_joins_and_its_row_decodes_in_the_same_step(joining):
    model, sched = joining
    for _ in range(2):
        snap, prefill, decode = engine_step(model, sched)
    middle = hybrid_text(hybrid_step(sched.events, snap)).splitlines()
    assert middle[1] == "  forward 1  prefill [1, 5]  uid 2: positions 5-9 of 13 prompt tokens"
    snap, prefill, decode = engine_step(model, sched)
    h = hybrid_step(sched.events, snap)
    text = hybrid_text(h).splitlines()
    assert text[0] == "step 3: 3 separate forwards, one after the other"
    assert text[1] == "  forward 1  prefill [1, 2]  uid 2: positions 10-11 of 13 prompt tokens"
    assert text[2] == "  forward 2  join    [1, 1]  uids 2: each one's last prompt token"
    assert text[3].startswith("  forward 3  decode  [3, 1]  uids 0,1,2")
    assert h.decoded == (0, 1, 2) and h.joined == (2,)
    rows = [m.mask for m in decode if m.mask.shape[0] == 3]  # the decode's; the join forward's are [1, S]
    assert rows and all(np.array_equal(m, h.decode.mask[:, 0]) for m in rows)
    assert len(decode) == 2 * len(rows)  # as many join-forward masks: two single-token forwards


def test_a_snapshot_of_another_step_is_refused_naming_the_rows(joining):
    model, sched = joining
    before = sched.snapshot()  # step 1, before the joiner: rows 0, 1
    for _ in range(3):
        engine_step(model, sched)
    late = sched.snapshot()
    sched.admit(), sched.step()
    with pytest.raises(ValueError, match=r"no token events"):
        hybrid_step(sched.events[:-3], late)
    assert hybrid_step(sched.events, before).decoded == (0, 1)
