"""The batch-invariant mode's batched prefill (``levers/invariant_prefill.py``): a group of
prompts prefills in fewer forwards than prompts (each forward runs every prompt's next chunk),
and every row's tokens and log-probs stay ``==`` its run alone, at once and staggered, with
the reference BLAS (this process) and with OpenBLAS (a subprocess)."""

import sys
import textwrap

import mlx.core as mx
import pytest

import workbench as wb
from tests.engine.test_invariant import variant
from tests.engine.test_invariant_blocks import _in_a_process_with_openblas
from workbench.engine.levers import invariant, invariant_prefill
from workbench.engine.runner import ModelRunner
from workbench.verify import invariance
from workbench.workloads.workload import prompt_of_length

pytestmark = pytest.mark.model

CHUNK = 8
# prompt tokens: tails (all but the last token) of 0, 1, 2, 7, 8, 9, 13, 19 and 26 tokens:
# empty, one-token, shorter than a chunk, exactly one, one and a bit, several chunks
LENGTHS = (1, 2, 3, 8, 9, 10, 14, 20, 27)


def _requests(tok):
    reqs = [wb.Request(prompt=prompt_of_length(tok, n, 13 * n + 1), max_tokens=6) for n in LENGTHS]
    reqs.append(wb.Request(prompt=prompt_of_length(tok, 12, 5), max_tokens=6, temperature=0.8, seed=3))
    return reqs


