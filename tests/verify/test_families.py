"""Every cache family mlx-lm can batch, verified per family with at least two rows:
sliding window + global attention (gemma3_text: BatchRotatingKVCache + BatchKVCache),
gated-delta + attention (qwen3_next: ArraysCache + BatchKVCache), pure SSM (mamba2:
ArraysCache), and full attention bounded by max_kv_size (qwen3: BatchRotatingKVCache).
Windows are 8 tokens, so the rings wrap inside every scenario."""

import mlx.core as mx
import numpy as np
import pytest

import workbench as wb
from workbench.runtime.loading import DATA_DIR
from workbench.verify import oracle
from workbench.verify.mask_oracle import mismatches, recorded_masks
from workbench.workloads.workload import prompt_maker, prompt_of_length

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("solo_references_once")]

ATOL = 1e-5  # ring-buffer and SSM layers: per-step logprobs within 1e-5 of solo
FAMILIES = {
    "gemma3-window": ("tiny-gemma3", None),
    "qwen3next-hybrid": ("tiny-qwen3-next", None),
    "mamba2-ssm": ("tiny-mamba2", None),
    "qwen3-max-kv-8": ("tiny-qwen3", 8),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    folder, max_kv_size = FAMILIES[request.param]
    model, tokenizer = wb.load(DATA_DIR / "models" / folder)

    def make(**kw):
        return wb.Scheduler(model, tokenizer, max_kv_size=max_kv_size, **kw)

    make.model, make.tokenizer, make.max_kv_size = model, tokenizer, max_kv_size
    make.prompt = prompt_maker(tokenizer)
    return make


def assert_solo(family, sched, uids=None):
    check = oracle.solo_check(family.model, sched, uids, atol=ATOL)
    assert check.rows
    for row in check.rows:
        assert row.match and not row.tie_accepted, row.describe()
    return check


def test_lengths_1_5_17_40_together_equal_solo(family):
    sched = family(max_batch=4)
    for n in (1, 5, 17, 40):
        sched.submit(wb.Request(prompt=family.prompt(n, 31 * n), max_tokens=20))
    sched.run()
    assert_solo(family, sched)


@pytest.mark.parametrize("join_after_steps", [3, 10])  # 12 + 10 tokens: past the 8-token window
def test_row_joining_mid_decode_equals_solo_before_and_after_a_wrap(family, join_after_steps):
    sched = family(max_batch=4)
    for n in (12, 3):
        sched.submit(wb.Request(prompt=family.prompt(n, n), max_tokens=24))
    sched.admit()
    for _ in range(join_after_steps):
        sched.step()
    sched.submit(wb.Request(prompt=family.prompt(21, 400), max_tokens=14))
    sched.admit()
    sched.run()
    assert_solo(family, sched)


def test_row_evicted_after_a_wrap_then_a_new_row_joins_equals_solo(family):
    sched = family(max_batch=3)
    short = sched.submit(wb.Request(prompt=family.prompt(9, 7), max_tokens=11))
    sched.submit(wb.Request(prompt=family.prompt(4, 70), max_tokens=26))
    sched.submit(wb.Request(prompt=family.prompt(30, 170), max_tokens=22))
    sched.admit()
    for _ in range(11):
        sched.step()
    assert [e.uid for e in sched.filter()] == [short]
    sched.submit(wb.Request(prompt=family.prompt(15, 600), max_tokens=10))
    sched.run()
    assert_solo(family, sched)


def test_stop_at_first_token_leaves_neighbours_untouched(family):
    probe = family(max_batch=1)
    p = family.prompt(13, 222)
    uid = probe.submit(wb.Request(prompt=p, max_tokens=1))
    probe.run()
    first = probe.tokens(uid)[0]
    sched = family(max_batch=3)
    neighbours = [sched.submit(wb.Request(prompt=family.prompt(n, 3 * n), max_tokens=15)) for n in (6, 19)]
    stopper = sched.submit(wb.Request(prompt=p, max_tokens=15, stop_ids=[first]))
    sched.run()
    assert sched.tokens(stopper) == [first] and sched.text(stopper) == ""
    assert_solo(family, sched, neighbours)


def test_short_row_output_does_not_depend_on_its_long_neighbour(family):
    def short_row(neighbour_len):
        sched = family(max_batch=2)
        short = sched.submit(wb.Request(prompt=family.prompt(3, 500), max_tokens=16))
        if neighbour_len:
            sched.submit(wb.Request(prompt=family.prompt(neighbour_len, 9), max_tokens=16))
        sched.run()
        return sched.tokens(short), sched.logprobs(short)

    alone_tokens, alone_lp = short_row(0)
    for n in (1, 40):
        tokens, lp = short_row(n)
        assert tokens == alone_tokens
        assert np.allclose(lp, alone_lp, atol=ATOL, rtol=0)


def test_workload_equals_mlx_lm_batch_generator(family):
    sched = family(max_batch=3)
    specs = ((1, 12), (17, 20), (40, 9), (5, 16), (26, 11))
    uids = [
        sched.submit(wb.Request(prompt=family.prompt(n, 11 * i), max_tokens=m))
        for i, (n, m) in enumerate(specs)
    ]
    sched.run()
    refs = oracle.batch_reference(
        family.model,
        [oracle.ref_request(sched.request_of(u)) for u in uids],
        max_batch=3,
        max_kv_size=family.max_kv_size,
    )
    report = oracle.compare_traces(
        {u: oracle.scheduler_trace(sched, u) for u in uids}, dict(zip(uids, refs)), atol=ATOL
    )
    assert report.ok, report.text()


def test_each_group_mask_equals_what_the_layers_receive_at_every_step(family):
    sched = family(max_batch=3)
    for n in (3, 14):
        sched.submit(wb.Request(prompt=family.prompt(n, 2 * n), max_tokens=18))
    steps = wrapped_seen = 0
    while not sched.idle:
        if sched.step_index == 6:
            sched.submit(wb.Request(prompt=family.prompt(11, 333), max_tokens=7))
        sched.admit()
        snap = sched.snapshot()
        caches = sched.batch_cache
        with recorded_masks(family.model) as seen:
            sched.step()
        # one mask per attention layer, one per forward for the recurrent layers
        n_attn = sum(len(g.layers) for g in snap.groups if g.name != "ssm")
        assert len(seen) == n_attn + any(g.name == "ssm" for g in snap.groups)
        assert mismatches(snap, seen, caches) == [], f"step {snap.step}"
        wrapped_seen += any(g.wrapped for g in snap.groups)
        steps += 1
        sched.filter()
    assert steps == 18
    if family.max_kv_size or "gemma3" in type(family.model).__module__:
        assert wrapped_seen > 5, "the ring buffer should have wrapped during the scenario"


def test_keep_4_solo_reference_differs_from_the_batch_ring_which_keeps_no_sinks():
    model, tokenizer = wb.load(DATA_DIR / "models" / "tiny-qwen3")
    req = oracle.RefRequest(tuple(prompt_of_length(tokenizer, 30, 5)), 20, frozenset())
    keep0 = oracle.solo_reference(model, req, max_kv_size=8, keep=0)
    keep4 = oracle.solo_reference(model, req, max_kv_size=8, keep=4)
    assert not np.allclose(keep0.logprobs, keep4.logprobs, atol=1e-3)


def test_max_kv_size_on_a_model_with_its_own_caches_is_refused():
    model, tokenizer = wb.load(DATA_DIR / "models" / "tiny-gemma3")
    with pytest.raises(ValueError, match="max_kv_size=8 would be ignored"):
        wb.Scheduler(model, tokenizer, max_kv_size=8)


def test_llama4_chunked_attention_is_refused_at_construction_naming_layer_and_type():
    from workbench.verify.families import build, config_for

    # llama4's own fields over the families' base config: attention in chunks of 8 tokens, 2
    # experts, 4 layers (its global attention layer is the fourth)
    text = dict(
        config_for("llama4_text"),
        num_hidden_layers=4,
        attention_bias=False,
        attention_chunk_size=8,
        interleave_moe_layer_step=1,
        intermediate_size_mlp=128,
        num_experts_per_tok=1,
        num_local_experts=2,
        rope_scaling=None,
        use_qk_norm=True,
    )
    model = build("llama4", {"model_type": "llama4", "text_config": text})
    _, tokenizer = wb.load(DATA_DIR / "models" / "tiny-llama")
    with pytest.raises(ValueError, match="layer 0: cache type ChunkedKVCache cannot be batched"):
        wb.Scheduler(model, tokenizer)


def test_sliding_window_decode_equals_recomputing_without_cache():
    model, tokenizer = wb.load(DATA_DIR / "models" / "tiny-gemma3")
    sched = wb.Scheduler(model, tokenizer, max_batch=2)
    prompts = [prompt_of_length(tokenizer, n, 7 * n) for n in (3, 20)]
    uids = [sched.submit(wb.Request(prompt=p, max_tokens=16)) for p in prompts]
    sched.run()
    for uid, p in zip(uids, prompts):
        tokens = sched.tokens(uid)
        for t, (tok, lp) in enumerate(zip(tokens, sched.logprobs(uid))):
            context = mx.array([p + tokens[:t]])
            logits = model(context)[0, -1]  # no cache: each query attends its window only
            logprobs = logits - mx.logsumexp(logits)
            assert int(mx.argmax(logprobs).item()) == tok
            assert abs(logprobs[tok].item() - lp) < 1e-4


def test_cache_kinds_per_family_are_grouped_in_snapshots(family):
    sched = family(max_batch=2)
    for n in (2, 12):
        sched.submit(wb.Request(prompt=family.prompt(n), max_tokens=4))
    sched.admit()
    snap = sched.snapshot()
    names = [g.name for g in snap.groups]
    expected = {
        "gemma3_text": ["window8", "full"],
        "qwen3_next": ["ssm", "full"],
        "mamba2": ["ssm"],
        "qwen3": ["window8"],
    }
    assert names == expected[type(family.model).__module__.split(".")[-1]]
    assert sum(g.kv_bytes for g in snap.groups) == snap.kv_bytes
    text = snap.text()
    for name in names:
        assert f"[{name}]" in text


@pytest.mark.parametrize("short,long,chunk", [(81, 182, 3), (10, 30, 2), (10, 30, 4), (5, 9, 1), (2, 1, 16)])
def test_a_padded_group_prefilled_in_any_chunk_size_equals_solo(family, short, long, chunk):
    """Regression (found by tests/verify/test_fuzz.py): mlx-lm's right-padded prefill crashed on a
    one-column chunk of a rotating cache and gave NaN for mamba2 across chunk boundaries;
    such groups now prefill row by row."""
    sched = family(max_batch=2, prefill_step_size=chunk)
    sched.submit(wb.Request(prompt=family.prompt(short, 267), max_tokens=4, stop_ids=[]))
    sched.submit(wb.Request(prompt=family.prompt(long, 571), max_tokens=4, stop_ids=[]))
    sched.run()
    assert_solo(family, sched)


def test_row_joining_into_a_finished_rows_free_slot_equals_solo(family):
    sched = family(max_batch=2)
    sched.submit(wb.Request(prompt=family.prompt(9, 0), max_tokens=3))
    sched.submit(wb.Request(prompt=family.prompt(30, 50), max_tokens=16))
    sched.admit()
    for _ in range(3):
        sched.step()
    sched.filter()
    sched.submit(wb.Request(prompt=family.prompt(6, 300), max_tokens=10))
    joined = [e for e in sched.admit() if e.kind == "join"]
    rings = any(g.window_tokens is not None for g in sched.snapshot().groups)
    assert joined[0].join_mode == ("extend" if rings else "free slot")  # ring layers cannot take a slot
    sched.run()
    assert_solo(family, sched)


def test_history_read_later_equals_snapshots_taken_at_each_call(family):
    sched = family(max_batch=3, history_size=500)
    for i, (n, m) in enumerate([(9, 3), (20, 14), (5, 6), (14, 9)]):
        sched.submit(wb.Request(prompt=family.prompt(n, 40 * i), max_tokens=m))
    eager = []
    while not sched.idle:
        for call in (sched.admit, sched.step, sched.filter):
            before = len(sched.history)
            call()
            if len(sched.history) > before:
                eager.append(sched.snapshot().text())
    assert [s.text() for s in sched.history] == eager  # ring caches update arrays in place
