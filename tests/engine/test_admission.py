"""Admission: the order policies (FCFS, shortest prompt first, priority), the KV-byte
budget (projected from the real layer shapes) and preemption. Admission changes who runs
when, never the tokens."""

import pytest

import workbench as wb
from workbench.verify import oracle
from workbench.engine.budget import kv_profile, projected_bytes
from workbench.engine.policies import FCFS, Priority, Queued, ShortestPromptFirst, policy_from

pytestmark = pytest.mark.model


def test_each_policy_orders_a_hand_built_queue_and_an_unknown_name_is_refused():
    q = [Queued(7, 30, 0, 0), Queued(8, 4, 1, 1), Queued(9, 4, 3, 2)]
    assert FCFS().order(q) == [7, 8, 9]
    assert ShortestPromptFirst().order(q) == [8, 9, 7]
    assert Priority().order(q) == [9, 8, 7]
    with pytest.raises(ValueError, match="policy must be one of"):
        policy_from("lifo")


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


def test_projected_bytes_come_from_the_real_layer_shapes(bundled):
    model, _ = bundled
    args = model.args
    per_token = args.num_hidden_layers * 2 * args.num_key_value_heads * (args.head_dim or args.hidden_size // args.num_attention_heads) * 4
    assert projected_bytes(kv_profile(model), 128) == 128 * per_token


def test_windowed_and_ssm_layers_project_bounded_bytes():
    from workbench.runtime.loading import DATA_DIR

    gemma, _ = wb.load(DATA_DIR / "models" / "tiny-gemma3")
    prof = kv_profile(gemma)
    windowed = [lb for lb in prof if lb.window_tokens == 8]
    assert len(windowed) == 2
    assert projected_bytes(prof, 1000) - projected_bytes(prof, 999) == sum(lb.per_token_bytes for lb in prof if lb.window_tokens is None)
    mamba, _ = wb.load(DATA_DIR / "models" / "tiny-mamba2")
    assert projected_bytes(kv_profile(mamba), 10) == projected_bytes(kv_profile(mamba), 1000) > 0


def test_requests_wait_while_the_budget_is_full_and_outputs_are_unchanged(bundled, make_sched, prompt):
    model, _ = bundled
    one = projected_bytes(kv_profile(model), 20 + 12)
    sched = make_sched(max_batch=4, kv_budget_bytes=2 * one)
    for i in range(4):
        sched.submit(wb.Request(prompt=prompt(20, 10 * i), max_tokens=12))
    sched.admit()
    snap = sched.snapshot()
    assert snap.uids == (0, 1) and snap.queue == (2, 3)
    assert snap.kv_projected_bytes == 2 * one and snap.kv_budget_bytes == 2 * one
    assert "KV budget:" in snap.text()
    report = sched.run()
    assert max(s.kv_projected_bytes for s in sched.history) <= 2 * one
    assert (report.requests.generated_tokens == 12).all()
    assert oracle.solo_check(model, sched).ok and sched.snapshot().kv_bytes == 0


def test_a_request_that_can_never_fit_is_rejected_at_submit(make_sched, prompt):
    sched = make_sched(kv_budget_bytes=10_000)
    with pytest.raises(ValueError, match=r"projects [\d,]+ KV bytes \(prompt 30 \+ max_tokens 8 tokens\) but kv_budget_bytes is 10,000"):
        sched.submit(wb.Request(prompt=prompt(30), max_tokens=8))
    assert sched.idle and sched.events == []


def test_a_preempted_row_resumes_and_its_greedy_output_equals_an_uninterrupted_run(bundled, make_sched, prompt):
    model, _ = bundled
    sched = make_sched(max_batch=3)
    low = sched.submit(wb.Request(prompt=prompt(9, 3), max_tokens=20))
    other = sched.submit(wb.Request(prompt=prompt(4, 50), max_tokens=20))
    sched.admit()
    for _ in range(7):
        sched.step()
    events = sched.preempt(low)
    assert [(e.kind, e.uid, e.n_tokens) for e in events] == [("preempt", low, 7)]
    assert sched.snapshot().uids == (other,) and sched.snapshot().queue == (low,)
    assert len(sched.tokens(low)) == 7
    sched.step()
    sched.run()
    assert len(sched.tokens(low)) == 20
    check = oracle.solo_check(model, sched)
    assert check.ok, check.text()
    with pytest.raises(ValueError, match="not a running, unfinished row"):
        sched.preempt(low)


def test_under_kv_pressure_a_higher_priority_request_preempts_the_lowest(bundled, make_sched, prompt):
    model, _ = bundled
    one = projected_bytes(kv_profile(model), 10 + 16)
    sched = make_sched(max_batch=4, kv_budget_bytes=2 * one, policy="priority")
    lows = [sched.submit(wb.Request(prompt=prompt(10, 7 * i), max_tokens=16, priority=p)) for i, p in enumerate((0, 1))]
    sched.admit()
    for _ in range(4):
        sched.step()
    urgent = sched.submit(wb.Request(prompt=prompt(10, 99), max_tokens=16, priority=5))
    sched.admit()
    snap = sched.snapshot()
    assert urgent in snap.uids and lows[0] not in snap.uids and lows[1] in snap.uids
    assert snap.queue == (lows[0],)
    report = sched.run()
    assert (report.events.kind == "preempt").sum() == 1
    check = oracle.solo_check(model, sched)
    assert check.ok and len(check.rows) == 3, check.text()