def _chunks(req):
    return -(-(len(req.prompt) - 1) // CHUNK)  # the tail's chunks of CHUNK tokens, rounded up


def count_prefill_forwards(monkeypatch, model):
    """A list whose first item counts the model forwards run inside ``ModelRunner.run_chunk``
    (the prefill's), from now until the test ends."""
    count, inside = [0], [False]
    call, chunk = type(model).__call__, ModelRunner.run_chunk

    def counting_call(self, *a, **k):
        count[0] += inside[0]
        return call(self, *a, **k)

    def counting_chunk(self, *a, **k):
        inside[0] = True
        try:
            return chunk(self, *a, **k)
        finally:
            inside[0] = False

    monkeypatch.setattr(type(model), "__call__", counting_call)
    monkeypatch.setattr(ModelRunner, "run_chunk", counting_chunk)
    return count


@pytest.mark.parametrize("family", ["llama-trained", "qwen3", "llama-bf16", "llama-4bit"])
def test_a_group_prefills_in_fewer_forwards_than_prompts_with_every_row_bit_equal_alone(monkeypatch, family):
    model, tok = variant(family)
    reqs = _requests(tok)
    solo = [invariance.alone(model, tok, r, CHUNK) for r in reqs]
    count = count_prefill_forwards(monkeypatch, model)
    sched = wb.Scheduler(model, tok, max_batch=len(reqs), prefill_step_size=CHUNK, batch_invariant=True)
    uids = [sched.submit(r) for r in reqs]
    sched.run()
    # one group: each forward runs every prompt's next chunk, so as many forwards as the longest tail's chunks
    assert count[0] == max(map(_chunks, reqs)) == 4, count[0]
    got = [(sched.tokens(u), sched.logprobs(u)) for u in uids]
    assert [i for i, (a, b) in enumerate(zip(got, solo)) if a != b] == []

    count[0] = 0  # staggered: groups of 1-3 joining a running batch, 3 rows every 2 steps
    sched = wb.Scheduler(model, tok, max_batch=4, prefill_step_size=CHUNK, batch_invariant=True)
    sched.run(arrivals=[(i // 3 * 2, r) for i, r in enumerate(reqs)])
    got = [(sched.tokens(u), sched.logprobs(u)) for u in sorted(sched.requests)]
    assert [i for i, (a, b) in enumerate(zip(got, solo)) if a != b] == []
    assert count[0] < sum(map(_chunks, reqs)), count[0]  # the prompts' chunks, each alone


def _prefill(model, inv, prompts):
    group = invariant_prefill.BatchedReplayPrefillGroup(
        model, prompts, CHUNK, None, None, [0] * len(prompts), [0] * len(prompts), inv
    )
    while not group.done:
        group.run_chunk(3)  # the chunk asked for is ignored: the schedule is fixed
    return group


def _assert_rows_equal_alone(model, inv, tails):
    together = _prefill(model, inv, tails)
    assert together.forwards == max(_chunks(wb.Request(prompt=t + [0])) for t in tails)
    assert together.rows_done_tokens == [len(t) for t in tails]
    for b, t in enumerate(tails):
        if not t:
            continue
        alone = _prefill(model, inv, [t])
        assert alone.forwards == _chunks(wb.Request(prompt=t + [0]))
        for mine, its in zip(together.caches, alone.caches):  # each layer: row b batched, the row alone
            a, one = mine.extract(b), its.extract(0)
            assert a.offset == one.offset == len(t)
            for x, y in zip(a.state[:2], one.state[:2]):
                assert mx.array_equal(x[..., : len(t), :], y[..., : len(t), :]).item()


TAILS = [list(range(5, 5 + n)) for n in (0, 1, 7, 8, 19)]


def test_prefill_caches_batched_hold_the_bits_of_each_prompt_alone():
    model, _ = variant("llama-trained")
    inv = invariant.configure(model, True)
    assert invariant_prefill.serves(model)
    _assert_rows_equal_alone(model, inv, TAILS)


def test_a_clone_mid_prefill_runs_on_apart_from_its_original():
    model, _ = variant("llama-trained")
    inv = invariant.configure(model, True)
    group = invariant_prefill.BatchedReplayPrefillGroup(
        model, TAILS, CHUNK, None, None, [0] * 5, [0] * 5, inv
    )
    assert group.run_chunk() == [0, 1, 7, 8, 8] and group.next_chunk() == (1, 8, 11)
    copy = group.clone()
    assert copy.run_chunk() == [0, 0, 0, 0, 8] and group.rows_done_tokens == [0, 1, 7, 8, 8]
    while not group.done:
        group.run_chunk()
    while not copy.done:
        copy.run_chunk()
    assert group.forwards == copy.forwards == 3 and copy.next_rows() == [] and copy.next_chunk() == (0, 0, 0)
    for a, b in zip(group.caches, copy.caches):
        assert all(mx.array_equal(x, y).item() for x, y in zip(a.state[:2], b.state[:2]))
    with pytest.raises(RuntimeError, match="done"):
        group.run_chunk()


@pytest.mark.parametrize("family", ["llama-trained", "llama-bf16"])
def test_off_the_cpu_one_row_projections_prefill_in_the_devices_row_blocks(monkeypatch, family):
    """Off the CPU a projection the decode step runs as one-row products (``ONE_ROW``: none
    calibrated here) prefills its thousands of rows in the device's prefill blocks instead
    (``PREFILL_ROW_BLOCKS``: RowBlocks(2, 2048) for bf16, here cut to 24 rows to keep the range's
    sweep short), its bits still each prompt's alone. Checked here on the CPU with the CUDA table."""
    monkeypatch.setitem(invariant_prefill.PREFILL_ROW_BLOCKS, ("cuda", "half"), invariant.RowBlocks(2, 24))
    monkeypatch.setattr(invariant_prefill, "PREFILL_FIXED_ROWS", {})  # ranges only (fixed calls: below)
    monkeypatch.setattr(invariant_prefill, "_PREFILL_BLOCKS", {})
    model, _ = variant(family)
    invariant.configure(model, True)  # hooks the model
    inv = invariant.Invariance("cuda", {})  # no projection calibrated: each one-row (ONE_ROW)
    q = model.model.layers[0].self_attn.q_proj
    assert inv.plan_for(q)[0] == invariant.ONE_ROW
    want = invariant.RowBlocks(8, 8) if family == "llama-trained" else invariant.RowBlocks(2, 24)
    assert invariant_prefill.prefill_plan(inv, q) == (want, None)
    cpu = invariant.Invariance("cpu", {})
    assert invariant_prefill.prefill_plan(cpu, q)[0] == invariant.ONE_ROW  # the CPU keeps the step's plan
    _assert_rows_equal_alone(model, inv, TAILS)


def test_off_the_cpu_a_prefill_runs_larger_blocks_than_the_decode_step(monkeypatch):
    """The decode step's calibrated ``RowBlocks(2, 8)`` (bf16 on CUDA: ``RowBlocks(2, 256)``)
    would cut a prefill's rows into many calls; a prefill runs the device's prefill blocks
    (here ``RowBlocks(2, 40)``, cut by ``clean_range``: MLX's CPU bf16 kernel keeps every count),
    a projection whose clean range is shorter keeps its cut, and every prompt's rows keep the
    bits of its prefill alone (the prefill's own plan, alone and batched alike)."""
    monkeypatch.setitem(invariant_prefill.PREFILL_ROW_BLOCKS, ("cuda", "half"), invariant.RowBlocks(2, 40))
    monkeypatch.setattr(invariant_prefill, "PREFILL_FIXED_ROWS", {})
    monkeypatch.setattr(invariant_prefill, "_PREFILL_BLOCKS", {})
    model, _ = variant("llama-bf16")
    invariant.configure(model, True)
    attn = model.model.layers[0].self_attn
    inv = invariant.Invariance("cuda", {invariant.signature(attn.q_proj): invariant.RowBlocks(2, 8)})
    assert inv.plan_for(attn.q_proj)[0] == invariant.RowBlocks(2, 8)
    assert invariant_prefill.prefill_plan(inv, attn.q_proj) == (invariant.RowBlocks(2, 40), None)
    _assert_rows_equal_alone(model, inv, TAILS)


def test_off_the_cpu_a_projection_with_a_short_clean_range_prefills_in_fixed_calls(monkeypatch):
    """A projection whose clean range is cut short (the H100's ``down_proj`` at 72 rows: a
    5,000-row prefill would be 70 calls) prefills in fixed calls of ``PREFILL_FIXED_ROWS`` rows
    (here 32) where every row keeps its bits wherever it sits, and every prompt's rows keep the
    bits of its prefill alone; with the range long enough it keeps the range."""
    monkeypatch.setitem(invariant_prefill.PREFILL_ROW_BLOCKS, ("cuda", "half"), invariant.RowBlocks(2, 6))
    monkeypatch.setitem(invariant_prefill.PREFILL_FIXED_ROWS, "cuda", 32)
    monkeypatch.setattr(invariant_prefill, "_PREFILL_BLOCKS", {})
    model, _ = variant("llama-bf16")
    invariant.configure(model, True)
    inv = invariant.Invariance("cuda", {})
    mlp = model.model.layers[0].mlp
    assert invariant_prefill.prefill_plan(inv, mlp.down_proj) == (invariant.RowBlocks(32, 32), None)
    _assert_rows_equal_alone(model, inv, TAILS)
    monkeypatch.setitem(invariant_prefill.PREFILL_FIXED_ROWS, "cuda", 4)  # below the range: the range
    monkeypatch.setattr(invariant_prefill, "_PREFILL_BLOCKS", {})
    assert invariant_prefill.prefill_plan(inv, mlp.down_proj) == (invariant.RowBlocks(2, 6), None)


def test_a_fixed_call_holds_only_if_every_row_keeps_its_bits_wherever_it_sits():
    """A kernel that rounds some of a call's rows otherwise (a tile split apart, as stream-K may)
    passes ``rows_agree``'s three rows (first, middle, last) but not ``fixed_block_holds``,
    which checks every row at other places; a row-wise kernel passes both."""
    W = mx.random.normal((24, 64), key=mx.random.key(5))

    def tiled(x):  # rows 10..19 of every call summed in another order: bits by position
        y = x @ W.T
        odd = x[10:20, ::-1] @ W[:, ::-1].T
        return mx.concatenate([y[:10], odd, y[20:]])

    assert invariant.rows_agree(tiled, 64, mx.float32, invariant.RowBlocks(64, 64))
    assert not invariant_prefill.fixed_block_holds(tiled, 64, mx.float32, 64)
    assert invariant_prefill.fixed_block_holds(lambda x: x @ W.T, 64, mx.bfloat16, 64)


def test_the_real_rows_go_back_to_their_places_and_padding_copies_its_rows_last_token():
    """``_real_rows`` of right-padded rows of 3, 1 and 4 tokens: ``keep`` picks the 8 real
    positions of the ``[3, 4]`` input, and ``y[spread]`` puts each real row's output back at its
    own place, every padding position a copy of its row's last real token (finite)."""
    keep, spread = invariant_prefill._real_rows([3, 1, 4])
    assert keep.tolist() == [0, 1, 2, 4, 8, 9, 10, 11]
    assert spread.tolist() == [0, 1, 2, 2, 3, 3, 3, 3, 4, 5, 6, 7]
    x = mx.arange(12 * 2, dtype=mx.float32).reshape(12, 2)  # [B' * C, N]
    back = (x[keep] * 2)[spread]
    real = mx.array([0, 1, 2, 4, 8, 9, 10, 11])
    assert mx.array_equal(back[real], x[real] * 2).item()
    assert (
        mx.array_equal(back[3], x[2] * 2).item()
        and mx.array_equal(back[5:8], mx.repeat(x[4:5] * 2, 3, 0)).item()
    )
    assert invariant_prefill._real_rows([5, 5]) == (None, None)


def test_models_with_rings_or_recurrent_state_prefill_each_prompt_alone():
    for family in ("mamba2", "qwen3next"):
        model, _ = variant(family)
        assert not invariant_prefill.serves(model)
    model, _ = variant("qwen3")
    assert invariant_prefill.serves(model) and not invariant_prefill.serves(model, max_kv_size=16)
    with pytest.raises(TypeError, match="KVCache layers only"):
        invariant_prefill.PromptChunks([object()], [1])


OPENBLAS_SCRIPT = textwrap.dedent("""
    import workbench as wb
    from workbench.runtime import blas
    from workbench.verify import invariance
    from workbench.workloads.workload import prompt_of_length
    import json
    assert blas.STATUS.library, blas.STATUS.note
    model, tok = wb.load()
    lengths = (1, 2, 3, 8, 9, 10, 14, 20, 27, 40)
    reqs = [wb.Request(prompt=prompt_of_length(tok, n, 13 * n + 1), max_tokens=6) for n in lengths]
    reqs.append(wb.Request(prompt=prompt_of_length(tok, 12, 5), max_tokens=6, temperature=0.8, seed=3))
    alone = [invariance.alone(model, tok, r, 8) for r in reqs]
    equal = {}
    for name, max_batch, arrivals in (("at once", 11, [0] * 11), ("staggered", 4, [i // 3 * 2 for i in range(11)])):
        sched = wb.Scheduler(model, tok, max_batch=max_batch, prefill_step_size=8, batch_invariant=True)
        sched.run(arrivals=list(zip(arrivals, reqs)))
        got = [(sched.tokens(u), sched.logprobs(u)) for u in sorted(sched.requests)]
        equal[name] = [sum(g == a for g, a in zip(got, alone)), len(reqs)]
    print(json.dumps(equal))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is the Linux CPU's optimized BLAS")
def test_with_openblas_batched_prefill_keeps_every_row_bit_equal_alone(monkeypatch):
    got = _in_a_process_with_openblas(OPENBLAS_SCRIPT, monkeypatch)
    assert got == {"at once": [11, 11], "staggered": [11, 11]}, got
