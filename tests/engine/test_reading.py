"""The Scheduler's smaller reading surface: ``snapshot(record=True)``, ``sched.history.checkpoint(i)``,
``workbench.verify.oracle.checkable_uids``; the old names stay as thin aliases giving the same."""

import pytest

import workbench as wb
from workbench.verify import oracle

pytestmark = pytest.mark.model


def test_snapshot_records_only_when_asked_and_record_is_its_alias(make_sched, prompt):
    sched = make_sched(max_batch=2, history_size=8)
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=3))
    before = len(sched.history)
    sched.snapshot()
    assert len(sched.history) == before  # pure
    recorded = sched.snapshot(record=True)  # the submit is an event since the last one there
    assert len(sched.history) == before + 1 and sched.history[-1] is recorded
    assert sched.record() is recorded and len(sched.history) == before + 1  # nothing happened since


def test_history_checkpoint_restores_the_engine_and_the_old_name_reads_the_same(make_sched, prompt):
    sched = make_sched(max_batch=2, history_size=8, history_checkpoints=8)
    uid = sched.submit(wb.Request(prompt=prompt(5), max_tokens=4))
    sched.admit(), sched.step(), sched.step()
    back = sched.history.checkpoint(-2)
    assert back is not None and sched.history_checkpoint(-2) is back
    tokens_then = sched.tokens(uid)[: len(back.state.requests[uid].tokens)]
    sched.run()
    sched.restore(back)
    assert sched.tokens(uid) == tokens_then
    with pytest.raises(IndexError):
        sched.history.checkpoint(len(sched.history))


def test_checkable_uids_are_the_finished_greedy_rows_and_the_old_name_agrees(make_sched, prompt):
    sched = make_sched(max_batch=3)
    greedy = sched.submit(wb.Request(prompt=prompt(4), max_tokens=2))
    sampled = sched.submit(wb.Request(prompt=prompt(4, 1), max_tokens=2, temperature=0.8, seed=1))
    running = sched.submit(wb.Request(prompt=prompt(4, 2), max_tokens=50))
    for _ in range(4):
        sched.admit(), sched.step(), sched.filter()
    assert oracle.checkable_uids(sched) == [greedy] == sched.finished_greedy_uids()
    assert sched.finish_reason(sampled) == "length" and sched.finish_reason(running) is None
