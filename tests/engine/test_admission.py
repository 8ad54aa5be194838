"""Admission: the order policies (FCFS, shortest prompt first, priority), the KV-byte
budget and preemption. Admission changes who runs when, never the tokens.

The budget covers the bytes mlx-lm's caches really hold (batch, prefilling group, prompt
cache), projected by :mod:`workbench.engine.kv.allocation` (256-token growth step, rows
padded to the widest); every projection rule is checked here against mlx-lm's own caches,
and the held bytes against MLX's measured active memory."""

import pytest

import workbench as wb
from workbench.engine.admission import FCFS, Priority, Queued, ShortestPromptFirst, policy_from
from workbench.engine.kv.ledger import alone_bytes
from workbench.engine.kv.profile import kv_profile, projected_bytes
from workbench.runtime.memory import exact_allocations, settled_active_memory
from workbench.verify import oracle

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
    per_token = (
        args.num_hidden_layers
        * 2
        * args.num_key_value_heads
        * (args.head_dim or args.hidden_size // args.num_attention_heads)
        * 4
    )
    assert projected_bytes(kv_profile(model), 128) == 128 * per_token


def test_windowed_and_ssm_layers_project_bounded_bytes():
    from workbench.runtime.loading import DATA_DIR

    gemma, _ = wb.load(DATA_DIR / "models" / "tiny-gemma3")
    prof = kv_profile(gemma)
    windowed = [lb for lb in prof if lb.window_tokens == 8]
    assert len(windowed) == 2
    assert projected_bytes(prof, 1000) - projected_bytes(prof, 999) == sum(
        lb.per_token_bytes for lb in prof if lb.window_tokens is None
    )
    mamba, _ = wb.load(DATA_DIR / "models" / "tiny-mamba2")
    assert projected_bytes(kv_profile(mamba), 10) == projected_bytes(kv_profile(mamba), 1000) > 0


def test_requests_wait_while_the_budget_is_full_and_outputs_are_unchanged(bundled, make_sched, prompt):
    # two rows of 20 + 12 tokens hold 2 x 256 positions (mlx-lm's growth step), not 2 x 32
    model, _ = bundled
    one = alone_bytes(model, 20, 12)
    assert one == 256 * projected_bytes(kv_profile(model), 1)
    sched = make_sched(max_batch=4, kv_budget_bytes=2 * one, history_size=1000)
    for i in range(4):
        sched.submit(wb.Request(prompt=prompt(20, 10 * i), max_tokens=12))
    sched.admit()
    snap = sched.snapshot()
    assert snap.uids == (0, 1) and snap.queue == (2, 3)
    assert snap.kv_projected_bytes == snap.kv_bytes == 2 * one and snap.kv_budget_bytes == 2 * one
    b = 2 * one
    assert (
        f"KV budget {b:,} bytes: {b:,} held (batch {b:,} + prefill 0 + prompt cache 0), {b:,} projected"
        in snap.text()
    )
    report = sched.run()
    assert max(s.held_bytes for s in sched.history) == 2 * one
    assert (report.requests.generated_tokens == 12).all()
    assert oracle.solo_check(model, sched).ok and sched.snapshot().kv_bytes == 0


def test_a_request_that_can_never_fit_is_rejected_at_submit(bundled, make_sched, prompt):
    one = alone_bytes(bundled[0], 30, 8)
    sched = make_sched(kv_budget_bytes=one - 1)
    with pytest.raises(
        ValueError,
        match=(
            rf"projects {one:,} KV bytes \(prompt 30 \+ max_tokens 8 tokens, as mlx-lm's "
            rf".*kv_budget_bytes is {one - 1:,}, so {one - 1:,} bytes are available"
        ),
    ):
        sched.submit(wb.Request(prompt=prompt(30, 0), max_tokens=8))
    assert sched.idle and sched.events == []
    make_sched(kv_budget_bytes=one).submit(wb.Request(prompt=prompt(30, 0), max_tokens=8))


def test_a_preempted_row_resumes_and_its_greedy_output_equals_an_uninterrupted_run(
    bundled, make_sched, prompt
):
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
    one = alone_bytes(model, 10, 16)  # what one such row holds: 256 positions
    sched = make_sched(max_batch=4, kv_budget_bytes=2 * one, policy="priority")
    lows = [
        sched.submit(wb.Request(prompt=prompt(10, 7 * i), max_tokens=16, priority=p))
        for i, p in enumerate((0, 1))
    ]
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


# -- the projection, rule by rule, against mlx-lm's own caches --------------------------


def _feed(cache, tokens, chunk):
    """Write ``tokens`` positions into mlx-lm cache ``cache`` in chunks, as a forward does."""
    import mlx.core as mx

    done = 0
    while done < tokens:
        S = min(chunk, tokens - done)
        k = mx.zeros((cache.left_padding.shape[0] if hasattr(cache, "left_padding") else 1, 2, S, 8))
        cache.update_and_fetch(k, k)
        mx.eval(cache.keys)
        done += S


def test_the_growth_step_is_mlx_lms():
    from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache, RotatingKVCache

    from workbench.engine.kv.allocation import STEP_TOKENS

    assert (
        STEP_TOKENS
        == KVCache.step
        == BatchKVCache.step
        == RotatingKVCache.step
        == BatchRotatingKVCache.step
        == 256
    )


@pytest.mark.parametrize("input_tokens", [1, 2, 20, 256, 257, 258, 300, 513, 1000])
@pytest.mark.parametrize("chunk", [3, 64, 300, 384, 2048])
def test_a_groups_capacity_is_what_mlx_lms_batch_cache_allocates(input_tokens, chunk):
    """Prefill all but the last input token in chunks, then the join token, into a real
    BatchKVCache of 2 rows: its capacity is the exact projection, and the bound (pacing,
    prompt cache, per-row prefill) is never below it."""
    from mlx_lm.models.cache import BatchKVCache

    from workbench.engine.kv.allocation import group_capacity_tokens

    cache = BatchKVCache([0, 0])
    _feed(cache, input_tokens - 1, chunk)
    prefilled = 0 if cache.keys is None else cache.keys.shape[2]
    _feed(cache, 1, 1)
    assert group_capacity_tokens(input_tokens, chunk, exact=True) == (prefilled, cache.keys.shape[2])
    bound = group_capacity_tokens(input_tokens, chunk, exact=False)
    assert bound[0] >= prefilled and bound[1] >= cache.keys.shape[2]


@pytest.mark.parametrize(
    "start,final", [(20, 28), (200, 256), (200, 257), (255, 300), (256, 520), (300, 1000)]
)
def test_decode_growth_is_what_mlx_lms_batch_cache_allocates(start, final):
    """A batch cache holding ``start`` positions fed one token at a time up to ``final``."""
    from mlx_lm.models.cache import BatchKVCache

    from workbench.engine.kv.allocation import full_capacity_tokens

    cache = BatchKVCache([0, 0])
    _feed(cache, start, 2048)
    capacity = cache.keys.shape[2]
    _feed(cache, final - start, 1)
    assert full_capacity_tokens(capacity, final) == cache.keys.shape[2]


# -- the examples: the bytes held never exceed the budget -----------------------


def _run(model, tok, specs, budget, **options):
    """Submit ``(prompt tokens, max_tokens)`` requests, run to idle; ``(scheduler, report)``."""
    from workbench.workloads.workload import prompt_of_length

    sched = wb.Scheduler(model, tok, kv_budget_bytes=budget, history_size=10_000, **options)
    for i, (n, m) in enumerate(specs):
        sched.submit(wb.Request(prompt=prompt_of_length(tok, n, 37 * i), max_tokens=m, stop_ids=[]))
    return sched, sched.run()


def _held_peak(sched):
    return max(s.held_bytes for s in sched.history)


def test_four_20_token_rows_hold_what_the_projection_says(random_llama):
    """Issue 14: four 20-token rows, max_tokens=8, on tiny-llama held 2,097,152 bytes
    against a 229,376-byte budget (the per-request sum)."""
    model, tok = random_llama
    specs = [(20, 8)] * 4
    per_request_sum = sum(projected_bytes(kv_profile(model), n + m) for n, m in specs)
    assert per_request_sum == 229_376
    with pytest.raises(ValueError, match="projects 524,288 KV bytes .* 229,376 bytes are available"):
        _run(model, tok, specs, per_request_sum)
    sched, report = _run(model, tok, specs, 2_097_152, max_batch=4)
    assert _held_peak(sched) == 2_097_152 == max(s.kv_projected_bytes for s in sched.history)
    assert max(s.batch_size for s in sched.history) == 4
    sched, report = _run(model, tok, specs, 2_097_151, max_batch=4)
    assert _held_peak(sched) <= 2_097_151 and max(s.batch_size for s in sched.history) == 3
    assert (report.requests.generated_tokens == 8).all()
    assert oracle.solo_check(model, sched).ok


def test_a_long_row_beside_short_rows_pads_them_and_the_budget_holds(random_llama):
    """Issue 14: one 1,000-token row beside seven 3-token rows (7.6x over the per-request
    sum): every short row is padded to the long one's width, so fewer run beside it."""
    model, tok = random_llama
    specs = [(1000, 4)] + [(3, 4)] * 7
    budget = 2 * alone_bytes(model, 1000, 4)
    sched, report = _run(model, tok, specs, budget, max_batch=8)
    assert _held_peak(sched) <= budget
    beside_long = [s.batch_size for s in sched.history if 0 in s.uids]
    assert max(beside_long) == 2  # the long row and one padded short row
    assert (report.requests.generated_tokens == 4).all() and sched.idle


def test_a_sliding_window_model_stays_within_its_budget():
    """Issue 14: tiny-gemma3 (window layers of 8 tokens) held 5.6-7.3x its budget."""
    from workbench.runtime.loading import DATA_DIR

    model, tok = wb.load(DATA_DIR / "models" / "tiny-gemma3")
    specs = [(20, 8), (40, 6), (9, 12), (60, 3), (15, 8), (33, 5)]
    budget = 2 * alone_bytes(model, 60, 12)
    sched, report = _run(model, tok, specs, budget, max_batch=4, prefill_step_size=16)
    assert _held_peak(sched) <= budget < sum(projected_bytes(kv_profile(model), n + m) for n, m in specs) * 8
    assert sched.idle and len(report.requests) == len(specs)


def test_the_prompt_cache_shares_the_ceiling_with_the_live_batch(random_llama):
    """Issue 14: a 200,000-byte budget beside a 409,600-byte prompt cache. The prompt
    cache is trimmed to budget - projected live bytes; it still serves a hit when there is
    room."""
    model, tok = random_llama
    budget = 3 * alone_bytes(model, 40, 6)
    specs = [(40, 6), (30, 6), (35, 6), (25, 6), (40, 6), (38, 6)]
    sched, report = _run(model, tok, specs, budget, max_batch=3, prompt_cache=16)
    assert max(s.prompt_cache_bytes for s in sched.history) > 0
    assert _held_peak(sched) <= budget
    assert all(s.held_bytes <= budget for s in sched.history)
    from workbench.workloads.workload import prompt_of_length

    sched.submit(wb.Request(prompt=prompt_of_length(tok, 25, 37 * 3) + [5, 6], max_tokens=2, stop_ids=[]))
    sched.run()
    assert report.requests.generated_tokens.sum() == 36
    assert sched.events[-1].kind == "evict" and any(
        e.kind == "admit" and e.n_cached > 0 for e in sched.events[-12:]
    )
    assert all(s.held_bytes <= budget for s in sched.history)


def test_queued_requests_drain_in_order_when_only_one_row_fits(random_llama):
    model, tok = random_llama
    specs = [(20, 3), (200, 5), (5, 9), (250, 6), (1, 4), (60, 2)]
    budget = max(alone_bytes(model, n, m) for n, m in specs)
    sched, report = _run(model, tok, specs, budget, max_batch=4)
    joins = report.events[report.events.kind == "join"].uid.tolist()
    assert joins == list(range(len(specs))) and max(s.batch_size for s in sched.history) == 1
    assert _held_peak(sched) <= budget and sched.idle


def test_the_projection_bounds_the_bytes_held_at_every_snapshot(random_llama):
    model, tok = random_llama
    specs = [(3, 12), (60, 9), (17, 14), (1, 5), (33, 10), (250, 8), (9, 3)]
    for options in (
        dict(reuse_slots=True),
        dict(reuse_slots=False),
        dict(prefill_step_size=16),
        dict(prompt_cache=4),
    ):
        sched, _ = _run(model, tok, specs, None, max_batch=3, **options)
        assert all(s.kv_bytes + s.prefill_kv_bytes <= s.kv_projected_bytes for s in sched.history), options


# -- the computed bytes against MLX's measured memory -----------------------------------


def _cache_arrays(sched):
    """Every array reachable from the batch's caches, the prefilling groups and the prompt
    cache (views counted as arrays of their own)."""
    import mlx.core as mx
    import mlx.nn as nn

    st, seen, arrays = sched.state, set(), []
    stack = [st.batch.caches, st.prefilling, st.prompt_cache]
    while stack:
        o = stack.pop()
        if o is None or id(o) in seen or isinstance(o, (nn.Module, type, str, bytes, int, float)):
            continue
        seen.add(id(o))
        if isinstance(o, mx.array):
            arrays.append(o)
        elif isinstance(o, dict):
            stack += list(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)) or type(o).__name__ == "deque":
            stack += list(o)
        elif hasattr(o, "__dict__"):
            stack += list(vars(o).values())
    return arrays


