"""The batch-invariant mode composed with preemption (``kv_budget_bytes``, ``preempt()``), a
quantized KV cache (``kv_bits``) and speculative decoding: every row's tokens and log-probs
``==`` the same request run alone in the same settings (issue 39's coverage; docs/compose.md
R6-R8). Each of these was refused at construction before."""

import mlx.core as mx
import pytest

import workbench as wb
from tests.engine import drafting
from tests.engine.test_invariant import CHUNK, _model, _requests, _run, variant
from workbench.engine.levers.invariant import row_attention
from workbench.engine.levers.invariant_attention import per_row_attention
from workbench.engine.levers.quantized_kv import is_quantized
from workbench.verify import invariance
from workbench.workloads.workload import prompt_of_length

pytestmark = pytest.mark.model


def _sched(model, tok, max_batch, **kw):
    return wb.Scheduler(model, tok, max_batch=max_batch, prefill_step_size=CHUNK, batch_invariant=True, **kw)


def _alone(model, tok, reqs, **kw):
    out = []
    for r in reqs:
        s = _sched(model, tok, 1, **kw)
        u = s.submit(r)
        s.run()
        out.append((s.tokens(u), s.logprobs(u)))
    return out


def _records(sched, uids):
    return [(sched.tokens(u), sched.logprobs(u)) for u in uids]


def _differ(got, solo):
    return [i for i, (a, b) in enumerate(zip(got, solo, strict=True)) if a != b]


# -- R8: preemption (kv_budget_bytes, preempt()) -----------------------------------------


def _priority_requests(tok):
    """Rows whose later arrivals outrank the running ones: under a budget of two rows each
    arrival preempts the lowest (greedy and seeded rows)."""
    shapes = [(10, 0), (21, 1), (9, 0), (30, 2), (12, 3), (17, 1), (25, 4), (11, 5)]
    return [
        wb.Request(
            prompt=prompt_of_length(tok, n, 31 * i + 5),
            max_tokens=16,
            priority=p,
            **(dict(temperature=0.9, seed=40 + i) if i % 3 == 2 else {}),
        )
        for i, (n, p) in enumerate(shapes)
    ]


def test_a_kv_budget_preempts_rows_that_resume_bit_equal_to_their_run_alone():
    model, tok = variant("llama-trained")
    reqs = _priority_requests(tok)
    solo = _alone(model, tok, reqs)
    one = _sched(model, tok, 1).ledger.alone_bytes(30, 16)
    for max_batch in (4, 3):
        sched = _sched(model, tok, max_batch, kv_budget_bytes=2 * one, policy="priority")
        sched.run(arrivals=[(3 * i, r) for i, r in enumerate(reqs)])
        preempted = {e.uid for e in sched.events if e.kind == "preempt"}
        assert len(preempted) >= 3, "the budget preempted rows with tokens"
        assert _differ(_records(sched, sorted(sched.requests)), solo) == []
    assert invariance.bit_check(sched).ok


@pytest.mark.parametrize("family", ["llama", "mamba2", "qwen3next", "gemma3"])
def test_preempt_mid_run_replays_the_rows_decode_steps_on_every_cache_family(family):
    """Attention (KV), recurrent (state), hybrid and sliding-window layers: rows preempted
    after 1, 5 and 9 tokens (one of them seeded, one beside a prompt-cache hit) resume
    bit-equal to alone."""
    model, tok = sliding("gemma3") if family == "gemma3" else variant(family)
    shared = prompt_of_length(tok, 20, 3)
    reqs = _requests(tok, sampled=1, max_tokens=12)[:5] + [
        wb.Request(prompt=shared + [70 + i] * (i + 2), max_tokens=12) for i in range(2)
    ]
    solo = _alone(model, tok, reqs, prompt_cache=8)
    sched = _sched(model, tok, 4, prompt_cache=8)
    uids = [sched.submit(r) for r in reqs]
    done = []
    for target in (1, 5, 9):  # preempt a running row once one holds at least `target` tokens
        while True:
            rows = [u for u in sched.snapshot().uids if u not in done and target <= len(sched.tokens(u)) < 12]
            if rows:
                break
            sched.admit()
            sched.step()
            sched.filter()
        sched.preempt(rows[-1])
        done.append(rows[-1])
    sched.run()
    assert len([e for e in sched.events if e.kind == "preempt" and e.n_tokens > 0]) == 3
    assert _differ(_records(sched, uids), solo) == []


