"""The packed step's cost in memory and time: its writes go into the page pools in place (a
step's peak memory stays far below one layer's pool, so no write copied a pool), its
attention reads the gathered pages without copying them again, the next forward is built
from the unread tokens (pipelined) with every row still equal to its run alone, and on a
cost clock each packed forward is charged what the cost model says it costs."""

import mlx.core as mx
import numpy as np
import pytest

import workbench as wb
from workbench.bench.memory import peak_growth
from workbench.engine.levers.cost import CostModel
from workbench.engine.packed.attention import Pools
from workbench.engine.packed.grouped import grouped_attention, groups_of
from workbench.engine.packed.pages import PageTable
from workbench.observe.packed import Chunk
from workbench.sim.clocks import VirtualClock
from workbench.sim.costmodel import CostedModel
from workbench.verify import oracle
from workbench.workloads.workload import prompt_of_length

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("solo_references_once")]

SPECS = ((10, 30), (3, 9), (25, 20), (7, 30))  # (prompt tokens, max_tokens)


def packed(model, tok, **settings):
    sched = wb.Scheduler(
        model,
        tok,
        **({"layout": "packed", "max_batch": 4, "page_size": 16, "max_num_batched_tokens": 64} | settings),
    )
    uids = [
        sched.submit(wb.Request(prompt=prompt_of_length(tok, n, 9 * i), max_tokens=m, stop_ids=[]))
        for i, (n, m) in enumerate(SPECS)
    ]
    return sched, uids


@pytest.mark.parametrize("pipeline", [True, False])
def test_a_packed_step_writes_the_page_pools_in_place(bundled, pipeline):
    model, tok = bundled
    sched, _ = packed(model, tok, pipeline=pipeline)
    sched.admit()
    sched.step()
    sched.step()
    pools = sched.batch.pools
    pools.slots = 16 * 4096  # every pool grows at the next write (one copy, that step)
    sched.step()
    mx.eval(pools.keys + pools.values)
    layer_pool = pools.keys[0].nbytes  # one layer's keys: 65,536 slots
    for _ in range(4):  # decode steps: 4 rows, 16 layers, keys and values written
        grew = peak_growth(sched.step)
        assert grew < layer_pool / 4, f"a step allocated {grew} bytes, one layer's pool is {layer_pool}"
    assert pools.keys[0].nbytes == layer_pool


def test_a_rolled_back_step_leaves_the_pools_written_in_place_after(bundled):
    model, tok = bundled
    armed = []

    def once(uid, token):  # a Ctrl-C inside the step, after its forward was launched
        if armed and armed.pop():
            raise KeyboardInterrupt

    sched = wb.Scheduler(model, tok, layout="packed", max_batch=2, page_size=16, max_num_batched_tokens=64)
    uids = [
        sched.submit(
            wb.Request(prompt=prompt_of_length(tok, 10, 0), max_tokens=20, stop_ids=[], on_token=once)
        ),
        sched.submit(wb.Request(prompt=prompt_of_length(tok, 5, 30), max_tokens=20, stop_ids=[])),
    ]
    sched.admit()
    sched.step()
    sched.batch.pools.slots = 16 * 4096
    sched.step()
    layer_pool = sched.batch.pools.keys[0].nbytes
    armed.append(True)
    with pytest.raises(KeyboardInterrupt):
        sched.step()
    assert sched.check().ok
    sched.step()  # the interrupted step again, then steps that write in place as before
    assert peak_growth(sched.step) < layer_pool / 4
    sched.run()
    check = oracle.solo_check(model, sched, uids, atol=1e-4)
    assert check.ok, check.text()


def test_the_decode_attention_reads_the_gathered_pages_without_copying_them():
    H, D, L, R = 4, 64, 4096, 4
    table = PageTable(16)
    chunks = []
    for uid in range(R):
        table.reserve(uid, L)
        chunks.append(Chunk(uid, L - 1, 1, "decode"))
    groups = groups_of(table, chunks)
    n = table.capacity * 16
    keys, values = (mx.random.normal((n, H, D), key=mx.random.key(i)).astype(mx.float16) for i in (1, 2))
    queries = mx.random.normal((1, 8, R, D), key=mx.random.key(3)).astype(mx.float16)
    mx.eval(keys, values, queries)
    block = R * H * L * D * 2  # one gathered [R, H, L, D] block of keys (or values)
    out = []
    grew = peak_growth(lambda: out.append(mx.eval(grouped_attention(queries, keys, values, groups, 0.125))))
    assert grew < 2.5 * block, f"attention allocated {grew / block:.2f} blocks (keys and values gathered: 2)"