def _released_bytes(sched):
    """Independent measurement: MLX's active memory freed when the engine's caches (batch,
    prefilling group, prompt cache) are dropped. Every cache array is evaluated first (an
    array still lazy holds its graph's inputs, freed with it), and both readings taken on
    an idle device (:func:`settled_active_memory`)."""
    import mlx.core as mx

    st = sched.state
    if st.batch.pending is not None:
        mx.eval(st.batch.pending.tokens)
    mx.eval(_cache_arrays(sched))
    before = settled_active_memory()
    st.batch.caches = st.prefilling = st.prompt_cache = None
    return before - settled_active_memory()


def _allocator_rounding(sched):
    """What the device's allocator adds to the caches' arrays (0 on the CPU; on CUDA each
    buffer takes whole 16 KiB pages or a power of two): ``allocation_bytes - nbytes`` over
    :func:`_cache_arrays` (views counted as buffers: an upper bound)."""
    from workbench.runtime.memory import allocation_bytes

    return sum(allocation_bytes(a.nbytes) - a.nbytes for a in _cache_arrays(sched))


@pytest.mark.parametrize("reuse", [True, False])
def test_held_bytes_are_the_memory_the_caches_really_take(random_llama, reuse):
    """After every call of a run with evictions that trim shared padding, joins into free
    slots, a chunked per-row prefill and a prompt cache: the snapshot's held bytes are what
    dropping the caches frees (within the small per-row index arrays: offsets, paddings, and
    on CUDA the allocator's rounding of each buffer, ``workbench.runtime.memory.allocation_bytes``).

    *Held* is what the caches' arrays hold (their ``nbytes``: what mlx-lm allocates and the
    KV budget counts); *released* is what the device gets back, MLX's active memory before
    minus after dropping them. On the CPU they are equal but for the index arrays; on CUDA
    each buffer takes whole 16 KiB pages (or a power of two, or 8 bytes), so released =
    held + that rounding. Two CUDA effects would make released larger still and are kept
    out: the buffer cache (a reused buffer counts at its own, larger size: the run is made
    with the cache off, :func:`exact_allocations`) and temporaries freed when a stream
    completes (both readings on an idle device, :func:`settled_active_memory`)."""
    model, tok = random_llama
    specs = [(250, 3), (5, 12), (5, 7), (40, 2), (9, 9), (120, 4)]
    with exact_allocations():
        _held_equals_released(model, tok, specs, reuse)


