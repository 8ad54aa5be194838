"""First divergence localised to a layer: no false alarm on a correct batch, and the
planted faults (a noisy row, a dropped padding mask, RoPE counting the padding, bf16) found
at the right layer, row and positions."""

import mlx.core as mx
import numpy as np
import pandas as pd
import pytest

import workbench as wb
from workbench.runtime.device import on_gpu
from workbench.verify import faults
from workbench.verify.layers import (
    first_suspect_token,
    layer_table,
    localize,
    ranges,
)
from workbench.verify.rerun import StepRecord
from workbench.workloads.workload import prompt_maker

SPECS = ((6, 0), (2, 40), (13, 80), (9, 200))  # prompt lengths 6, 2, 13, 9: left padding 7, 11, 0, 4


def running(make_sched, prompt, steps=2, **kwargs):
    sched = make_sched(max_batch=4, **kwargs)
    for n, start in SPECS:
        sched.submit(wb.Request(prompt=prompt(n, start), max_tokens=12))
    sched.admit()
    for _ in range(steps):
        sched.step()
    return sched


# -- the pure table ---------------------------------------------------------------------


def record(hidden, kv, logprobs=(0.0, -1.0)):
    return StepRecord(
        np.array(hidden, np.float32),
        [None if k is None else np.array(k, np.float32) for k in kv],
        np.array(logprobs, np.float32),
    )


def test_layer_table_flags_the_layer_and_the_positions_over_tolerance():
    # 3 layers, hidden 2, P = 2 (cache positions 0..2, K = 1)
    solo = record(
        [[1.0, -2.0], [4.0, 0.0], [10.0, 1.0]], [[[1.0], [1.0], [2.0]], [[3.0], [1.0], [1.0]], None]
    )
    batched = record(
        [[1.0, -2.0], [4.0, 0.5], [10.5, 1.0]], [[[1.0], [1.0], [2.0]], [[3.0], [1.5], [1.0]], None]
    )
    table = layer_table(batched, solo, position=2, rtol=0.1)
    assert list(table["over"]) == [False, True, False]
    assert list(table["max_abs_delta"]) == [0.0, 0.5, 0.5]
    assert list(table["mean_abs_delta"]) == [0.0, 0.25, 0.25]
    assert table["tolerance"].tolist() == pytest.approx([0.2, 0.4, 1.0])
    # layer 1: output over (0.5 > 0.4) at P = 2, its cache over at position 1 (0.5 > 0.1 * 3)
    assert table.loc[1, "positions"] == (1, 2) and table.loc[1, "first_position"] == 1
    # layer 2: the same output Δ is within its larger tolerance (0.5 < 1.0); no cache compared
    assert table.loc[2, "positions"] == () and np.isnan(table.loc[2, "kv_max_abs_delta"])
    assert pd.isna(table.loc[0, "first_position"]) and table.loc[0, "n_positions_over"] == 0


def test_a_batch_cache_holding_more_positions_than_the_row_is_over_there():
    solo = record([[1.0]], [[[1.0], [2.0]]])
    batched = record([[1.0]], [[[1.0], [2.0], [0.0]]])  # one position too many (P = 1)
    table = layer_table(batched, solo, position=1, rtol=0.1)
    assert table.loc[0, "positions"] == (2,) and table.loc[0, "kv_max_abs_delta"] == float("inf")


def test_ranges_compacts_runs():
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert ranges([]) == "-"


# -- a correct batch ---------------------------------------------------------------------


@pytest.mark.model
def test_a_correct_batch_has_every_layer_of_every_row_within_tolerance(make_sched, prompt):
    sched = running(make_sched, prompt)
    for _ in range(3):
        for uid in range(4):
            report = localize(sched, uid)
            assert report.ok, report.text()
            worst = (report.table["max_abs_delta"] / report.table["tolerance"]).max()
            assert worst < 0.1  # the float32 noise sits over ten times under the tolerance
        sched.step()


@pytest.mark.model
def test_a_fork_localizes_from_its_parents_checkpoints_and_the_parent_from_the_forks(make_sched, prompt):
    sched = running(make_sched, prompt, history_checkpoints=8)
    fork = sched.fork()
    fork.step()
    assert localize(fork, 1, token=2).step == 1  # kept by the parent, carried into the fork's history
    assert localize(sched, 1, checkpoint=fork.checkpoint()).token_index == 4


@pytest.mark.model
def test_localize_changes_nothing_in_the_scheduler(make_sched, prompt):
    sched, plain = running(make_sched, prompt), running(make_sched, prompt)
    cp = sched.checkpoint()
    localize(sched, 2)
    localize(sched, 1, checkpoint=cp)
    sched.run(), plain.run()
    assert [sched.tokens(u) for u in range(4)] == [plain.tokens(u) for u in range(4)]


# -- the planted fault ---------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("layer, row", [(1, 0), (3, 2), (4, 3)])
def test_a_noisy_row_in_one_layer_is_named_by_its_layer_and_row(make_sched, prompt, bundled, layer, row):
    model, _ = bundled
    sched = running(make_sched, prompt)
    with faults.noisy_row(model, layer, row):
        reports = [localize(sched, uid) for uid in range(4)]
    faulty = [r for r in reports if not r.ok]
    assert [(r.row, r.first_layer) for r in faulty] == [(row, layer)]
    assert faulty[0].positions == [faulty[0].position]  # this step's token, not the cache
    assert list(faulty[0].table["over"]) == [i >= layer for i in range(5)]


