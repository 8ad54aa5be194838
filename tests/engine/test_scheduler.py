"""The scheduler's public calls (``submit``, ``admit``, ``step``, ``filter``, ``run``,
``snapshot``, ``tokens``) against the oracles: each row equals the same request run alone
through mlx-lm (solo), equals mlx-lm's BatchGenerator (batch), and the snapshot mask
equals what the attention layers receive. Every scenario has at least two rows, except
the explicit single-row one. Also: pipelined decode, options and errors of the calls.
Prefill is in ``test_prefill.py``; admission, budget and preemption in
``test_admission.py``."""

import mlx.core as mx
import numpy as np
import pytest

import workbench as wb
from workbench.observe.masks import decode_mask
from workbench.verify import oracle

pytestmark = pytest.mark.model


def assert_solo(model, sched, uids=None):
    check = oracle.solo_check(model, sched, uids)
    assert check.rows, "no finished rows to compare"
    for row in check.rows:
        assert row.match and not row.tie_accepted, row.describe()
        assert row.max_logprob_diff <= 1e-4, row.describe()
    return check


def test_single_row_equals_solo(bundled, make_sched, prompt):
    model, _ = bundled
    sched = make_sched(max_batch=1)
    sched.submit(wb.Request(prompt=prompt(9), max_tokens=16))
    sched.run()
    assert_solo(model, sched)


def test_prompts_of_lengths_1_5_17_40_admitted_together_each_equal_solo(bundled, make_sched, prompt):
    model, _ = bundled
    sched = make_sched(max_batch=4)
    uids = [sched.submit(wb.Request(prompt=prompt(n, 29 * n), max_tokens=20)) for n in (1, 5, 17, 40)]
    assert [e.uid for e in sched.admit() if e.kind == "join"] == uids
    snap = sched.snapshot()
    assert snap.left_padding.tolist() == [39, 35, 23, 0]  # longest prompt minus its last token
    sched.run()
    check = assert_solo(model, sched)
    assert [r.uid for r in check.rows] == uids and all(len(sched.tokens(u)) == 20 for u in uids)
    # full attention on CPU: bit-exact, not just within tolerance (a GPU's kernels for [B, ...] and [1, ...]
    # differ in the last bits: measured |dlogprob| <= 1.4e-6 on an H200, docs/gpu.md)
    if mx.default_device() == mx.cpu:
        assert all(r.max_logprob_diff == 0.0 for r in check.rows), check.text()


def test_row_joining_after_three_decode_steps_matches_solo(bundled, make_sched, prompt):
    model, _ = bundled
    sched = make_sched(max_batch=4)
    for n in (7, 22):
        sched.submit(wb.Request(prompt=prompt(n, n), max_tokens=14))
    sched.admit()
    for _ in range(3):
        sched.step()
    late = sched.submit(wb.Request(prompt=prompt(30, 200), max_tokens=9))
    joined = [e for e in sched.admit() if e.kind == "join"]
    assert [e.uid for e in joined] == [late] and joined[0].row == 2
    sched.run()
    assert_solo(model, sched)


def test_row_finishing_is_evicted_while_others_continue_and_a_new_row_joins_after(
    bundled, make_sched, prompt
):
    model, _ = bundled
    sched = make_sched(max_batch=3)
    short = sched.submit(wb.Request(prompt=prompt(12, 3), max_tokens=3))
    longs = [sched.submit(wb.Request(prompt=prompt(n, 40 + n), max_tokens=15)) for n in (4, 25)]
    sched.admit()
    for _ in range(3):
        sched.step()
    assert sched.finish_reason(short) == "length"
    assert sched.snapshot().finished == (True, False, False)
    evicted = sched.filter()
    assert [(e.uid, e.row) for e in evicted] == [(short, 0)]
    snap = sched.snapshot()
    assert snap.uids == tuple(longs)
    assert snap.left_padding.min() == 0, "filter trims the left padding the kept rows share"
    newcomer = sched.submit(wb.Request(prompt=prompt(33, 300), max_tokens=8))
    sched.step()
    sched.admit()
    assert sched.snapshot().uids == (*longs, newcomer)
    sched.run()
    assert_solo(model, sched)