def _held_equals_released(model, tok, specs, reuse):
    from workbench.workloads.workload import prompt_of_length

    for k in range(1, 13):
        sched = wb.Scheduler(
            model, tok, max_batch=3, history_size=0, reuse_slots=reuse, prefill_step_size=64, prompt_cache=4
        )
        for i, (n, m) in enumerate(specs):
            sched.submit(wb.Request(prompt=prompt_of_length(tok, n, 10 * i), max_tokens=m, stop_ids=[]))
        for j in range(k):
            [sched.admit, sched.step, sched.filter][j % 3]()
        held = sched.snapshot().held_bytes
        rounding = _allocator_rounding(sched)
        released = _released_bytes(sched)
        assert held <= released <= held + rounding + 32 * 1024, (k, held, released, rounding)


def test_snapshots_report_measured_memory_that_tracks_the_computed_bytes(random_llama):
    """A row crossing 256 tokens makes mlx-lm allocate 256 more positions per row: the
    measured active memory grows by the computed kv_bytes change.

    Device-true readings: the scenario runs once unmeasured first (on CUDA a new shape's
    first kernels may allocate workspaces that stay: they are not the KV cache's), then
    again with MLX's buffer cache off (:func:`exact_allocations`: each new buffer at its
    own size, never a larger cached one) and each snapshot taken on an idle device
    (:func:`settled_active_memory`: no temporaries of a finished forward still counted).
    The cache's buffers here are whole 16 KiB pages, so CUDA's rounding adds nothing."""
    from workbench.workloads.workload import prompt_of_length

    model, tok = random_llama

    def crossing():
        sched = wb.Scheduler(
            model, tok, max_batch=2, history_size=100, pipeline=False
        )  # no forward in flight
        for i in range(2):
            sched.submit(wb.Request(prompt=prompt_of_length(tok, 250, 40 * i), max_tokens=12, stop_ids=[]))
        sched.admit()
        settled_active_memory()
        before = sched.snapshot()
        while sched.snapshot().kv_bytes == before.kv_bytes:
            sched.step()
        settled_active_memory()
        return before, sched.snapshot()

    crossing()
    with exact_allocations():
        before, after = crossing()
    grown = after.kv_bytes - before.kv_bytes
    assert grown == 2 * 256 * sum(lb.per_token_bytes for lb in kv_profile(model))
    assert abs((after.active_memory_bytes - before.active_memory_bytes) - grown) <= 64 * 1024
    assert after.peak_memory_bytes >= after.active_memory_bytes >= after.kv_bytes > 0


