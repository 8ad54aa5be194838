"""Where the packed step allocates: do its writes copy the page pools, and does its attention copy
the gathered pages? Peak memory (``mx.get_peak_memory``) against the bytes a copy would take.

Usage: ``python scripts/lab/packed_copies.py`` (seconds on a CPU). Two readings:

1. A packed scheduler on tiny-llama (4 rows, pages of 16) whose pools are grown to 65,536 slots:
   the peak memory of each of four decode steps beyond what was active before, in units of one
   layer's key pool, with and without pipelining, and with one ``mx.view`` of every pool held
   (what a checkpoint holds: each write must then copy its pool). A write that copied a pool
   would show at least 1.0.
2. The decode group's attention over 4 rows of 4,096 keys (4 KV heads of 64, float16), keys and
   values gathered from a pool two ways: the rows ``[R, L, n_kv, D]`` then a swap of axes (the
   layout before this change), and one gather over the flat pool giving ``[R, n_kv, L, D]``
   row-contiguous (:func:`workbench.engine.packed.grouped.flat_indices`): peak memory in units of
   one gathered block (the keys, or the values), and whether the outputs are equal.
"""

import workbench as wb
from workbench.bench.memory import peak_growth
from workbench.engine.packed.grouped import flat_indices
from workbench.runtime.loading import DATA_DIR
from workbench.workloads.workload import prompt_of_length

import mlx.core as mx


def steps(pipeline: bool, hold_views: bool) -> list[float]:
    model, tok = wb.load(DATA_DIR / "models" / "tiny-llama")
    sched = wb.Scheduler(
        model, tok, layout="packed", max_batch=4, page_size=16, max_num_batched_tokens=64, pipeline=pipeline
    )
    for i in range(4):
        sched.submit(wb.Request(prompt=prompt_of_length(tok, 10, 7 * i), max_tokens=40, stop_ids=[]))
    sched.admit()
    sched.step()
    pools = sched.batch.pools
    pools.slots = 16 * 4096
    sched.step()
    mx.eval(pools.keys + pools.values)
    views = [mx.view(a, a.dtype) for a in pools.keys + pools.values] if hold_views else []
    layer = pools.keys[0].nbytes
    out = [peak_growth(sched.step) / layer for _ in range(4)]
    del views
    return out


for pipeline in (True, False):
    for hold in (False, True):
        grew = ", ".join(f"{g:.2f}" for g in steps(pipeline, hold))
        print(f"packed steps, pipeline={pipeline}, a view of every pool held={hold}: peak {grew} layer pools")

N, H, D, R, L = 1 << 16, 4, 64, 4, 4096
pool = mx.random.normal((N, H, D), key=mx.random.key(0)).astype(mx.float16)
q = mx.random.normal((R, 8, 1, D), key=mx.random.key(1)).astype(mx.float16)
slots = mx.random.randint(0, N, (R, L), key=mx.random.key(2)).astype(mx.int32)
flat = flat_indices(slots, H)
mx.eval(pool, q, slots, flat)
block = R * H * L * D * 2


def swapped():
    k = mx.swapaxes(pool[slots], 1, 2)
    return mx.fast.scaled_dot_product_attention(q, k, k, scale=0.125)


def flat_gather():
    k = pool.reshape(N * H, D)[flat]
    return mx.fast.scaled_dot_product_attention(q, k, k, scale=0.125)


outs = []
for name, f in (("rows then swapped axes", swapped), ("flat gather", flat_gather)):
    grew = peak_growth(lambda f=f: outs.append(f()) or mx.eval(outs[-1]))
    print(f"decode attention, {name}: peak {grew / block:.2f} gathered blocks")
print("outputs equal:", mx.array_equal(*outs).item())
