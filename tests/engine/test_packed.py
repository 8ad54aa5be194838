"""The packed layout through the scheduler: every row equals its run alone through mlx-lm
(tokens; log-probs within the oracle's 1e-4), under staggered arrivals, mixed decode and
prefill forwards, abort, preemption, a KV budget in pages, checkpoint / restore / fork;
the books count pages; other families and settings are refused at construction."""

import pytest
from mlx_lm.models.cache import LRUPromptCache

import workbench as wb
from workbench.observe.packed import packed_mask
from workbench.runtime.loading import DATA_DIR
from workbench.verify import oracle
from workbench.workloads.workload import prompt_of_length

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("solo_references_once")]

SPECS = ((3, 12), (60, 9), (17, 14), (1, 5), (33, 10), (9, 16))  # (prompt tokens, max_tokens)


def packed(model, tok, **settings):
    return wb.Scheduler(
        model,
        tok,
        **({"layout": "packed", "max_batch": 4, "page_size": 4, "max_num_batched_tokens": 16} | settings),
    )


def submit_specs(sched, tok, specs=SPECS, start=0):
    return [
        sched.submit(wb.Request(prompt=prompt_of_length(tok, n, start + 13 * i), max_tokens=m, stop_ids=[]))
        for i, (n, m) in enumerate(specs)
    ]


def staggered(sched, tok, specs=SPECS, every=2):
    """Submit one request every ``every`` iterations, checking the books after each call."""
    uids, pending = [], list(enumerate(specs))
    while pending or not sched.idle:
        if pending and sched.step_index >= every * len(uids):
            i, (n, m) = pending.pop(0)
            uids.append(
                sched.submit(wb.Request(prompt=prompt_of_length(tok, n, 13 * i), max_tokens=m, stop_ids=[]))
            )
        for call in (sched.admit, sched.step, sched.filter):
            call()
            check_books(sched)
    return uids