def test_steps_without_filter_do_not_grow_finished_rows_past_the_budget(random_llama):
    """A 250 + 6-token row fills its 256 positions when it finishes; fed again (step()
    without filter()) it would take 512. Under a budget such a step does nothing."""
    from workbench.workloads.workload import prompt_of_length

    model, tok = random_llama
    budget = alone_bytes(model, 250, 6)
    sched = wb.Scheduler(model, tok, kv_budget_bytes=budget, history_size=0)
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 250, 0), max_tokens=6, stop_ids=[]))
    sched.admit()
    for _ in range(6):
        sched.step()
    assert sched.snapshot().finished == (True,) and sched.snapshot().context_tokens == (256,)
    assert sched.step() == [] and sched.step_index == 6
    assert sched.snapshot().kv_bytes == budget and sched.check().ok
    sched.filter()
    assert sched.idle


def test_the_projection_on_hand_built_batches():
    """KVPlan on a model of 2,048 bytes per position (tiny-llama's 4 layers x 512)."""
    from workbench.engine.kv.allocation import Allocation, KVPlan, RowTokens

    plan = KVPlan(full_token_bytes=2048, rings=(), fixed_bytes=0, chunk_tokens=2048)
    four = [RowTokens(u, 20, 28) for u in range(4)]
    assert plan.projected_bytes(four) == 4 * 256 * 2048 == 2_097_152  # one chunk of 19, the join fits in 256
    assert plan.projected_bytes([RowTokens(0, 1000, 1008)]) == 1024 * 2048  # 999 -> 1024, the join fits
    # a running row of 250 tokens (capacity 256) that will reach 262, and a 3-token joiner
    running = KVPlan(
        2048,
        (),
        0,
        2048,
        reuse_slots=False,
        now=Allocation(1, 250, 256, 256 * 2048),
        rows=(RowTokens(7, 250, 262),),
    )
    assert running.projected_bytes() == 512 * 2048  # grows by 256 when the width reaches 256
    assert running.projected_bytes([RowTokens(8, 3, 10)]) == max(512 * 2048 + 256 * 2048, 2 * 512 * 2048)
    assert (
        running.projected_bytes([RowTokens(8, 3, 10)], dropped=[7]) == 256 * 2048
    )  # preempted: the joiner alone
    # a free slot (2 cache rows, 1 running) holds its bytes until the next admit/step
    slot = KVPlan(
        2048,
        (),
        0,
        2048,
        reuse_slots=False,
        now=Allocation(2, 30, 256, 2 * 256 * 2048),
        rows=(RowTokens(7, 30, 40),),
    )
    assert slot.projected_bytes() == 2 * 256 * 2048
    # ... beside a group already prefilling (filter() or preempt() during its prefill)
    assert slot.projected_bytes([RowTokens(9, 20, 28)]) == 2 * 256 * 2048
    assert slot.projected_bytes([RowTokens(9, 20, 28)], started=True) == 3 * 256 * 2048
    # a ring holds its window once decoding, but a whole prefill chunk while prefilling
    # (mlx-lm's _update_concat: 19 positions of an 8-token window); SSM layers a fixed state
    mixed = KVPlan(512, ((8, 256),), 5632, 2048)
    assert mixed.projected_bytes([RowTokens(0, 20, 28)]) == 256 * 512 + 19 * 256 + 5632
    assert mixed.projected_bytes([RowTokens(0, 2, 28)]) == 256 * 512 + 8 * 256 + 5632