def test_workload_equals_mlx_lm_batch_generator(bundled, make_sched, prompt):
    model, _ = bundled
    sched = make_sched(max_batch=3)
    lengths, max_tokens = (1, 5, 17, 40, 9, 64), (12, 20, 7, 16, 25, 10)
    uids = [
        sched.submit(wb.Request(prompt=prompt(n, 17 * i), max_tokens=m))
        for i, (n, m) in enumerate(zip(lengths, max_tokens))
    ]
    sched.run()
    refs = oracle.batch_reference(model, [oracle.ref_request(sched.request_of(u)) for u in uids], max_batch=3)
    report = oracle.compare_traces({u: oracle.scheduler_trace(sched, u) for u in uids}, dict(zip(uids, refs)))
    assert report.ok, report.text()
    assert all(r.max_logprob_diff <= 1e-4 and not r.tie_accepted for r in report.rows)


def test_snapshot_mask_equals_the_mask_attention_receives_at_every_step(
    bundled, make_sched, prompt, monkeypatch
):
    import mlx_lm.models.llama as llama

    seen = []
    original = llama.scaled_dot_product_attention

    def recording_sdpa(queries, keys, values, cache, scale, mask, **kw):
        if queries.shape[2] == 1:  # decode steps only: [B, n_heads, 1, head_dim]
            seen.append(np.array(mask).reshape(queries.shape[0], -1))
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, **kw)

    monkeypatch.setattr(llama, "scaled_dot_product_attention", recording_sdpa)
    n_layers = len(bundled[0].layers)
    sched = make_sched(max_batch=4)
    for n in (7, 22):
        sched.submit(wb.Request(prompt=prompt(n, n), max_tokens=14))
    checked = 0
    for step in range(14):  # the two first rows finish at step 13
        if step == 3:
            sched.submit(wb.Request(prompt=prompt(30, 200), max_tokens=9))
        sched.admit()
        snap = sched.snapshot()
        seen.clear()
        sched.step()
        assert len(seen) == n_layers
        for layer_mask in seen:
            assert np.array_equal(snap.masks["full"], layer_mask), f"step {step}"
        assert np.array_equal(snap.masks["full"], decode_mask(snap.left_padding, snap.kv_width_tokens))
        checked += 1
        sched.filter()
    assert checked == 14 and sched.idle


def test_first_generated_token_being_a_stop_token_ends_the_row_with_no_text(bundled, make_sched, prompt):
    model, _ = bundled
    probe = make_sched(max_batch=1)
    p = prompt(11, 77)
    uid = probe.submit(wb.Request(prompt=p, max_tokens=1))
    probe.run()
    first = probe.tokens(uid)[0]

    sched = make_sched(max_batch=3)
    neighbours = [sched.submit(wb.Request(prompt=prompt(n, 5 * n), max_tokens=12)) for n in (6, 19)]
    stopper = sched.submit(wb.Request(prompt=p, max_tokens=12, stop_ids=[first]))
    report = sched.run()
    assert sched.tokens(stopper) == [first]
    assert sched.finish_reason(stopper) == "stop"
    assert sched.text(stopper) == ""
    row = report.requests.set_index("uid").loc[stopper]
    assert row.text == "" and row.generated_tokens == 1 and row.finish_reason == "stop"
    assert_solo(model, sched, neighbours)


