"""Checked steps: the mask oracle run around the scheduler's own ``step()``."""

import pytest

import workbench as wb
from workbench.verify.mask_oracle import StepCheck, checked_step, run_checked

pytestmark = pytest.mark.model


def test_a_checked_step_records_one_mask_per_layer_and_advances_the_scheduler(make_sched, prompt):
    sched = make_sched(max_batch=3)
    for n, start in ((6, 0), (2, 40), (4, 80)):
        sched.submit(wb.Request(prompt=prompt(n, start), max_tokens=5))
    sched.admit()
    check = checked_step(sched)
    assert check.ok and check.problems == []
    assert check.n_masks == sum(len(g.layers) for g in check.snapshot.groups)
    assert check.snapshot.step == 0 and list(check.snapshot.uids) == [0, 1, 2]
    assert sched.step_index == 1 and all(len(sched.tokens(u)) == 1 for u in (0, 1, 2))


def test_a_checked_run_checks_every_decode_step_and_generates_what_run_does(make_sched, prompt):
    specs = ((6, 0, 3), (2, 40, 7), (12, 200, 2))
    checked, plain = make_sched(max_batch=2), make_sched(max_batch=2)
    for sched in (checked, plain):
        for n, start, max_tokens in specs:
            sched.submit(wb.Request(prompt=prompt(n, start), max_tokens=max_tokens))
    checks = run_checked(checked)
    plain.run()
    assert checked.idle and all(c.ok for c in checks)
    assert [c.snapshot.step for c in checks] == list(range(checked.step_index))
    assert [checked.tokens(u) for u in range(3)] == [plain.tokens(u) for u in range(3)]
    assert run_checked(checked) == []  # idle: nothing to step


def test_a_step_check_with_a_disagreement_is_not_ok():
    assert not StepCheck(
        snapshot=None, n_masks=2, problems=["call 1 [full]: model saw [[1]], snapshot has [[0]]"]
    ).ok
    assert StepCheck(snapshot=None, n_masks=2, problems=[]).ok