@pytest.mark.parametrize("input_tokens", [1, 2, 5, 9, 20, 300])
@pytest.mark.parametrize("chunk", [3, 16, 2048])
def test_a_rings_bytes_stay_within_the_projection(input_tokens, chunk):
    """A BatchRotatingKVCache of window 8 (tiny-gemma3's) prefilled in chunks, then the
    join token and decode steps: every capacity it reaches is within the projection (one
    byte per position, one row)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchRotatingKVCache

    from workbench.engine.kv.allocation import KVPlan, RowTokens

    plan = KVPlan(full_token_bytes=0, rings=((8, 1),), fixed_bytes=0, chunk_tokens=chunk)
    projected = plan.projected_bytes([RowTokens(0, input_tokens, input_tokens + 12)])
    cache, seen = BatchRotatingKVCache(8, [0]), []
    done = 0
    while done < input_tokens - 1:
        S = min(chunk, input_tokens - 1 - done)
        cache.update_and_fetch(mx.zeros((1, 2, S, 8)), mx.zeros((1, 2, S, 8)))
        mx.eval(cache.keys)
        seen.append(cache.keys.shape[2])
        done += S
    for _ in range(13):  # the join token, then decode steps
        cache.update_and_fetch(mx.zeros((1, 2, 1, 8)), mx.zeros((1, 2, 1, 8)))
        mx.eval(cache.keys)
        seen.append(cache.keys.shape[2])
    assert max(seen) <= projected and seen[-1] == min(8, input_tokens + 12)


def test_a_free_slot_beside_a_prefilling_group_is_projected(random_llama):
    """filter() while a group prefills leaves the evicted row's cache row beside the group
    until the next admit()/step(): the projection counts both (the fuzzer found it)."""
    from workbench.workloads.workload import prompt_of_length

    model, tok = random_llama
    sched = wb.Scheduler(model, tok, max_batch=3, prefill_step_size=3, history_size=0, kv_budget_bytes=10**8)
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 3, 0), max_tokens=1, stop_ids=[]))  # one chunk
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 3, 9), max_tokens=9, stop_ids=[]))
    sched.admit()
    sched.step()  # the first row reads its only token and finishes
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 60, 50), max_tokens=4, stop_ids=[]))
    sched.admit()  # the second row starts prefilling, 3 tokens a call
    sched.filter()  # the first row leaves: its cache row stays as a free slot
    snap = sched.snapshot()
    assert snap.free_slots == 1 and snap.prefilling and snap.prefill_kv_bytes > 0
    assert snap.kv_bytes + snap.prefill_kv_bytes <= snap.kv_projected_bytes