def test_a_resumed_rows_cache_hit_stops_at_its_prompt():
    """A row preempted while an entry holding its prompt and generated tokens as a prompt
    exists: its hit covers whole chunks of its prompt only (its tokens replay one a forward)."""
    model, tok = variant("llama-trained")
    first = wb.Request(prompt=prompt_of_length(tok, 17, 9), max_tokens=14)
    probe = _sched(model, tok, 1)
    u = probe.submit(first)
    probe.run()
    made = probe.tokens(u)
    longer = wb.Request(prompt=list(probe.requests[u].valid.prompt_ids) + made + [5] * 9, max_tokens=2)
    sched = _sched(model, tok, 2, prompt_cache=8)
    sched.submit(longer)  # its prefill stores whole chunks covering first's prompt and tokens
    sched.run()
    v = sched.submit(first)
    while len(sched.tokens(v)) < 10:  # its prompt and tokens so far: 26 tokens to resume from
        sched.admit()
        sched.step()
        sched.filter()
    sched.preempt(v)
    sched.run()
    assert 0 < sched.requests[v].cached_tokens <= 16  # whole chunks of its prompt's 16 prefilled tokens
    assert (sched.tokens(v), sched.logprobs(v)) == (made, _alone(model, tok, [first])[0][1])


def test_with_kv_bits_a_preempted_row_replays_its_quantized_decode_steps():
    """A quantized cache under a KV budget and a preempt() mid-run (one row of a one-token
    prompt, whose first forward is on float keys): every row bit-equal to alone."""
    model, tok = variant("llama-trained")
    quant = dict(kv_bits=8, kv_group_size=32)
    reqs = _priority_requests(tok)[:6] + [wb.Request(prompt=[307], max_tokens=12, priority=6)]
    solo = _alone(model, tok, reqs, **quant)
    one = _sched(model, tok, 1, **quant).ledger.alone_bytes(30, 16)
    sched = _sched(model, tok, 3, kv_budget_bytes=2 * one, policy="priority", **quant)
    sched.run(arrivals=[(3 * i, r) for i, r in enumerate(reqs)], max_steps=20)
    one_token = max(sched.requests)
    while len(sched.tokens(one_token)) < 3:  # the one-token prompt's row, 3 tokens in
        sched.admit()
        sched.step()
        sched.filter()
    sched.preempt(one_token)
    sched.run()
    preempted = {e.uid for e in sched.events if e.kind == "preempt"}
    assert one_token in preempted and len(preempted) >= 3
    assert _differ(_records(sched, sorted(sched.requests)), solo) == []
    assert invariance.bit_check(sched).ok


# -- sliding-window layers (BatchRotatingKVCache) ----------------------------------------

_SLIDING: dict = {}


def sliding(name):
    """tiny-gemma3 (sliding layers of an 8-token window beside global ones) or tiny-qwen3 with
    ``max_kv_size=16`` (every layer a 16-token ring): ``(model, tokenizer)``."""
    if name not in _SLIDING:
        _SLIDING[name] = _model("tiny-gemma3" if name == "gemma3" else "tiny-qwen3")
    return _SLIDING[name]


