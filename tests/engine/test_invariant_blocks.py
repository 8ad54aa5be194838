"""The batch-invariant mode's calibrated row blocks (issue 39): the kernel-threshold sweep
tells a leak (a neighbour changes my bits) from a switch (the row count changes my bits by
rounding), the mode runs a batch in one call per projection where the BLAS allows it, the
calibrated blocks match the record for this (mlx version, BLAS), and the same input twice
gives the same bits. The suite's BLAS is MLX's reference one (``tests/conftest.py``);
OpenBLAS, whose sgemm switches kernels by row count, runs in a subprocess."""

import json
import os
import subprocess
import sys
import textwrap

import mlx.core as mx
import pytest

import workbench as wb
from workbench.engine.levers import invariant, invariant_blocks, invariant_record
from workbench.runtime.blas import find_blas
from workbench.verify import run_to_run

pytestmark = pytest.mark.model

W = mx.random.normal((24, 64), key=mx.random.key(5))  # [N, K]


def _switch(x):  # another summation order from 4 rows on: the bits change, by rounding only
    return x @ W.T if x.shape[0] < 4 else (x[:, ::-1] @ W[:, ::-1].T)


def _leak(x):  # a neighbour's values reach every row
    return x @ W.T + 1e-3 * x.sum(0, keepdims=True)[:, :24]


def _moved(x):  # a row's bits depend on its position in the call
    return x @ W.T + 1e-3 * mx.arange(x.shape[0])[:, None]


def test_the_sweep_separates_a_neighbour_leak_from_a_kernel_switch():
    switch = invariant_blocks.sweep(_switch, 64, mx.float32, rows=range(1, 9), neighbours=True)
    assert switch.switches() == [4]
    assert not any(switch.leak) and not any(switch.moved)
    assert 0 < max(switch.max_diff) < 1e-4  # joining a call of 4+ rows costs rounding only
    assert switch.runs() == [(1, 3), (4, 8)]
    leak = invariant_blocks.sweep(_leak, 64, mx.float32, rows=range(1, 9), neighbours=True)
    assert leak.leak == (False,) + (True,) * 7 and leak.runs() == [(1, 1)]
    moved = invariant_blocks.sweep(_moved, 64, mx.float32, rows=range(1, 9), neighbours=True)
    assert any(moved.moved) and not any(moved.leak)
    assert "switches at [4]" in switch.text() and "leaks at [2," in leak.text()


def test_the_block_is_the_cheapest_run_of_one_kernel_group():
    def of(groups):
        n = len(groups)
        return invariant_blocks.Sweep(
            tuple(range(1, n + 1)), tuple(groups), (False,) * n, (False,) * n, (0.0,) * n
        )

    assert invariant_blocks.block_from(of([0] * 32)) == (1, 32)
    assert invariant_blocks.block_from(of([0] * 3 + [1] * 29)) == (4, 32)  # B = 1 pads to 4 rows
    assert invariant_blocks.block_from(of([0] * 18 + [1] * 14)) == (1, 18)
    assert invariant_blocks.block_from(of([0, 1] * 16)) is not None
    # a call costs CALL_ROWS rows whatever the weight's size (it re-reads the weight, from cache
    # too): SmolLM2-135M's o_proj (switch at 3 rows) runs one call padded to 3, not 16 calls of 2
    # at B = 32 (148 against 572 us a layer, scripts/lab/invariant_call_cost.py)
    assert invariant_blocks.block_from(of([0] * 2 + [1] * 30)) == (3, 32)
    # ... while a switch far above M = 1 keeps a lone row unpadded: blocks of 9, 4 calls at B = 32
    assert invariant_blocks.block_from(of([0] * 9 + [1] * 23)) == (1, 9)
    # ... but not one-row calls: 32 of them at B = 32 cost more than padding one row to 2
    assert invariant_blocks.block_from(of([0] + [1] * 31)) == (2, 32)
    # a run is cut where the probe moved or leaked
    s = of([0] * 8)
    s = invariant_blocks.Sweep(
        s.rows, s.group, (False,) * 8, (False,) * 5 + (True,) + (False,) * 2, s.max_diff
    )
    assert s.runs() == [(1, 5), (7, 8)]


def test_the_mode_runs_a_batch_of_32_in_one_call_per_projection_where_the_blas_allows():
    model, _ = wb.load()
    inv = invariant.Invariance.calibrate(model)
    for sig, blocks in inv.blocks.items():
        assert blocks is not None and len(blocks.plan(32)) == 1, (sig, blocks)  # blocks of 8 read W 4 times
        assert len(blocks.plan(1)) == 1


