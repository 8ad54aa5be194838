"""The batch-invariant mode: every row's tokens and log-probs bit-identical to the same
request run alone in the mode (``Scheduler(batch_invariant=True, max_batch=1)``), whatever
the batch, the step it joins at, its neighbours and their samplers — asserted with ``==``,
no tolerance. The suite runs with MLX's reference BLAS (``tests/conftest.py``); the
optimized BLAS users get (OpenBLAS, whose sgemm picks kernels by row count) is checked in
a subprocess below."""

import os
import subprocess
import sys
import textwrap

import mlx.core as mx
import mlx.nn as nn
import pytest

import workbench as wb
from workbench.engine.levers import invariant
from workbench.runtime.blas import find_blas
from workbench.runtime.loading import DATA_DIR
from workbench.verify import invariance

pytestmark = pytest.mark.model

CHUNK = 8
PROMPT_TOKENS = (1, 3, 9, 17, 30, 5, 12, 24, 2, 40, 7, 16)


def _requests(tok, sampled=2, max_tokens=10):
    from workbench.workloads.workload import prompt_of_length

    reqs = [
        wb.Request(prompt=prompt_of_length(tok, n, 31 * i + 5), max_tokens=max_tokens)
        for i, n in enumerate(PROMPT_TOKENS)
    ]
    reqs += [
        wb.Request(
            prompt=prompt_of_length(tok, 11 + i, 97 + i),
            max_tokens=max_tokens,
            temperature=0.9,
            top_p=0.95,
            seed=40 + i,
        )
        for i in range(sampled)
    ]
    return reqs


def _run(model, tok, reqs, max_batch, arrivals=None, **kw):
    sched = wb.Scheduler(model, tok, max_batch=max_batch, prefill_step_size=CHUNK, batch_invariant=True, **kw)
    if arrivals is None:
        uids = [sched.submit(r) for r in reqs]
        sched.run()
    else:
        sched.run(arrivals=list(zip(arrivals, reqs)))
        uids = sorted(sched.requests)
    return sched, [(sched.tokens(u), sched.logprobs(u)) for u in uids]


_ALONE: dict = {}


def _alone(name, model, tok, reqs):
    key = (name, id(model))
    if key not in _ALONE:
        _ALONE[key] = [invariance.alone(model, tok, r, CHUNK) for r in reqs]
    return _ALONE[key]


def _model(name, dtype=None, quantize=False):
    model, tok = wb.load(DATA_DIR / "models" / name)
    if dtype is not None:
        model.set_dtype(dtype)
    if quantize:
        nn.quantize(model, group_size=32, bits=4)
    return model, tok


VARIANTS = {  # family -> (model folder, dtype, quantized weights)
    "llama": ("tiny-llama", None, False),
    "llama-trained": ("tiny-code", None, False),
    "qwen3": ("tiny-qwen3", None, False),
    "mamba2": ("tiny-mamba2", None, False),
    "qwen3next": ("tiny-qwen3-next", None, False),
    "llama-bf16": ("tiny-code", mx.bfloat16, False),
    "llama-4bit": ("tiny-code", None, True),
}
_MODELS: dict = {}


def variant(name):
    if name not in _MODELS:
        folder, dtype, quantize = VARIANTS[name]
        _MODELS[name] = _model(folder, dtype, quantize)
    return _MODELS[name]