def check_books(sched):
    report = sched.check()
    assert report.ok, str(report)
    snap = sched.snapshot()
    state = snap.packed
    assert snap.kv_bytes == state.held_bytes == state.used_pages * state.page_bytes
    held = dict(state.held_tokens)
    for uid, pages in state.pages:
        assert len(pages) == -(-held[uid] // state.page_size) or held[uid] == 0 or len(pages) > 0
    T = sum(c.n_tokens for c in state.last_chunks)
    assert T <= sched.config.token_budget
    if sched.config.kv_budget_bytes is not None:
        assert snap.kv_bytes <= sched.kv_projected_bytes <= sched.config.kv_budget_bytes


@pytest.fixture(scope="module")
def llama():
    return wb.load(DATA_DIR / "models" / "tiny-llama")


@pytest.mark.parametrize("page_size, budget", [(4, 16), (16, 8), (1, 64), (7, 5)])
def test_staggered_rows_in_packed_forwards_equal_each_request_run_alone(bundled, page_size, budget):
    model, tok = bundled
    sched = packed(model, tok, page_size=page_size, max_num_batched_tokens=budget)
    uids = staggered(sched, tok)
    check = oracle.solo_check(model, sched, uids, atol=1e-4)
    assert check.ok, check.text()
    assert check.noise < 1e-4
    kinds = [tuple(c.kind for c in s.packed.last_chunks) for s in sched.history]
    assert any("decode" in k and "prefill" in k for k in kinds), (
        "some forward mixed decode and prefill tokens"
    )


def test_a_second_llama_shape_in_packed_forwards_equals_its_solo_runs(llama):
    model, tok = llama
    sched = packed(model, tok, max_batch=3, page_size=8, max_num_batched_tokens=12)
    uids = submit_specs(sched, tok)
    sched.run()
    check = oracle.solo_check(model, sched, uids, atol=1e-4)
    assert check.ok, check.text()


def test_every_forward_carries_each_running_rows_next_token_within_the_budget(bundled):
    model, tok = bundled
    sched = packed(model, tok, max_num_batched_tokens=10, history_size=200)
    submit_specs(sched, tok)
    seen_running = []
    while not sched.idle:
        sched.admit()
        running = {r.uid for r in sched.batch.rows if r.status is wb.Status.RUNNING}
        sched.step()
        chunks = sched.snapshot().packed.last_chunks
        assert {c.uid for c in chunks if c.kind == "decode"} == running
        assert sum(c.n_tokens for c in chunks) <= 10
        seen_running.append(len(running))
        sched.filter()
    assert max(seen_running) == 4


def test_the_mask_of_a_step_is_block_diagonal_over_its_requests(bundled):
    model, tok = bundled
    sched = packed(model, tok)
    submit_specs(sched, tok, SPECS[:2])
    for _ in range(3):
        sched.admit()
        sched.step()
    chunks = sched.snapshot().packed.last_chunks
    mask = packed_mask(chunks)
    sizes = [c.n_tokens for c in chunks]
    keys = [c.end for c in chunks]
    assert mask.shape == (sum(sizes), sum(keys))
    assert mask.sum() == sum(sum(c.start + i + 1 for i in range(c.n_tokens)) for c in chunks)


def test_aborts_and_preemptions_in_any_state_leave_the_other_rows_equal_to_solo(bundled):
    model, tok = bundled
    sched = packed(model, tok, max_num_batched_tokens=8)
    uids = submit_specs(sched, tok)
    sched.admit()
    sched.step()
    sched.abort(uids[1])  # prefilling (60 tokens at 8 per forward)
    sched.preempt(uids[0])  # running (its 3-token prompt fit the first forward)
    for _ in range(3):
        sched._iterate()
    prefilling = next(r.uid for r in sched.batch.rows if r.status is wb.Status.PREFILLING)
    sched.preempt(prefilling)
    sched.run()
    assert sched.finish_reason(uids[1]) == "abort"
    assert [e.uid for e in sched.events if e.kind == "preempt"] == [uids[0], prefilling]
    done = [u for u in uids if u != uids[1]]
    check = oracle.solo_check(model, sched, done, atol=1e-4)
    assert check.ok, check.text()
    assert sched.check().ok and sched.snapshot().packed.used_pages == 0


def test_an_evicted_rows_pages_are_the_next_joiners(bundled):
    model, tok = bundled
    sched = packed(model, tok, max_batch=1, max_num_batched_tokens=64)
    a = sched.submit(wb.Request(prompt=prompt_of_length(tok, 9, 0), max_tokens=3))
    sched.run()
    assert sched.snapshot().packed.free_pages == (0, 1, 2)
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 5, 40), max_tokens=3))
    sched.admit()
    sched.step()
    state = sched.snapshot().packed
    assert state.pages == ((a + 1, (0, 1)),) and state.capacity_pages == 3 and state.free_pages == (2,)