def test_offset_plus_left_padding_is_the_kv_width_for_every_row(make_sched, prompt):
    sched = make_sched(max_batch=4)
    for i, n in enumerate((2, 9, 31)):
        sched.submit(wb.Request(prompt=prompt(n, i), max_tokens=6 + 4 * i))
    for step in range(20):
        if step == 4:
            sched.submit(wb.Request(prompt=prompt(15, 99), max_tokens=5))
        sched.admit()
        snap = sched.snapshot()
        if snap.batch_size:
            assert (snap.offset + snap.left_padding == snap.kv_width_tokens).all()
            assert snap.masks["full"].shape == (snap.batch_size, snap.kv_width_tokens + 1)
        sched.step()
        sched.filter()
    assert sched.idle and sched.snapshot().kv_bytes == 0


def test_fake_clock_makes_metrics_identical_run_to_run(bundled, prompt, fake_clock_class):
    FakeClock = fake_clock_class
    model, tokenizer = bundled

    def run():
        sched = wb.Scheduler(model, tokenizer, max_batch=2, clock=FakeClock())
        arrivals = [
            (2 * i, wb.Request(prompt=prompt(n, i), max_tokens=5)) for i, n in enumerate((3, 8, 1, 12))
        ]
        return sched.run(arrivals).requests

    a, b = run(), run()
    assert a.equals(b)
    assert (a.ttft_s > 0).all() and (a.queue_s >= 0).all()


def test_pipelined_and_unpipelined_decode_give_identical_tokens_and_logprobs(run_specs):
    tokens, logprobs, report, _ = run_specs(max_batch=3, pipeline=True)
    tokens_unpipelined, logprobs_unpipelined, report_unpipelined, _ = run_specs(max_batch=3, pipeline=False)
    assert tokens == tokens_unpipelined and logprobs == logprobs_unpipelined
    kinds = lambda r: list(zip(r.events.kind, r.events.uid, r.events.step))
    assert kinds(report) == kinds(report_unpipelined)


def test_unknown_uid_raises_key_error(make_sched):
    with pytest.raises(KeyError, match="uid 3 is unknown"):
        make_sched().tokens(3)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_batch": 0}, "max_batch must be an int >= 1"),
        ({"prefill_step_size": -1}, "prefill_step_size must be an int >= 1"),
        ({"prompt_concurrency": 0}, "prompt_concurrency must be an int >= 1"),
        ({"clear_cache_every": 0}, "clear_cache_every must be an int >= 1"),
        ({"history_size": -1}, "history_size must be an int >= 0"),
    ],
)
def test_a_scheduler_option_out_of_range_is_refused_naming_it(make_sched, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_sched(**kwargs)


def test_step_and_filter_with_no_rows_are_no_ops(make_sched):
    sched = make_sched()
    assert sched.step() == [] and sched.filter() == [] and sched.admit() == []
    assert sched.step_index == 0


def test_model_with_an_unbatchable_cache_is_refused_naming_layer_and_type(bundled):
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    class QuantizedKVModel:
        layers = [None, None]

        def make_cache(self):
            return [KVCache(), QuantizedKVCache()]

    with pytest.raises(ValueError, match="layer 1: cache type QuantizedKVCache cannot be batched"):
        wb.Scheduler(QuantizedKVModel(), bundled[1])


def test_history_recorded_without_waiting_equals_snapshots_taken_at_each_call(make_sched, prompt):
    sched = make_sched(max_batch=2, history_size=200)
    for i, (n, m) in enumerate([(9, 3), (20, 12), (5, 6), (14, 4)]):
        sched.submit(wb.Request(prompt=prompt(n, 40 * i), max_tokens=m))
    eager = []
    while not sched.idle:
        for call in (sched.admit, sched.step, sched.filter):
            before = len(sched.history)
            call()
            if len(sched.history) > before:  # the call recorded a snapshot
                eager.append(sched.snapshot().text())  # waits for the forward the call launched
    recorded = [s.text() for s in sched.history]  # captured lazily, converted only now
    assert len(recorded) == len(eager) > 10
    assert recorded == eager
    assert any("free slots: 1" in t for t in recorded)
