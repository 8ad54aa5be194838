"""The mode's row blocks on a GPU keep only the row counts that give a row its bits alone
(``invariant.clean_range``): a kernel that switches between the three counts
``rows_agree`` checks and the range's top (the H100's ``down_proj`` at ``M = 73``) is caught
at calibration. The GPU is stood in for by a projection that switches where we say."""

import mlx.core as mx
import mlx.nn as nn
import pytest

from workbench.engine.levers import invariant
from workbench.engine.levers.invariant import RowBlocks, clean_range

W = mx.random.normal((24, 64), key=mx.random.key(5), stream=mx.cpu)  # [N, K]


@pytest.fixture(autouse=True)
def _on_the_cpu(request):
    """These tests stand a GPU's kernels in with the CPU's (on a GPU machine too): the CPU
    device, except for the tests marked ``gpu``."""
    if request.node.get_closest_marker("gpu"):
        yield
        return
    with mx.stream(mx.cpu):
        yield


def switching_at(m: int):
    def f(x):  # another summation order from m rows on: the bits change, by rounding only
        return x @ W.T if x.shape[0] < m else (x[:, ::-1] @ W[:, ::-1].T)

    return f


def leaking(x):  # a neighbour's values reach every row
    return x @ W.T + 1e-3 * x.sum(0, keepdims=True)[:, :24]


def test_the_range_stops_below_the_first_row_count_that_switches_kernel():
    assert clean_range(switching_at(25), 64, mx.float32, RowBlocks(2, 40)) == RowBlocks(2, 24)
    assert clean_range(switching_at(73), 64, mx.float32, RowBlocks(2, 72)) == RowBlocks(2, 72)
    assert clean_range(leaking, 64, mx.float32, RowBlocks(2, 16)) == RowBlocks(2, 2)


def test_the_range_is_swept_in_windows_and_stops_at_the_window_of_the_first_switch(monkeypatch):
    """A prefill's blocks of up to 2,048 rows (``invariant_prefill.PREFILL_ROW_BLOCKS``) are cut
    in windows of ``CLEAN_WINDOW`` row counts: a switch at 25 costs the first window only, a
    range clean to its top is swept whole, and the cut is the one a single sweep gives."""
    from workbench.engine.levers import invariant_blocks

    swept_rows: list = []
    real = invariant_blocks.sweep

    def counting(f, K, dtype, rows, neighbours=False):
        swept_rows.append(tuple(rows))
        return real(f, K, dtype, rows=rows, neighbours=neighbours)

    monkeypatch.setattr(invariant_blocks, "sweep", counting)
    monkeypatch.setattr(invariant, "CLEAN_WINDOW", 8)
    assert clean_range(switching_at(25), 64, mx.float32, RowBlocks(2, 60)) == RowBlocks(2, 24)
    assert [r[0] for r in swept_rows] == [2, 2, 2] and max(swept_rows[-1]) == 26  # 3 windows, not 59 counts
    assert swept_rows[1] == (2, *range(11, 19))  # later windows carry lo first: the reference bits
    swept_rows.clear()
    assert clean_range(switching_at(99), 64, mx.float32, RowBlocks(2, 40)) == RowBlocks(2, 40)
    assert sorted({m for r in swept_rows for m in r}) == list(range(2, 41))


def test_calibration_on_a_gpu_keeps_no_row_count_past_a_switch_the_three_checked_counts_miss(monkeypatch):
    layer = nn.Linear(64, 24, bias=False)
    monkeypatch.setattr("workbench.runtime.device.backend", lambda: "cuda")
    monkeypatch.setattr(invariant, "_plain_call", lambda module: switching_at(25))
    monkeypatch.setattr(invariant, "ROWS_APART_BYTES", 0)  # as for a weight too large to stay in cache
    # rows_agree's counts (3, 9, 20) sit below the switch: it alone would keep RowBlocks(2, 40)
    assert invariant.rows_agree(switching_at(25), 64, mx.float32, RowBlocks(2, 40))
    blocks = invariant._first_agreeing(layer, RowBlocks(2, 40))
    assert blocks == RowBlocks(2, 24)
    x = mx.random.normal((40, 64), key=mx.random.key(9))
    alone = invariant.blocked(switching_at(25), x[30:31], blocks)[0]
    among = invariant.blocked(switching_at(25), x, blocks)[30]
    assert mx.array_equal(alone, among).item()  # a row among 40 has its bits alone