def test_the_page_bytes_equal_the_pools_bytes_per_page_and_the_models_own_shapes(bundled):
    model, tok = bundled
    sched = packed(model, tok, page_size=4)
    submit_specs(sched, tok, SPECS[:3])
    sched.admit()
    sched.step()
    sched.step()
    batch = sched.batch
    args = model.args
    dtype_bytes = batch.pools.keys[0].dtype.size
    per_token = 2 * args.num_key_value_heads * args.head_dim * dtype_bytes * args.num_hidden_layers
    assert batch.page_bytes == 4 * per_token
    assert batch.pools.nbytes == (batch.pools.slots // 4) * batch.page_bytes == batch.pool_bytes
    held = sum(-(-h // 4) for h in batch.held)  # an independent count of the pages the rows need
    assert sched.snapshot().kv_bytes == held * batch.page_bytes


def test_a_kv_budget_in_pages_admits_what_fits_and_preempts_for_priority(bundled):
    model, tok = bundled
    probe = packed(model, tok)
    two = 2 * probe.ledger.alone_bytes(6, 10)
    sched = packed(model, tok, kv_budget_bytes=two)
    low = [
        sched.submit(wb.Request(prompt=prompt_of_length(tok, 6, 30 * i), max_tokens=10, stop_ids=[]))
        for i in range(2)
    ]
    sched.admit()
    sched.step()
    sched.step()
    high = sched.submit(
        wb.Request(prompt=prompt_of_length(tok, 6, 90), max_tokens=10, stop_ids=[], priority=2)
    )
    events = sched.admit()
    assert [e.uid for e in events if e.kind == "preempt"] == [low[1]]
    check_books(sched)
    sched.run()
    check = oracle.solo_check(model, sched, low + [high], atol=1e-4)
    assert check.ok, check.text()
    with pytest.raises(ValueError, match="reserves .* KV bytes .* pages of 4 tokens"):
        sched.submit(wb.Request(prompt=prompt_of_length(tok, 30, 0), max_tokens=10))


def test_checkpoint_restore_and_fork_continue_with_the_same_tokens(bundled):
    model, tok = bundled
    sched = packed(model, tok, max_num_batched_tokens=8)
    uids = submit_specs(sched, tok)
    for _ in range(6):
        sched._iterate()
    cp = sched.checkpoint()
    fork = sched.fork()
    sched.run()
    first = {u: sched.tokens(u) for u in uids}
    sched.restore(cp)
    sched.run()
    assert {u: sched.tokens(u) for u in uids} == first
    fork.run()
    assert {u: fork.tokens(u) for u in uids} == first
    assert oracle.solo_check(model, fork, uids, atol=1e-4).ok


@pytest.mark.parametrize("folder", ["tiny-qwen3", "tiny-gemma3", "tiny-mamba2"])
def test_other_families_are_refused_at_construction_naming_why(folder):
    model, tok = wb.load(DATA_DIR / "models" / folder)
    with pytest.raises(
        ValueError, match=r"layout='packed' runs the llama family .* this model is mlx_lm\.models\."
    ):
        wb.Scheduler(model, tok, layout="packed")


@pytest.mark.parametrize(
    "settings, name",
    [
        (
            dict(kv_bits=4, kv_group_size=32, prefill_step_size=64, max_num_batched_tokens=32),
            "kv_bits with max_num_batched_tokens=32",
        ),
        (dict(adapters={"prose": "data/adapters/prose"}, prompt_cache=8), "adapters with prefix caching"),
        (dict(prompt_cache=LRUPromptCache(4)), "prompt_cache: its prompt cache is pages"),
        (dict(prompt_cache=-1), "prompt_cache"),
    ],
)
def test_settings_the_packed_layout_does_not_take_are_refused(bundled, settings, name):
    model, tok = bundled
    with pytest.raises(ValueError, match=f"layout='packed' does not take {name}"):
        wb.Scheduler(model, tok, layout="packed", **settings)


def test_the_packed_snapshot_text_shows_the_page_table_and_the_last_forward(bundled):
    model, tok = bundled
    sched = packed(model, tok)
    submit_specs(sched, tok, SPECS[:2])
    sched.admit()
    sched.step()
    text = sched.snapshot().text()
    assert (
        "page table: " in text and "packed forward: decode 0 + prefill 16 = 16 tokens of a 16 budget" in text
    )
    assert dict(sched.snapshot().packed.held_tokens) == {0: 3, 1: 13}


def test_structured_output_rows_give_the_same_tokens_in_both_layouts(bundled):
    pytest.importorskip("llguidance", reason="structured output needs the `structured` extra (llguidance)")
    model, tok = bundled
    out = {}
    for layout in ("padded", "packed"):
        sched = wb.Scheduler(model, tok, max_batch=3, layout=layout, prefill_step_size=16)
        uids = [
            sched.submit(wb.Request(prompt="answer:", max_tokens=8, choices=["yes", "no"])),
            sched.submit(wb.Request(prompt="def f(x):", max_tokens=8)),
            sched.submit(wb.Request(prompt="n = ", max_tokens=6, regex=r"[0-9]{1,3}")),
        ]
        sched.run()
        out[layout] = [(sched.tokens(u), sched.finish_reason(u)) for u in uids]
    assert out["packed"] == out["padded"]
    assert out["packed"][0][1] == "stop"