@pytest.mark.model
def test_a_fault_during_the_run_is_found_from_the_oracle_token_and_traced_back(make_sched, prompt, bundled):
    model, _ = bundled
    sched = running(make_sched, prompt, steps=0, history_checkpoints=32)
    with faults.noisy_row(model, 3, 2, scale=0.05):
        for _ in range(6):
            sched.step()
        t = first_suspect_token(sched, 2)
        assert t == 1 and [first_suspect_token(sched, u) for u in (0, 1, 3)] == [None] * 3
        first = localize(sched, 2, token=t)
        later = localize(sched, 2, token=4)
    assert (first.uid, first.row, first.first_layer, first.positions) == (2, 2, 3, [13])
    # three steps later layer 4's cache (written from layer 3's noisy outputs) differs first
    # at the token the fault first touched
    assert later.table.loc[4, "first_position"] == 13 and later.position == 16
    assert later.first_layer == 3 and later.positions == [16]


@pytest.mark.model
def test_a_fault_in_the_prefill_shows_at_token_1_in_the_caches_of_the_prompt(make_sched, prompt, bundled):
    model, _ = bundled
    sched = make_sched(max_batch=4, history_checkpoints=32)
    for n, start in SPECS:
        sched.submit(wb.Request(prompt=prompt(n, start), max_tokens=12))
    with faults.noisy_row(model, 2, 2, scale=0.05):
        sched.admit(), sched.step(), sched.step()  # the prefill group and the join have 4 rows too
        assert first_suspect_token(sched, 2) == 0
        with pytest.raises(ValueError, match="localize token 1"):
            localize(sched, 2, token=0)
        report = localize(sched, 2, token=1)
    assert (report.first_layer, report.positions) == (2, [13])
    assert report.table.loc[3, "positions"] == tuple(range(14))  # the prompt's 13 positions and this one


# -- real causes ---------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("fault", [faults.no_padding_mask, faults.rope_counts_padding])
def test_a_padding_bug_shows_in_layer_0_of_exactly_the_padded_rows(make_sched, prompt, bundled, fault):
    model, _ = bundled
    sched = running(make_sched, prompt)
    with fault(model):
        reports = [localize(sched, uid) for uid in range(4)]
    assert [r.left_padding for r in reports] == [7, 11, 0, 4]
    assert [r.first_layer for r in reports] == [0, 0, None, 0]
    assert all(r.positions == [r.position] for r in reports if not r.ok)


@pytest.mark.model
def test_a_bf16_batch_differs_from_layer_0_at_every_position(prompt, bundled):
    model, tokenizer = bundled
    half, _ = wb.load()
    half.set_dtype(mx.bfloat16)
    sched = wb.Scheduler(half, tokenizer, max_batch=4)
    for n, start in SPECS:
        sched.submit(wb.Request(prompt=prompt(n, start), max_tokens=12))
    sched.admit(), sched.step()
    report = localize(sched, 2, reference_model=model)
    assert report.first_layer == 0
    if not on_gpu():  # the CPU's kernels only: on CUDA (H200) some positions' bf16 layer-0 outputs round to
        # the float32 reference's, and bf16 [B, ...] and [1, ...] kernels differ (batched vs alone: 0.17 nats)
        assert report.positions == list(range(report.position + 1))
        assert localize(sched, 2).ok  # against itself alone: bf16 batched vs bf16 alone agree


# -- refusals ------------------------------------------------------------------------------


@pytest.mark.model
def test_localize_refuses_what_it_cannot_re_run(make_sched, prompt, random_llama):
    sched = running(make_sched, prompt)
    with pytest.raises(ValueError, match="join forward"):
        localize(sched, 0, token=0)
    with pytest.raises(ValueError, match="history_checkpoints"):
        localize(sched, 0, token=2)
    with pytest.raises(ValueError, match="not both"):
        localize(sched, 0, token=2, checkpoint=sched.checkpoint())
    other = wb.Scheduler(*random_llama, max_batch=4)
    other.submit(wb.Request(prompt=[1, 2, 3], max_tokens=3)), other.admit()
    with pytest.raises(ValueError, match="this scheduler's model"):
        localize(sched, 0, checkpoint=other.checkpoint())
    sched.submit(wb.Request(prompt=prompt(3, 0), max_tokens=2))
    with pytest.raises(ValueError, match="holds no row"):
        localize(sched, 4)
    with pytest.raises(ValueError, match="out of range"):
        with faults.noisy_row(sched.model, 9, 0):
            pass


@pytest.mark.model
@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-qwen3-next", "tiny-mamba2"])
def test_sliding_window_and_recurrent_models_localize_a_noisy_row_too(name):
    model, tokenizer = wb.load(name)
    prompt = prompt_maker(tokenizer)
    sched = wb.Scheduler(model, tokenizer, max_batch=4)
    for n, start in SPECS:
        sched.submit(wb.Request(prompt=prompt(n, start), max_tokens=12))
    sched.admit(), sched.step()
    assert all(localize(sched, uid).ok for uid in range(4))
    with faults.noisy_row(model, 1, 1):
        reports = [localize(sched, uid) for uid in range(4)]
    assert [r.first_layer for r in reports] == [None, 1, None, None]