@pytest.mark.parametrize("family", list(VARIANTS))
def test_every_row_is_bit_equal_to_its_run_alone_at_once_and_staggered(family):
    model, tok = variant(family)
    reqs = _requests(tok)
    solo = _alone(family, model, tok, reqs)
    for max_batch, arrivals in (
        (14, None),
        (5, [i // 2 * 3 for i in range(len(reqs))]),
        (3, [0] * len(reqs)),
    ):
        _, got = _run(model, tok, reqs, max_batch, arrivals)
        differ = [i for i, (a, b) in enumerate(zip(got, solo)) if a != b]
        assert not differ, f"{family} max_batch={max_batch}: rows {differ} differ from alone"


def test_prompt_cache_hits_pacing_and_a_restored_checkpoint_keep_every_row_bit_equal():
    model, tok = variant("llama-trained")
    shared = list(range(40, 60))  # 20 shared tokens: two whole chunks of 8 are reusable
    reqs = [wb.Request(prompt=shared + [70 + i] * (i + 1), max_tokens=8) for i in range(6)]
    solo = [invariance.alone(model, tok, r, CHUNK) for r in reqs]
    sched = wb.Scheduler(
        model, tok, max_batch=3, prefill_step_size=CHUNK, batch_invariant=True, prompt_cache=8, pacing=True
    )
    uids = [sched.submit(r) for r in reqs[:2]]
    sched.run()
    cp = sched.checkpoint()
    uids += [sched.submit(r) for r in reqs[2:]]
    sched.run()
    cached = [sched.requests[u].cached_tokens for u in uids]
    assert any(c > 0 for c in cached) and all(c % CHUNK == 0 for c in cached), cached
    got = [(sched.tokens(u), sched.logprobs(u)) for u in uids]
    assert got == solo
    sched.restore(cp)
    again = [sched.submit(r) for r in reqs[2:]]
    sched.run()
    assert [(sched.tokens(u), sched.logprobs(u)) for u in again] == solo[2:]


def test_bit_check_reports_equal_rows_and_the_first_difference():
    model, tok = variant("llama-trained")
    sched, _ = _run(model, tok, _requests(tok, sampled=1, max_tokens=6)[:6], 4)
    report = invariance.bit_check(sched)
    assert report.ok and report.n_equal == 6 and report.text().startswith("bit-exact: 6/6")
    assert invariance.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert invariance.first_difference([1, 2], [1, 2, 3]) == 2
    assert invariance.first_difference([1], [1]) is None
    with pytest.raises(ValueError, match="batch_invariant"):
        invariance.bit_check(wb.Scheduler(model, tok))


def test_what_the_mode_cannot_keep_invariant_is_refused_by_name(monkeypatch):
    """(kv_bits, kv_budget_bytes, speculative and sliding windows compose with the mode:
    tests/engine/test_invariant_pairs.py.)"""
    from mlx_lm.models.cache import BatchKVCache, ChunkedKVCache

    model, tok = variant("llama-trained")
    with pytest.raises(ValueError, match="batch_invariant must be True or False"):
        wb.Scheduler(model, tok, batch_invariant="yes")
    layers = [BatchKVCache([0]), ChunkedKVCache(8)]  # a layer cache the mode has no per-row attention for
    monkeypatch.setattr("workbench.engine.kv.caches.new_batch_cache", lambda *a: layers)
    with pytest.raises(
        ValueError,
        match="cannot batch layer 1.s ChunkedKVCache: only full-attention .BatchKVCache., sliding-window",
    ):
        invariant.configure(model, True)


def test_row_blocks_plan_pads_every_call_to_its_fixed_size():
    assert invariant.RowBlocks(8, 8).plan(1) == [(0, 1, 8)]
    assert invariant.RowBlocks(8, 8).plan(20) == [(0, 8, 8), (8, 8, 8), (16, 4, 8)]
    assert invariant.RowBlocks(2, 256).plan(1) == [(0, 1, 2)]
    assert invariant.RowBlocks(2, 256).plan(300) == [(0, 256, 256), (256, 44, 44)]


def test_blocked_gives_the_projection_and_each_row_independent_of_the_others():
    w = mx.random.normal((24, 16), key=mx.random.key(1))
    f = lambda x: x @ w.T  # noqa: E731
    x = mx.random.normal((3, 7, 16), key=mx.random.key(2))  # [B, T, K]: 21 rows
    y = invariant.blocked(f, x, invariant.RowBlocks(8, 8))
    assert y.shape == (3, 7, 24)
    assert mx.allclose(y, f(x), atol=1e-5).item()
    x2 = mx.concatenate([x[:1], x[1:] * 0 + 3.0])  # other rows' values changed
    y2 = invariant.blocked(f, x2, invariant.RowBlocks(8, 8))
    assert mx.array_equal(y2[0], y[0]).item()


def test_calibration_falls_back_to_smaller_blocks_where_a_row_depends_on_its_position():
    by_count = lambda x: x * x.shape[0]  # noqa: E731  a row's value depends on the row count
    by_position = lambda x: x + mx.arange(x.shape[0])[:, None]  # noqa: E731  ... on its position
    assert not invariant.rows_agree(by_count, 4, mx.float32, None)
    assert invariant.rows_agree(by_count, 4, mx.float32, invariant.RowBlocks(8, 8))
    assert not invariant.rows_agree(by_position, 4, mx.float32, invariant.RowBlocks(8, 8))
    assert invariant.rows_agree(by_position, 4, mx.float32, invariant.RowBlocks(1, 1))


def test_the_audit_names_the_varying_operations_and_the_mode_removes_them():
    model, tok = variant("llama-trained")
    audit = invariance.audit(
        model, tok, [[5 + i, 9, 11 + 2 * i] for i in range(8)], batch_sizes=(4,), max_tokens=4
    )
    assert audit.end_to_end[("invariant", 4)] == (4, 4)
    assert all(f.mode_diff in (None, 0.0) for f in audit.ops)
    text = audit.text()
    assert "lm_head" in text and "attention" in text and "invariant B =   4: 4/4" in text


def test_the_audit_takes_every_setting_of_step_grids_and_refuses_others():
    model, tok = variant("llama-trained")
    prompts = [[5 + i, 9, 11 + 2 * i] for i in range(2)]
    audit = invariance.audit(
        model, tok, prompts, batch_sizes=(2,), max_tokens=2, prefill_step_size=2, modes=(True,)
    )
    assert audit.end_to_end == {("invariant", 2): (2, 2)}
    with pytest.raises(TypeError, match="batch_size"):
        invariance.audit(model, tok, prompts, batch_size=2)


OPENBLAS_SCRIPT = textwrap.dedent("""
    import workbench as wb
    from workbench.runtime import blas
    from workbench.verify import invariance
    from workbench.workloads.workload import prompt_of_length
    assert blas.STATUS.library, blas.STATUS.note
    model, tok = wb.load()
    lengths = (1, 4, 9, 20, 33, 3, 14, 27, 6, 11)
    reqs = [wb.Request(prompt=prompt_of_length(tok, n, 7 * n), max_tokens=8) for n in lengths]
    reqs.append(wb.Request(prompt=prompt_of_length(tok, 12, 5), max_tokens=8, temperature=0.7, seed=3))
    for mode in (False, True):
        sched = wb.Scheduler(model, tok, max_batch=11, prefill_step_size=8, batch_invariant=mode)
        uids = [sched.submit(r) for r in reqs]
        sched.run()
        alone = [invariance.alone(model, tok, r, 8, batch_invariant=mode) for r in reqs]
        equal = sum((sched.tokens(u), sched.logprobs(u)) == a for u, a in zip(uids, alone))
        print(("invariant" if mode else "default"), equal, len(reqs))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is the Linux CPU's optimized BLAS")
def test_with_openblas_the_mode_is_bit_exact_where_the_default_path_is_not(monkeypatch):
    monkeypatch.delenv("WORKBENCH_BLAS", raising=False)  # the suite itself runs with it off
    if find_blas() is None:
        pytest.skip("no optimized BLAS installed here (.ci/run installs Debian's libopenblas0-pthread)")
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_BLAS"}
    out = subprocess.run(
        [sys.executable, "-c", OPENBLAS_SCRIPT], capture_output=True, text=True, env=env, timeout=900
    )
    assert out.returncode == 0, out.stdout + out.stderr
    counts = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert counts["invariant"] == "11 11", out.stdout
    print("OpenBLAS, rows bit-equal to alone:", out.stdout.strip().replace("\n", "; "))


TINY_LESSON = {"long_prompt": list(range(40, 60)), "batch_sizes": (1, 2), "max_tokens": 2}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is the Linux CPU's optimized BLAS")
def test_the_optimized_blas_lesson_runs_in_its_own_process_while_this_one_runs_its_own(monkeypatch):
    with monkeypatch.context() as m:
        m.delenv("WORKBENCH_BLAS", raising=False)  # the suite itself runs with it off
        library = find_blas()
    if library is None:
        pytest.skip("no optimized BLAS installed here (.ci/run installs Debian's libopenblas0-pthread)")
    args = TINY_LESSON
    started = invariance.start_lesson_with_optimized_blas(DIVERGENCE_PROMPTS[:2], **args)
    assert started.running  # returned at once: the other process is still loading
    here = invariance.lesson(DIVERGENCE_PROMPTS[:2], **args)
    users = started.result()
    assert (users.library, here.library) == (library, None)
    assert [(g.mode, g.batch_size, g.equal.shape) for g in users.grids] == [
        (g.mode, g.batch_size, g.equal.shape) for g in here.grids
    ]
    failing = invariance.start_lesson_with_optimized_blas(
        DIVERGENCE_PROMPTS[:2], **{**args, "batch_sizes": (8,)}
    )
    with pytest.raises(RuntimeError, match="(?s)process failed: .*prompts: 2 given"):
        failing.result()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is the Linux CPU's optimized BLAS")
def test_each_blas_runs_the_lesson_once_the_one_this_process_lacks_in_a_fresh_process(monkeypatch):
    with monkeypatch.context() as m:
        m.delenv("WORKBENCH_BLAS", raising=False)
        library = find_blas()
        # a kernel on the optimized BLAS (no WORKBENCH_BLAS) starts the reference one
        started = invariance.start_lesson_with_reference_blas(DIVERGENCE_PROMPTS[:2], **TINY_LESSON)
    if library is None:
        pytest.skip("no optimized BLAS installed here (.ci/run installs Debian's libopenblas0-pthread)")
    assert started.result().library is None
    reference, optimized, note = invariance.lessons_on_both_blas(DIVERGENCE_PROMPTS[:2], **TINY_LESSON)
    assert (reference.library, optimized.library, note) == (None, library, None)


def test_step_grids_mark_each_token_and_chunk_findings_compare_chunk_schedules():
    model, tok = variant("llama-trained")
    prompts = [[5 + i, 9, 11 + 2 * i][: 1 + i % 3] for i in range(4)]
    grids = invariance.step_grids(
        model, tok, prompts, batch_sizes=(2, 4), max_tokens=5, prefill_step_size=CHUNK
    )
    assert [(g.mode, g.batch_size) for g in grids] == [
        ("default", 2),
        ("default", 4),
        ("invariant", 2),
        ("invariant", 4),
    ]
    mode = grids[-1]
    assert mode.equal.shape == (4, 5) and mode.n_equal_rows == 4 and mode.first_differences() == [None] * 4
    # same token, other log-prob (0) is told apart from another token or a missing one (2)
    assert invariance.compare_steps(([1, 2, 3], [-0.5, -0.1, -0.2]), ([1, 2], [-0.5, -0.3]), 4).tolist() == [
        1,
        0,
        2,
        -1,
    ]
    assert invariance.compare_steps(([1, 7], [-0.5, -0.1]), ([1, 2], [-0.5, -0.1]), 2).tolist() == [1, 2]
    assert invariance.end_to_end(invariance.step_grids(model, tok, prompts, (4,), 5, CHUNK))[
        ("invariant", 4)
    ] == (4, 4)
    with pytest.raises(ValueError, match="prompts: 4 given"):
        invariance.step_grids(model, tok, prompts, batch_sizes=(8,))
    long = list(range(40, 70))
    found = invariance.chunk_findings(model, tok, wb.Request(prompt=long, max_tokens=3), chunk_sizes=(8, 16))
    assert [(c.prefill_step_size, c.reference_step_size) for c in found] == [(8, 2048), (16, 2048)]
    solo = invariance.alone(model, tok, wb.Request(prompt=long, max_tokens=3), 8)
    assert found[0].tokens_equal == (
        solo[0] == invariance.alone(model, tok, wb.Request(prompt=long, max_tokens=3), 2048)[0]
    )


DIVERGENCE_PROMPTS = [[5, 9, 11], [7, 8], [4, 4, 4, 4]]


def test_default_row_divergence_localizes_a_row_that_differs(monkeypatch):
    model, tok = variant("llama-trained")
    real_alone = invariance.alone
    # a stand-in for an optimized BLAS: the runs alone of the default path see their log-probs shifted
    monkeypatch.setattr(
        invariance, "alone", lambda *a, **k: (lambda t, lp: (t, [x + 1e-3 for x in lp]))(*real_alone(*a, **k))
    )
    d = invariance.default_row_divergence(
        model, tok, DIVERGENCE_PROMPTS, batch_size=3, max_tokens=4, prefill_step_size=CHUNK
    )
    assert d is not None and d.token_index == 1 and len(d.table) == 5


def test_default_row_divergence_runs_every_prompt_at_once_by_default(monkeypatch):
    model, tok = variant("llama-trained")
    real_scheduler, max_batches = invariance.Scheduler, []
    monkeypatch.setattr(
        invariance,
        "Scheduler",
        lambda *a, **k: max_batches.append(k.get("max_batch")) or real_scheduler(*a, **k),
    )
    invariance.default_row_divergence(model, tok, DIVERGENCE_PROMPTS, max_tokens=2, prefill_step_size=CHUNK)
    assert max_batches[0] == len(DIVERGENCE_PROMPTS)  # the batch: all 3 prompts (it was max_batch=8)


def test_default_row_divergence_is_none_where_every_row_agrees():
    from workbench.runtime.device import backend

    if (
        backend() != "cpu"
    ):  # on CUDA the default path's rows differ from alone (docs/gpu.md): nothing to assert
        pytest.skip("the default path is batch-invariant only on the CPU's reference BLAS")
    model, tok = variant("llama-trained")
    assert invariance.default_row_divergence(model, tok, DIVERGENCE_PROMPTS, 3, 4, CHUNK) is None


def test_audit_shows_step_grids_settings_as_its_own_parameters():
    """Shift-Tab in Jupyter reads inspect.signature: audit's settings are step_grids' own."""
    import inspect

    from workbench.verify.invariance import audit, step_grids

    params = inspect.signature(audit).parameters
    assert list(params) == list(inspect.signature(step_grids).parameters)
    assert params["batch_sizes"].default == (8,) and params["max_tokens"].default == 16