def test_pipelined_steps_launch_the_next_forward_and_give_every_row_its_solo_tokens(bundled):
    model, tok = bundled
    runs = {}
    for pipeline in (True, False):
        sched, uids = packed(model, tok, pipeline=pipeline)
        launched = 0
        while not sched.idle:
            sched.admit()
            sched.step()
            launched += sched.batch.launched is not None
            sched.filter()
            assert sched.check().ok
        runs[pipeline] = [sched.tokens(u) for u in uids]
        assert (launched > 0) == pipeline
        check = oracle.solo_check(model, sched, uids, atol=1e-4)
        assert check.ok, check.text()
    assert runs[True] == runs[False]


def test_a_joiner_admitted_while_a_forward_is_in_flight_joins_the_next_one(bundled):
    model, tok = bundled
    sched, uids = packed(model, tok, max_batch=4)
    sched.admit()
    for _ in range(4):
        sched.step()
    assert sched.batch.launched is not None
    late = sched.submit(wb.Request(prompt=prompt_of_length(tok, 12, 77), max_tokens=6, stop_ids=[]))
    sched.abort(uids[1])
    sched.filter()
    sched.run()
    assert len(sched.tokens(late)) == 6 and sched.finish_reason(uids[1]) in ("abort", "length")
    done = [u for u in uids + [late] if sched.finish_reason(u) == "length"]
    check = oracle.solo_check(model, sched, done, atol=1e-4)
    assert check.ok, check.text()


def test_packed_s_is_one_forwards_fixed_cost_plus_each_tokens_own():
    cost = CostModel(2.0, 0.5, 0.01, 3.0, 0.25, 0.001)  # p_chunk, p_token, p_pair, d_step, d_row, d_kv
    assert cost.packed_s([]) == 0.0
    assert cost.packed_s([10, 30]) == pytest.approx(3.0 + 2 * 0.25 + 40 * 0.001)
    assert cost.packed_s([], [(4, 6)]) == pytest.approx(2.0 + 4 * 0.5 + 0.01 * (4 * 6 + 10))
    assert cost.packed_s([10], [(4, 6)]) == pytest.approx(3.0 + 0.25 + 0.01 + 4 * 0.5 + 0.01 * 34)


def test_on_a_cost_clock_each_packed_forward_advances_the_clock_by_its_cost(bundled):
    model, tok = bundled
    cost = CostModel(0.002, 0.0001, 1e-6, 0.004, 0.0003, 1e-6)
    clock = VirtualClock()
    costed = CostedModel(model, clock, cost)
    sched = wb.Scheduler(
        costed,
        tok,
        layout="packed",
        max_batch=3,
        page_size=4,
        max_num_batched_tokens=12,
        clock=clock,
        pipeline=False,
    )
    for i, (n, m) in enumerate(SPECS[:3]):
        sched.submit(wb.Request(prompt=prompt_of_length(tok, n, 5 * i), max_tokens=m, stop_ids=[]))
    charged = 0
    while not sched.idle:
        sched.admit()
        before, steps = clock(), sched.step_index
        with costed.charging():
            sched.step()
        if sched.step_index == steps:  # no forward ran
            assert clock() == before
            sched.filter()
            continue
        chunks = sched.snapshot().packed.last_chunks
        decode = [c.end for c in chunks if c.kind == "decode"]
        prefill = [(c.n_tokens, c.start) for c in chunks if c.kind != "decode"]
        assert clock() - before == pytest.approx(cost.packed_s(decode, prefill))
        charged += bool(chunks)
        sched.filter()
    assert charged > 5 and clock() > 0


def test_pipelined_submit_n_samples_equal_their_unpipelined_runs(bundled):
    model, tok = bundled
    req = wb.Request(prompt=prompt_of_length(tok, 22, 0), max_tokens=8, temperature=0.8, seed=5, stop_ids=[])
    runs = {}
    for pipeline in (True, False):
        sched = wb.Scheduler(
            model,
            tok,
            layout="packed",
            max_batch=4,
            page_size=4,
            max_num_batched_tokens=10,
            pipeline=pipeline,
        )
        uids = sched.submit_n(req, 3)
        sched.run()
        assert sched.check().ok and sched.snapshot().packed.used_pages == 0
        runs[pipeline] = [(sched.tokens(u), sched.logprobs(u)) for u in uids]
    assert [t for t, _ in runs[True]] == [t for t, _ in runs[False]]
    assert all(
        max(abs(a - b) for a, b in zip(x, y)) < 1e-5 for (_, x), (_, y) in zip(runs[True], runs[False])
    )


