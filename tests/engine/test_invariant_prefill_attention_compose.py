"""The mode's shared prefill attention (:mod:`workbench.engine.levers.invariant_prefill_attention`)
composed with the schedules that reach its other branches: prompts of 2-5 chunks (groups at a
cache offset, their keys padded from each row's cache), staggered arrivals, rows of a prompt-cache
hit beside fresh rows in one forward (groups out of row order), preempted rows resumed together,
an abort, a checkpoint and a fork mid-prefill, qwen3 and 4-bit weights. Every row's tokens and
log-probs ``==`` its run alone (:func:`workbench.verify.invariance.alone`), with the shared call
on (bf16 on the CPU, where :func:`~.invariant_prefill_attention.batched_attention_holds` holds)
and with the padding rows projected (``REAL_ROWS_ONLY`` empty: what CUDA and Metal run, measured
faster on an H100). And the KV ledger's projection still bounds the bytes a multi-chunk prefill's exact first copies
(``invariant_prefill._write``) grow to."""

import mlx.core as mx
import pytest

import workbench as wb
from tests.engine.test_invariant import _model, variant
from tests.engine.test_invariant_prefill_attention import _on_the_cpu  # noqa: F401  (autouse: the CPU device)
from workbench.engine.levers import invariant_prefill
from workbench.engine.levers import invariant_prefill_attention as pa
from workbench.verify import invariance
from workbench.workloads.workload import prompt_of_length

pytestmark = pytest.mark.model

CHUNK = 16
# tails of 2-64 tokens: shorter than SOLO_QUERIES, one chunk, and 2-5 chunks of 16 whose later
# chunks attend at offsets 16-48 (9+ queries: shared; a tail's last 1-8: alone)
LENGTHS = (3, 9, 12, 17, 20, 25, 33, 40, 49, 50, 64, 65)


def _requests(tok, lengths=LENGTHS, max_tokens=5):
    reqs = [wb.Request(prompt=prompt_of_length(tok, n, 7 * n + 3), max_tokens=max_tokens) for n in lengths]
    reqs.append(
        wb.Request(prompt=prompt_of_length(tok, 37, 11), max_tokens=max_tokens, temperature=0.8, seed=5)
    )
    return reqs


def shared_calls(monkeypatch, padding_projected: bool) -> list[tuple[int, int]]:
    """Turns the shared call on for the CPU (bf16 passes its check there) and, with
    ``padding_projected``, the padding rows' projections; returns a list that collects
    ``(cache offset, rows)`` of every shared call from now on."""
    monkeypatch.setattr(pa, "BACKENDS", ("cpu",))
    monkeypatch.setattr(pa, "_HOLDS", {})
    if padding_projected:
        monkeypatch.setattr(invariant_prefill, "REAL_ROWS_ONLY", set())
    calls, groups = [], pa.groups

    def recorded(offsets, lengths, batched):
        out = groups(offsets, lengths, batched)
        calls.extend((offsets[g[0]], len(g)) for g in out if len(g) > 1)
        return out

    monkeypatch.setattr(pa, "groups", recorded)
    return calls


def _sched(model, tok, max_batch, **kw):
    return wb.Scheduler(model, tok, max_batch=max_batch, prefill_step_size=CHUNK, batch_invariant=True, **kw)


def _records(sched, uids):
    return [(sched.tokens(u), sched.logprobs(u)) for u in uids]


def _differ(got, solo):
    return [i for i, (a, b) in enumerate(zip(got, solo, strict=True)) if a != b]