@pytest.mark.parametrize("family, window", [("gemma3", {}), ("qwen3", dict(max_kv_size=16))])
def test_sliding_window_rows_are_bit_equal_to_alone_past_the_rings_turn(family, window):
    """Prompts of 1-40 tokens and 14 new ones through 8- and 16-token rings: every row's keys
    attended oldest first whatever the batch's ring rotation (``temporal_order``)."""
    model, tok = sliding(family)
    reqs = _requests(tok, max_tokens=14)
    solo = _alone(model, tok, reqs, **window)
    for max_batch, arrivals in ((14, None), (5, [i // 2 * 3 for i in range(len(reqs))])):
        sched, got = _run(model, tok, reqs, max_batch, arrivals, **window)
        assert sched.config.max_batch == max_batch  # batched, not sent to the serial lane
        assert _differ(got, solo) == [], (family, max_batch)
    assert invariance.bit_check(sched).ok  # alone with the same window


# -- R7: a quantized KV cache (kv_bits) ---------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
def test_with_kv_bits_every_row_is_bit_equal_to_alone_and_attends_quantized_keys(bits):
    model, tok = variant("llama-trained")
    reqs = _requests(tok, max_tokens=8)[::2]  # 7 rows, one of them seeded
    quant = dict(kv_bits=bits, kv_group_size=32)
    solo = _alone(model, tok, reqs, **quant)
    for max_batch, arrivals in ((14, None), (5, [i // 2 * 3 for i in range(len(reqs))])):
        sched = _sched(model, tok, max_batch, **quant)
        if arrivals is None:
            uids = [sched.submit(r) for r in reqs]
            sched.run(max_steps=2)
            assert all(is_quantized(c) for c in sched.state.batch.caches)
            sched.run()
        else:
            sched.run(arrivals=list(zip(arrivals, reqs)))
            uids = sorted(sched.requests)
        assert _differ(_records(sched, uids), solo) == [], (bits, max_batch)
    assert invariance.bit_check(sched).ok  # against the same request alone with this kv_bits
    # the mode reads the quantized keys: near the default path's kv_bits run, not its float run
    default = wb.Scheduler(model, tok, max_batch=14, prefill_step_size=CHUNK, **quant)
    uids = [default.submit(r) for r in reqs]
    default.run()
    floats = _alone(model, tok, reqs[:3])
    for (tokens, lps), u in zip(solo, uids):
        same = [(a, b) for a, b, t, d in zip(lps, default.logprobs(u), tokens, default.tokens(u)) if t == d]
        assert max(abs(a - b) for a, b in same) < 2e-3 * bits
    assert any(lps != f for (_, lps), (_, f) in zip(solo, floats))


# -- R6: speculative decoding ------------------------------------------------------------

CODE = [
    "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "x = 1\nx = 1\nx = 1\n",
    "import os\nimport sys\n",
]


@pytest.mark.parametrize("method", ["prompt-lookup", "noisy draft"])
def test_speculative_rows_are_bit_equal_to_alone_and_to_no_speculation(method):
    """Each verify position computes what a one-token step computes: rows of different draft
    counts in one verify forward (and a draft model batched as it likes) give the bits of the
    row alone, speculating or not."""
    model, tok = variant("llama-trained")
    spec = dict(
        speculative="prompt-lookup" if method == "prompt-lookup" else drafting.noisy_draft(),
        num_draft_tokens=4,
    )
    reqs = [wb.Request(prompt=CODE[i % 4] * (1 + i % 2), max_tokens=10 + 3 * (i % 3)) for i in range(5)]
    reqs += _requests(tok, sampled=1, max_tokens=10)[-2:]
    solo = _alone(model, tok, reqs, **spec)
    assert solo == _alone(model, tok, reqs)
    for max_batch, arrivals in ((7, [0] * len(reqs)), (3, [2 * i for i in range(len(reqs))])):
        sched = _sched(model, tok, max_batch, **spec)
        sched.run(arrivals=list(zip(arrivals, reqs)))
        assert _differ(_records(sched, sorted(sched.requests)), solo) == [], (method, max_batch)
        drafts = [e for e in sched.events if e.kind == "draft"]
        assert sum(e.n_accepted for e in drafts) > 10, "drafts were accepted"
        assert len({e.n_tokens for e in drafts}) > 1, "rows of different draft counts"


def test_per_row_attention_gives_each_query_position_the_bits_of_a_one_token_step():
    """Over a left-padded cache: a row's 3 query positions attended at once equal each
    position attended alone behind other padding (float and quantized keys)."""
    from mlx_lm.models.cache import BatchKVCache

    from workbench.engine.levers.quantized_kv import BatchQuantizedKVCache

    B, H, Hkv, D, S = 2, 4, 2, 32, 12
    k = mx.random.normal((B, Hkv, S, D), key=mx.random.key(1))
    v = mx.random.normal((B, Hkv, S, D), key=mx.random.key(2))
    q = mx.random.normal((B, H, 3, D), key=mx.random.key(3))
    held = [6, 2]  # row 0: columns 3..11 are its own, row 1: 7..11
    for cache in (BatchKVCache([3, 7]), BatchQuantizedKVCache([3, 7], 32, 8)):
        keys, values = cache.update_and_fetch(k, v)
        many = per_row_attention(None, row_attention, q, keys, values, cache, 0.3, held, cuda=False)
        for b, n in enumerate(held):
            for j in range(3):
                kk, vv = (
                    (tuple(a[b : b + 1, :, : S - 2 + j] for a in t) for t in (keys, values))
                    if isinstance(keys, tuple)
                    else (keys[b : b + 1, :, : S - 2 + j], values[b : b + 1, :, : S - 2 + j])
                )
                one = per_row_attention(
                    None, row_attention, q[b : b + 1, :, j : j + 1], kk, vv, cache, 0.3, [n + j], cuda=False
                )
                assert mx.array_equal(many[b : b + 1, :, j : j + 1], one).item(), (type(cache).__name__, b, j)
    with pytest.raises(RuntimeError, match="tokens in a cache 12 wide"):
        per_row_attention(None, row_attention, q, keys, values, cache, 0.3, [10, 2], cuda=False)