def test_the_calibrated_blocks_are_the_recorded_ones_for_this_mlx_and_blas():
    model, _ = wb.load()
    table, key = invariant_record.recorded(), invariant_record.record_key()
    assert key in table, (
        f"no recorded row blocks for {key}: a new mlx (or BLAS) may move a kernel boundary; run "
        "`python -m workbench.engine.levers.invariant_record` with WORKBENCH_BLAS=off (and with OpenBLAS), "
        "review the change in invariant_blocks_record.json and commit it"
    )
    found = {k: list(v) if v else None for k, v in invariant_record.calibrated_blocks(model).items()}
    assert found == table[key], f"{key}: the kernel boundaries moved: recorded {table[key]}, now {found}"


def _requests(tok):
    from workbench.workloads.workload import prompt_of_length

    return [wb.Request(prompt=prompt_of_length(tok, 3 + 7 * i, 5 + i), max_tokens=6) for i in range(6)]


def test_the_same_batch_twice_gives_the_same_bits():
    model, tok = wb.load()
    first, second = run_to_run.twice(model, tok, _requests(tok), max_batch=6)
    assert len(first) == 6 and all(toks for toks, _ in first)
    assert first == second


OPENBLAS_SCRIPT = textwrap.dedent("""
    import json
    import mlx.nn as nn
    import workbench as wb
    import mlx.core as mx
    from workbench.engine.levers.invariant import Invariance
    from workbench.engine.levers.invariant_blocks import sweep
    from workbench.engine.levers import invariant_record as rec
    from workbench.runtime.blas import STATUS
    from workbench.verify import run_to_run
    from workbench.workloads.workload import prompt_of_length

    assert STATUS.library, STATUS.note
    model, tok = wb.load()
    reqs = [wb.Request(prompt=prompt_of_length(tok, 3 + 7 * i, 5 + i), max_tokens=6) for i in range(6)]
    first, second = run_to_run.twice(model, tok, reqs, max_batch=6)
    table, key = rec.recorded(), rec.record_key()
    kv = nn.Linear(1024, 256, bias=False)  # llama-155m's KV projection, 1 MiB
    kv_runs = sweep(lambda x: kv(x), 1024, mx.float32).runs()  # OpenBLAS here: [(1, 3), (4, 32)]
    blocks = Invariance.calibrate(nn.Sequential(kv)).blocks_for(kv)
    print(json.dumps({
        "kv_runs": kv_runs, "kv_plans": [blocks.plan(B) for B in (1, 32)],  # (start, kept, call rows)
        "key": key, "sweeps": rec.sweeps(model), "recorded": table.get(key), "twice_equal": first == second,
        "blocks": {k: list(v) if v else None for k, v in rec.calibrated_blocks(model).items()},
        "same_blas": [k for k in table if k.split(" | ", 1)[1] == rec.blas_id()],
    }))
""")


def _in_a_process_with_openblas(code, monkeypatch):
    """``code``'s last printed line as JSON, run by a fresh interpreter that loads OpenBLAS."""
    monkeypatch.delenv("WORKBENCH_BLAS", raising=False)  # the suite itself runs with it off
    env = dict(os.environ)
    if find_blas() is None:
        pytest.skip("no optimized BLAS installed here (.ci/run installs Debian's libopenblas0-pthread)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is the Linux CPU's optimized BLAS")
def test_with_openblas_switches_cost_rounding_only_no_leaks_the_blocks_hold_and_32_rows_run_one_call(
    monkeypatch,
):
    got = _in_a_process_with_openblas(OPENBLAS_SCRIPT, monkeypatch)
    for sig, s in got["sweeps"].items():
        assert s["leaks"] == [] and s["moved"] == [], (sig, s)  # a neighbour never reaches a row's bits
        assert s["max_diff"] < 1e-3, (sig, s)  # a kernel switch costs rounding only
    lo, hi = got["kv_runs"][-1]  # the last group (every row count, where the BLAS never switches)
    if hi == 32 and lo <= 4:  # a switch a few rows above M = 1: a lone row pads to it, 32 rows run one
        # call (not 11 calls of up to 3 rows, each reading the weight again: block_from's call cost)
        assert got["kv_plans"] == [[[0, 1, lo]], [[0, 32, 32]]], got["kv_runs"]
    assert got["twice_equal"], got  # run-to-run (each row against its run alone: test_invariant.py)
    if got["same_blas"]:  # this BLAS on this CPU was recorded: a new mlx must be recorded too
        assert got["recorded"] == got["blocks"], (
            f"{got['key']}: recorded {got['recorded']}, now {got['blocks']}"
        )
    print(got["key"], {k: s["switches"] for k, s in got["sweeps"].items()})
