"""Scheduling mechanics: chunked prefill interleaved with decode, prompt concurrency,
pipelined decode, admission policies. Scheduling is not math: tokens never change."""

import pytest

import workbench as wb
from workbench.verify import oracle
from workbench.engine.policies import FCFS, Priority, Queued, ShortestPromptFirst, policy_from

pytestmark = pytest.mark.model


def run_tokens(make_sched, prompt, specs, **kwargs):
    sched = make_sched(**kwargs)
    uids = [sched.submit(wb.Request(prompt=prompt(n, 13 * i), max_tokens=m)) for i, (n, m) in enumerate(specs)]
    report = sched.run()
    return [sched.tokens(u) for u in uids], [sched.logprobs(u) for u in uids], report, sched


SPECS = ((3, 12), (60, 9), (17, 14), (1, 5), (33, 10))


def test_pipelined_and_unpipelined_decode_give_identical_tokens_and_logprobs(make_sched, prompt):
    a = run_tokens(make_sched, prompt, SPECS, max_batch=3, pipeline=True)
    b = run_tokens(make_sched, prompt, SPECS, max_batch=3, pipeline=False)
    assert a[0] == b[0] and a[1] == b[1]
    kinds = lambda r: list(zip(r.events.kind, r.events.uid, r.events.step))
    assert kinds(a[2]) == kinds(b[2])


def test_interleaved_chunked_prefill_gives_the_same_tokens_as_whole_prefill(make_sched, prompt):
    whole = run_tokens(make_sched, prompt, SPECS, max_batch=3, interleave_prefill=False, prefill_step_size=8)
    inter = run_tokens(make_sched, prompt, SPECS, max_batch=3, interleave_prefill=True, prefill_step_size=8)
    assert whole[0] == inter[0]
    assert oracle.solo_check(inter[3].model, inter[3]).ok


def test_running_rows_stall_at_most_one_chunk_while_a_long_prompt_joins(make_sched, prompt):
    sched = make_sched(max_batch=3, prefill_step_size=16)
    runners = [sched.submit(wb.Request(prompt=prompt(n, n), max_tokens=30)) for n in (4, 9)]
    sched.admit()
    sched.step()
    long_uid = sched.submit(wb.Request(prompt=prompt(200, 50), max_tokens=4))
    report = sched.run()
    ev = report.events
    chunks = ev[(ev.kind == "prefill") & (ev.uid == long_uid)]
    assert len(chunks) == 13  # 199 prompt tokens before the last one, 16 per chunk
    # between two consecutive tokens of a running row, at most one prefill chunk ran
    for uid in runners:
        token_idx = ev.index[(ev.kind == "token") & (ev.uid == uid)].tolist()
        for a, b in zip(token_idx, token_idx[1:]):
            assert (ev.loc[a:b].kind == "prefill").sum() <= 1
    join_step = int(ev[(ev.kind == "join") & (ev.uid == long_uid)].step.iloc[0])
    assert join_step >= 13, "the long prompt joined only after all its chunks"
    assert oracle.solo_check(sched.model, sched).ok


def test_prompt_concurrency_caps_the_prefilling_group(make_sched, prompt):
    sched = make_sched(max_batch=4, prompt_concurrency=2)
    for n in (5, 6, 7, 8):
        sched.submit(wb.Request(prompt=prompt(n), max_tokens=3))
    first = sched.admit()  # group [0, 1] prefills in one chunk and joins; group [2, 3] forms
    assert [e.uid for e in first if e.kind == "join"] == [0, 1]
    assert [e.uid for e in first if e.kind == "admit"] == [0, 1, 2, 3]
    assert [e.uid for e in sched.admit() if e.kind == "join"] == [2, 3]
    sched2 = make_sched(max_batch=4, prompt_concurrency=2, prefill_step_size=2)
    for n in (5, 6, 7, 8):
        sched2.submit(wb.Request(prompt=prompt(n), max_tokens=3))
    sched2.admit()
    snap = sched2.snapshot()
    assert [uid for uid, _, _ in snap.prefilling] == [0, 1] and snap.queue == (2, 3)


def test_a_prefilling_group_is_visible_in_snapshots(make_sched, prompt):
    sched = make_sched(max_batch=2, prefill_step_size=10)
    sched.submit(wb.Request(prompt=prompt(35), max_tokens=3))
    sched.admit()
    snap = sched.snapshot()
    assert snap.prefilling == ((0, 10, 34),) and snap.batch_size == 0
    assert "prefilling uid 0: 10/34 prompt tokens" in snap.text()
    assert not sched.idle


def test_shortest_prompt_first_admits_short_prompts_first(make_sched, prompt):
    sched = make_sched(max_batch=1, policy="shortest-prompt-first")
    uids = [sched.submit(wb.Request(prompt=prompt(n), max_tokens=2)) for n in (30, 4, 12)]
    report = sched.run()
    joins = report.events[report.events.kind == "join"].uid.tolist()
    assert joins == [uids[1], uids[2], uids[0]]


def test_priority_policy_admits_the_most_urgent_first(make_sched, prompt):
    sched = make_sched(max_batch=1, policy="priority")
    low = sched.submit(wb.Request(prompt=prompt(3), max_tokens=2, priority=0))
    high = sched.submit(wb.Request(prompt=prompt(3), max_tokens=2, priority=5))
    report = sched.run()
    assert report.events[report.events.kind == "join"].uid.tolist() == [high, low]


def test_policies_order_pure():
    q = [Queued(7, 30, 0, 0), Queued(8, 4, 1, 1), Queued(9, 4, 3, 2)]
    assert FCFS().order(q) == [7, 8, 9]
    assert ShortestPromptFirst().order(q) == [8, 9, 7]
    assert Priority().order(q) == [9, 8, 7]
    with pytest.raises(ValueError, match="policy must be one of"):
        policy_from("lifo")


@pytest.mark.parametrize("kwargs,field", [({"prompt_concurrency": 0}, "prompt_concurrency"),
                                          ({"clear_cache_every": 0}, "clear_cache_every"),
                                          ({"history_size": -1}, "history_size")])
def test_scheduling_limits_are_validated(make_sched, kwargs, field):
    with pytest.raises(ValueError, match=field):
        make_sched(**kwargs)