def test_copy_on_write_copies_the_pages_not_the_pools():
    pools = Pools(2)
    pools.slots = 1 << 18
    for layer in range(2):
        pools.fit(layer, mx.zeros((1, 4, 64), mx.float16))
    pools.keys[0][mx.arange(16, 48)] = mx.random.normal((32, 4, 64), key=mx.random.key(0)).astype(mx.float16)
    mx.eval(pools.keys + pools.values)
    source = np.array(pools.keys[0][16:48])  # a copy: a view would hold the pool
    layer_pool = pools.keys[0].nbytes
    for i in range(3):  # a gather in flight when the write is dispatched made it copy the pool
        grew = peak_growth(
            lambda i=i: (pools.copy_pages([(1, 7 + i), (2, 20 + i)], 16), mx.eval(pools.keys + pools.values))
        )
        assert grew < layer_pool / 4, f"copy-on-write allocated {grew / layer_pool:.2f} layer pools"
        assert (np.array(pools.keys[0][(7 + i) * 16 : (8 + i) * 16]) == source[:16]).all()
        assert (np.array(pools.keys[0][(20 + i) * 16 : (21 + i) * 16]) == source[16:]).all()


# What a row preempted while the launched forward still carries it meets before its
# forward's tokens are read: each script runs after four iterations, uid 0 keeping the
# forward, uid 1 the preempted row (``cp``: a checkpoint taken there, ``fork``: the calls
# after it run on a fork). ``run()`` admits the preempted row again before its first step.
STALE_FORWARD_SCRIPTS = {
    "preempt, run": ["preempt 1", "run"],
    "preempt, admit, step, run": ["preempt 1", "admit", "step", "step", "run"],
    "preempt, admit, abort the other": ["preempt 1", "admit", "abort 0", "filter", "run"],
    "preempt, admit, abort it": ["preempt 1", "admit", "abort 1", "run"],
    "preempt both, admit one, run": ["preempt 1", "admit", "preempt 0", "run"],
    "preempt, admit, restore, preempt, run": [
        "cp",
        "preempt 1",
        "admit",
        "step",
        "restore",
        "preempt 1",
        "run",
    ],
    "fork, preempt, run": ["fork", "preempt 1", "run"],
}


@pytest.mark.parametrize("script", list(STALE_FORWARD_SCRIPTS))
@pytest.mark.parametrize("layout", ["packed", "packed-prefix", "padded"])
def test_a_row_preempted_and_admitted_again_while_its_forward_is_in_flight_equals_its_run_alone(
    bundled, layout, script
):
    """The pipelined forward in flight at a preemption carries the preempted row; its token
    is never credited to the row's next admission (which prefills its prompt and tokens
    again), whatever the order of preempt, admit, abort, restore and fork (issue 42)."""
    model, tok = bundled
    settings = {"padded": {}, "packed": dict(layout="packed", page_size=4, max_num_batched_tokens=32)}
    sched = wb.Scheduler(
        model,
        tok,
        max_batch=2,
        pipeline=True,
        **settings["packed" if layout.startswith("packed") else layout],
        **({"prompt_cache": 16} if layout == "packed-prefix" else {}),
    )
    uids = [
        sched.submit(wb.Request(prompt=prompt_of_length(tok, n, start), max_tokens=12, stop_ids=[]))
        for n, start in ((9, 0), (14, 50))
    ]
    for _ in range(4):
        sched.admit()
        sched.step()
        sched.filter()
    in_flight = sched.batch.launched if layout.startswith("packed") else sched.batch.pending
    assert in_flight is not None and sched.status(uids[1]) is wb.Status.RUNNING
    saved = None
    for call in STALE_FORWARD_SCRIPTS[script]:
        name, *uid = call.split()
        if name == "cp":
            saved = sched.checkpoint()
        elif name == "restore":
            sched.restore(saved)
        elif name == "fork":
            sched = sched.fork()
        else:
            getattr(sched, name)(*(uids[int(u)] for u in uid))
        report = sched.check()
        assert report.ok, f"after {call}: {report}"
    done = [u for u in uids if sched.finish_reason(u) == "length"]
    assert len(done) == len(uids) - script.count("abort")
    check = oracle.solo_check(model, sched, done, atol=1e-4)
    assert check.ok, check.text()


def test_the_integrity_check_names_a_running_row_whose_pages_miss_its_context(bundled):
    model, tok = bundled
    sched, uids = packed(model, tok, max_batch=2)
    for _ in range(6):
        sched.admit()
        sched.step()
    assert sched.check().ok and sched.status(uids[1]) is wb.Status.RUNNING
    sched.batch.held[1] = 1  # what a stale token credited to a new admission left: no context
    report = sched.check()
    assert not report.ok
    assert f"uid {uids[1]} runs with 1 of its" in str(report), str(report)
