"""The verify-forward view: its mask is the one the model's layers receive in a real
speculative step; its roles (t0, accepted, rejected, bonus) are the engine's tokens."""

import numpy as np
import pytest
from matplotlib.figure import Figure

import workbench as wb
from workbench.verify.mask_oracle import recorded_masks
from workbench.views.verify import (
    ACCEPTED,
    PAD,
    REJECTED,
    T0,
    render_verify,
    snapshot_before,
    verify_cells,
    verify_forward,
    verify_text,
)

PROMPTS = ("x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,", "def add(a, b):\n    return a + b\ndef add(", "hello")


def speculating(model, tok):
    sched = wb.Scheduler(model, tok, max_batch=4, speculative="prompt-lookup", num_draft_tokens=3)
    for p in PROMPTS:
        sched.submit(wb.Request(prompt=tok.encode(p), max_tokens=10, stop_ids=[]))
    return sched


def test_mask_is_what_the_layers_receive_and_roles_are_the_engines(bundled):
    model, tok = bundled
    sched = speculating(model, tok)
    sched.admit()  # prefill and join: every row has its pending token
    checked = 0
    for _ in range(6):
        snap = sched.snapshot()
        with recorded_masks(model, prefill=True) as seen:
            sched.step()
        sched.filter()
        if not any(e.kind == "draft" and e.step == snap.step for e in sched.events):
            continue
        vf = verify_forward(snap, sched.events)
        assert seen, "a verify forward feeds 1 + K > 1 tokens per row"
        for s in seen:
            assert np.array_equal(s.mask, vf.mask()), (snap.step, s.mask.shape, vf.mask().shape)
        # every row's emitted tokens this step: t0 then its accepted drafts
        for b, u in enumerate(vf.uids):
            emitted = [
                e.token for e in sched.events if e.kind == "token" and e.uid == u and e.step == snap.step
            ]
            assert emitted[: 1 + vf.accepted[b]] == [vf.t0[b], *vf.accepted_tokens[b]]
        checked += 1
    assert checked >= 2
    sched.run()
    drafted_steps = sorted({e.step for e in sched.events if e.kind == "draft"})
    snap = snapshot_before(sched.history, drafted_steps[0])
    vf = verify_forward(snap, sched.events)
    for b, u in enumerate(vf.uids):  # the bonus is the row's first token of the next step
        nxt = [e.token for e in sched.events if e.kind == "token" and e.uid == u and e.step == snap.step + 1]
        assert vf.bonus[b] == (nxt[0] if nxt else None)


def hand_built():
    from tests.views.test_views import full_snapshot
    from workbench.observe.events import Event

    snap = full_snapshot(uids=(7, 9), left_padding=(0, 2), width=3, step=3)  # 3 cached key slots
    log = [
        Event("token", 7, 3, 0.0, token=50),
        Event("token", 9, 3, 0.0, token=60),
        Event("draft", 7, 3, 0.0, row=0, n_tokens=3, n_accepted=1),
        Event("token", 7, 3, 0.0, token=51),
        Event("token", 7, 4, 0.0, token=52),
        Event("token", 9, 4, 0.0, token=61),
    ]
    return verify_forward(snap, log)


def test_cells_and_text_on_a_hand_built_step():
    vf = hand_built()
    assert vf.K == 3 and vf.drafted == (3, 0) and vf.accepted == (1, 0)
    assert vf.t0 == (50, 60) and vf.accepted_tokens == ((51,), ()) and vf.bonus == (52, 61)
    cells = verify_cells(vf)
    assert cells.shape == (2, 4, 7)
    assert [cells[0, j, 3 + j] for j in range(4)] == [T0, ACCEPTED, REJECTED, REJECTED]
    assert (cells[1, 1:] == PAD).all() and (cells[1, :, :2] == PAD).all()  # pad queries, left padding
    assert verify_text(vf, context=1) == "\n".join(
        [
            "verify forward of step 3: 2 rows, K = 3 drafts, keys 0-6 (3 cached, the last 1 shown)",
            "uid 7: fed t0=50 d1=51+ d2- d3-, accepted 1 of 3, bonus 52",
            "  q 3 t0 | c @ . . . | chose 51: d1 accepted",
            "  q 4 d1 | c # @ . . | chose 52: the bonus token, not d2: rejected",
            "  q 5 d2 | c # # @ . | dropped (after a rejection)",
            "  q 6 d3 | c # # # @ | dropped (after a rejection)",
            "uid 9: fed t0=60, accepted 0 of 0, bonus 61",
            "  q 3 t0  | c @ p p p | chose 61: the bonus token",
            "  q 4 pad | p p p p p | (padding)",
            "  q 5 pad | p p p p p | (padding)",
            "  q 6 pad | p p p p p | (padding)",
        ]
    )
    assert isinstance(render_verify(vf), Figure)
    one = vf.only([9])
    assert (
        one.K == 3
        and one.uids == (9,)
        and one.t0 == (60,)
        and (verify_cells(one) == verify_cells(vf)[1:]).all()
    )
    with pytest.raises(ValueError, match=r"uids \[8\] are not rows"):
        vf.only([8])


def test_a_step_without_drafts_is_refused_naming_the_steps_that_drafted():
    from tests.views.test_views import full_snapshot
    from workbench.observe.events import Event

    with pytest.raises(ValueError, match=r"no row drafted at step 3; steps with drafts: \[5\]"):
        verify_forward(full_snapshot(), [Event("draft", 7, 5, 0.0, n_tokens=1, n_accepted=1)])


def test_a_snapshot_of_another_batch_is_refused():
    from tests.views.test_views import full_snapshot
    from workbench.observe.events import Event

    log = [Event("token", 9, 3, 0.0, token=1), Event("draft", 9, 3, 0.0, row=0, n_tokens=1, n_accepted=1)]
    with pytest.raises(ValueError, match="is not the batch of step 3's verify forward"):
        verify_forward(
            full_snapshot(uids=(7, 9)), log
        )  # uid 9 drafted at row 0, the snapshot has it at row 1
    with pytest.raises(ValueError, match=r"no snapshot of step 4 in the history \(steps \[3\]\)"):
        snapshot_before([full_snapshot()], 4)