@pytest.mark.parametrize("padding_projected", [False, True])
def test_multi_chunk_prompts_at_once_and_staggered_keep_every_row_bit_equal_alone(
    monkeypatch, padding_projected
):
    model, tok = variant("llama-bf16")
    reqs = _requests(tok)
    solo = [invariance.alone(model, tok, r, CHUNK) for r in reqs]
    calls = shared_calls(monkeypatch, padding_projected)
    for max_batch, arrivals in ((len(reqs), None), (5, [i // 3 * 2 for i in range(len(reqs))])):
        sched = _sched(model, tok, max_batch)
        if arrivals is None:
            uids = [sched.submit(r) for r in reqs]
            sched.run()
        else:  # groups of 1-3 joining a running batch
            sched.run(arrivals=list(zip(arrivals, reqs)))
            uids = sorted(sched.requests)
        assert _differ(_records(sched, uids), solo) == [], max_batch
    assert list(pa._HOLDS.values()) == [True]
    assert {o for o, _ in calls} == {0, 16, 32, 48}, calls  # later chunks shared at each offset


@pytest.mark.parametrize("padding_projected", [False, True])
def test_cache_hits_beside_fresh_rows_share_calls_out_of_row_order_bit_equal_alone(
    monkeypatch, padding_projected
):
    """Rows 1, 3, 5 start at a prompt-cache hit of 32 tokens, rows 2, 4, 6 at 0: one forward's
    groups at offsets 32 and 0 interleave (the output put back in row order)."""
    model, tok = variant("llama-bf16")
    prefix = prompt_of_length(tok, 40, 99)
    first = wb.Request(prompt=prefix + [5, 6, 7], max_tokens=4)
    reqs = [first] + [
        wb.Request(
            prompt=prefix + prompt_of_length(tok, 9 + 5 * i, i)
            if i % 2 == 0
            else prompt_of_length(tok, 30 + 7 * i, i),
            max_tokens=5,
        )
        for i in range(6)
    ]
    solo = [invariance.alone(model, tok, r, CHUNK) for r in reqs]
    calls = shared_calls(monkeypatch, padding_projected)
    offsets, attend = [], pa.attend

    def recorded(queries, fresh, fetched, offs, lengths, scale, batched):
        offsets.append(tuple(offs))
        return attend(queries, fresh, fetched, offs, lengths, scale, batched)

    monkeypatch.setattr(pa, "attend", recorded)
    sched = _sched(model, tok, 8, prompt_cache=8)
    uids = [sched.submit(first)]
    sched.run()
    uids += [sched.submit(r) for r in reqs[1:]]
    sched.run()
    assert [sched.requests[u].cached_tokens for u in uids] == [0, 32, 0, 32, 0, 32, 0]
    assert (32, 0, 32, 0, 32, 0) in offsets and (32, 3) in calls and (0, 3) in calls
    assert _differ(_records(sched, uids), solo) == []


def test_preempted_rows_resume_together_through_shared_calls_bit_equal_alone(monkeypatch):
    """Four rows preempted after 3+ tokens re-prefill in one group: their prompts' chunks share
    calls at offsets 0 and 16, their generated tokens replay after."""
    model, tok = variant("llama-bf16")
    reqs = [
        wb.Request(prompt=prompt_of_length(tok, n, 3 * n + 1), max_tokens=14, **seeded)
        for n, seeded in ((20, {}), (33, dict(temperature=0.9, seed=7)), (41, {}), (50, {}), (12, {}))
    ]
    solo = [invariance.alone(model, tok, r, CHUNK) for r in reqs]
    calls = shared_calls(monkeypatch, padding_projected=True)
    sched = _sched(model, tok, 5)
    uids = [sched.submit(r) for r in reqs]
    while min(len(sched.tokens(u)) for u in uids) < 3:
        sched.admit()
        sched.step()
        sched.filter()
    before = len(calls)
    for u in uids[:4]:
        sched.preempt(u)
    sched.run()
    assert (0, 4) in calls[before:] and (16, 3) in calls[before:], calls[before:]
    assert _differ(_records(sched, uids), solo) == []


def test_an_abort_a_checkpoint_and_a_fork_mid_prefill_keep_every_row_bit_equal_alone(monkeypatch):
    model, tok = variant("llama-bf16")
    reqs = _requests(tok)
    solo = [invariance.alone(model, tok, r, CHUNK) for r in reqs]
    shared_calls(monkeypatch, padding_projected=True)
    sched = _sched(model, tok, len(reqs))
    uids = [sched.submit(r) for r in reqs]
    sched.admit()
    sched.admit()  # two chunks of 16 in: rows of 40+ tokens still prefilling
    assert any(done < total for _, done, total in sched.snapshot().prefilling)
    cp, fork = sched.checkpoint(), sched.fork()
    gone = 7
    sched.abort(uids[gone])
    sched.run()
    assert sched.requests[uids[gone]].finish_reason == "abort"
    kept = [i for i in range(len(reqs)) if i != gone]
    assert _differ(_records(sched, [uids[i] for i in kept]), [solo[i] for i in kept]) == []
    sched.restore(cp)
    sched.run()
    assert _differ(_records(sched, uids), solo) == []
    fork.run()
    assert _differ(_records(fork, uids), solo) == []


_BF16: dict = {}


@pytest.mark.parametrize("family", ["qwen3-bf16", "llama-bf16-4bit"])
def test_qwen3_and_4bit_weights_share_calls_bit_equal_alone(monkeypatch, family):
    if family not in _BF16:
        _BF16[family] = _model(
            "tiny-qwen3" if family == "qwen3-bf16" else "tiny-code", mx.bfloat16, "4bit" in family
        )
    model, tok = _BF16[family]
    reqs = _requests(tok, lengths=(9, 20, 33, 50, 65), max_tokens=4)
    solo = [invariance.alone(model, tok, r, CHUNK) for r in reqs]
    calls = shared_calls(monkeypatch, padding_projected=True)
    sched = _sched(model, tok, 5)
    sched.run(arrivals=[(i // 3 * 2, r) for i, r in enumerate(reqs)])
    assert list(pa._HOLDS.values()) == [True] and any(o > 0 for o, _ in calls)
    assert _differ(_records(sched, sorted(sched.requests)), solo) == []


@pytest.mark.parametrize("family", ["llama-bf16", "llama-trained"])
def test_the_projection_bounds_the_bytes_a_multi_chunk_prefill_holds_beside_free_slots(family):
    """A 41-token prompt (chunks 16, 16, 8) prefills while a row runs beside three free slots:
    after every admit and step the batch and prefill caches hold no more than admission
    projected (the fuzzer's ``the_projection_bounds_the_bytes_held``). The first chunk's exact
    copies grown by mlx-lm's ``update_and_fetch`` held 16 + 256 positions a layer after the
    second, where the ledger counts mlx-lm's 256."""
    model, tok = variant(family)
    running = [
        wb.Request(prompt=prompt_of_length(tok, 5 + i, i), max_tokens=2 if i < 3 else 40) for i in range(4)
    ]
    late = wb.Request(prompt=prompt_of_length(tok, 41, 77), max_tokens=3)
    one = _sched(model, tok, 1).ledger.alone_bytes(50, 40)
    sched = _sched(model, tok, 5, kv_budget_bytes=8 * one)
    for r in running:
        sched.submit(r)
    over, prefilled = [], 0
    for i in range(60):
        if i == 4:
            sched.submit(late)
        for call in (sched.admit, sched.step):
            if call is sched.step and not sched.state.batch.rows:
                continue
            call()
            snap = sched.snapshot()
            prefilled = max(prefilled, snap.prefill_kv_bytes)
            if snap.kv_bytes + snap.prefill_kv_bytes > snap.kv_projected_bytes:
                held = (snap.kv_bytes, snap.prefill_kv_bytes, snap.kv_projected_bytes)
                over.append((call.__name__, snap.prefilling, *held))
        sched.filter()
        if sched.idle:
            break
    assert sched.idle and prefilled > 0
    assert over == []