@pytest.mark.parametrize("fixed", [RowBlocks(4, 4), RowBlocks(8, 8)])
def test_fixed_blocks_are_not_swept(fixed):
    calls = []

    def f(x):
        calls.append(x.shape[0])
        return x @ W.T

    assert clean_range(f, 64, mx.float32, RowBlocks(fixed.min_rows, fixed.max_rows)) == fixed
    assert set(calls) <= {1, fixed.min_rows}


@pytest.mark.parametrize("fixed", [RowBlocks(4, 4), RowBlocks(8, 8)])
def test_calibration_does_not_sweep_fixed_blocks(monkeypatch, fixed):
    def swept(*args):
        raise AssertionError(f"clean_range called for fixed blocks {fixed}")

    monkeypatch.setattr("workbench.runtime.device.backend", lambda: "cuda")
    monkeypatch.setattr(invariant, "clean_range", swept)
    monkeypatch.setattr(invariant, "ROWS_APART_BYTES", 0)
    assert invariant._first_agreeing(nn.Linear(64, 24, bias=False), fixed) == fixed


@pytest.mark.gpu
def test_on_cuda_a_row_among_96_has_its_bits_alone_on_the_1b_shape():
    """The case the H100 sweep found (docs/gpu.md, 2026-12-07): ``down_proj``'s kernel switches at
    ``M = 73``, so 96 rows decoding together cross it; every row must still equal its run alone."""
    from types import SimpleNamespace

    import workbench as wb
    from workbench.bench.gpu import LLAMA_1B
    from workbench.bench.model import make_model
    from workbench.verify.invariance import alone

    model, tok = make_model(LLAMA_1B, dtype=mx.bfloat16), SimpleNamespace(eos_token_ids=[])
    vocab = LLAMA_1B.vocab_size
    reqs = [
        wb.Request(
            prompt=[(11 * i + 7 * j) % (vocab - 1) + 1 for j in range(1 + (37 * i) % 150)],
            max_tokens=4,
            stop_ids=[],
        )
        for i in range(96)
    ]
    sched = wb.Scheduler(model, tok, max_batch=96, prefill_step_size=64, batch_invariant=True)
    sched.run(arrivals=[(0, r) for r in reqs])
    got = [(sched.tokens(u), sched.logprobs(u)) for u in sorted(sched.requests)]
    solo = [alone(model, tok, r, 64) for r in reqs]
    assert sum(g == s for g, s in zip(got, solo)) == len(reqs)
    # their prefill chunks of 9-64 queries shared one attention call a forward (the check held; the
    # memo also holds the checks of shapes other tests in this process ran: every one held)
    from workbench.engine.levers import invariant_prefill_attention as pa

    held = [v for k, v in pa._HOLDS.items() if k[0] == "cuda"]
    assert held and all(held), pa._HOLDS


def test_on_cuda_a_small_weight_runs_the_range_blocks_not_one_row_calls(monkeypatch):
    """The weight-size rule (one-row calls for a float weight up to ``ROWS_APART_BYTES``, which
    stays in cache) is the CPU's: on CUDA one-row products are a batched matrix-vector kernel
    reading the weight once per row, so a small weight keeps the swept range (one call for B
    rows, a lone row padded to 2 beside the other projections that read its input)."""
    swept = []

    def clean(f, K, dtype, blocks):
        swept.append(blocks)
        return blocks

    monkeypatch.setattr("workbench.runtime.device.backend", lambda: "cuda")
    monkeypatch.setattr(invariant, "clean_range", clean)
    assert invariant._first_agreeing(nn.Linear(64, 24, bias=False), RowBlocks(2, 256)) == RowBlocks(2, 256)
    assert swept == [RowBlocks(2, 256)]


def test_on_the_cpu_a_small_weight_without_a_swept_run_runs_one_row_calls_unswept(monkeypatch):
    def swept(*args):
        raise AssertionError("clean_range called for a weight that runs one row per call")

    monkeypatch.setattr("workbench.runtime.device.backend", lambda: "cpu")
    monkeypatch.setattr(invariant, "clean_range", swept)
    monkeypatch.setattr("workbench.engine.levers.invariant_blocks.block_from", lambda *a, **k: None)
    invariant._SWEPT.clear()
    try:
        layer = nn.Linear(64, 24, bias=False)
        assert invariant._first_agreeing(layer, RowBlocks(2, 256)) == invariant.ONE_ROW
    finally:
        invariant._SWEPT.clear()
