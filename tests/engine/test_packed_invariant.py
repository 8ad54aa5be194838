"""The batch-invariant mode in the packed layout (``workbench.engine.levers.invariant_packed``,
``workbench.engine.packed.per_token``): every token of the ``[1, T]`` forward through the
mode's per-row path (row-blocked projections, a one-query attention over its own keys), so a
row's tokens, log-probs and top-k log-probs are bit-equal to the same request alone whatever
its neighbours, the token budget that cuts its prompt into chunks, or the page size; and equal
to mlx-lm alone within the oracle's 1e-4. With OpenBLAS (whose kernels depend on the row
count) the default packed path is not bit-equal alone and the mode is."""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np
import pytest

import workbench as wb
from tests.openblas_child import run_with_openblas
from workbench.engine.levers.invariant_packed import paged_row_attention
from workbench.engine.packed.grouped import grouped_attention, groups_of
from workbench.engine.packed.indices import forward_index
from workbench.engine.packed.pages import PageTable
from workbench.engine.packed.per_token import token_blocks
from workbench.observe.packed import Chunk
from workbench.verify import oracle
from workbench.verify.compose import check_pair

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("solo_references_once")]

PROMPTS = ["def add(a, b):", "import os\n", "for i in range(10):", "class Stack:", "data = ", "def fib(n):"]


def test_each_token_gets_its_own_left_padded_keys():
    t = PageTable(4)
    t.reserve(0, 6)  # pages [0, 1]
    t.reserve(1, 2)  # page [2]
    (block,) = token_blocks(forward_index(t, [Chunk(0, 5, 1, "decode"), Chunk(1, 0, 2, "prefill")]))
    assert (block.first, block.n) == (0, 3)
    assert block.slots.tolist() == [[0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 8], [0, 0, 0, 0, 8, 9]]
    assert block.starts.tolist() == [0, 5, 4]
    blocks = token_blocks(forward_index(t, [Chunk(0, 0, 6, "prefill")]), block=4)
    assert [(b.first, b.n, b.slots.shape) for b in blocks] == [(0, 4, (4, 4)), (4, 2, (2, 6))]


@pytest.mark.parametrize("one_call_per_token", [False, True])
def test_a_tokens_attention_has_the_bits_it_has_alone_and_the_value_of_the_grouped_path(one_call_per_token):
    rng = np.random.default_rng(0)
    t = PageTable(4)
    t.reserve(0, 9)
    t.reserve(1, 7)
    k_pool, v_pool = (mx.array(rng.standard_normal((20, 2, 8)).astype(np.float32)) for _ in range(2))
    chunks = [Chunk(0, 8, 1, "decode"), Chunk(1, 2, 5, "prefill")]
    T = 6
    queries = mx.array(rng.standard_normal((1, 4, T, 8)).astype(np.float32))
    index = forward_index(t, chunks)
    together = paged_row_attention(queries, k_pool, v_pool, token_blocks(index), 0.35, one_call_per_token)
    reference = grouped_attention(queries, k_pool, v_pool, groups_of(t, chunks, index), 0.35)
    assert mx.allclose(together, reference, atol=1e-5).item()
    for c, first in ((chunks[0], 0), (Chunk(1, 5, 1, "decode"), 4)):  # a token alone: its own forward
        alone = paged_row_attention(
            queries[:, :, first : first + 1],
            k_pool,
            v_pool,
            token_blocks(forward_index(t, [c])),
            0.35,
            one_call_per_token,
        )
        assert mx.array_equal(alone[0, :, 0], together[0, :, first]).item()


def run(model, tok, prompts, **settings):
    sched = wb.Scheduler(model, tok, layout="packed", batch_invariant=True, **settings)
    uids = [sched.submit(wb.Request(prompt=p, max_tokens=8, top_logprobs=2)) for p in prompts]
    sched.run()
    return sched, [(sched.tokens(u), sched.logprobs(u), sched.top_logprobs(u)) for u in uids]


@pytest.mark.parametrize("page_size, budget", [(4, 16), (1, 9), (16, 64)])
def test_every_row_is_bit_equal_to_its_run_alone_whatever_the_budget_cuts_and_equal_to_mlx_lm(
    bundled, page_size, budget
):
    model, tok = bundled
    sched, together = run(
        model, tok, PROMPTS, max_batch=4, page_size=page_size, max_num_batched_tokens=budget
    )
    mixed = [f for f in (s.packed.last_chunks for s in sched.history) if len({c.kind for c in f}) == 2]
    assert mixed or budget == 64, "forwards mixed decode tokens and prefill chunks"
    for prompt, row in zip(PROMPTS, together):
        for alone_budget in (budget, 5):  # the same settings, and a budget that cuts the prompt otherwise
            _, (alone,) = run(
                model, tok, [prompt], max_batch=4, page_size=page_size, max_num_batched_tokens=alone_budget
            )
            assert row == alone
    check = oracle.solo_check(model, sched)
    assert check.ok, check.text()


def test_an_abort_a_prefix_hit_and_submit_n_samples_keep_every_row_bit_equal_alone(bundled):
    model, tok = bundled
    settings = dict(
        layout="packed", batch_invariant=True, max_batch=4, page_size=4, max_num_batched_tokens=12
    )
    settings |= dict(prompt_cache=16)
    sched = wb.Scheduler(model, tok, **settings)
    first = sched.submit(wb.Request(prompt=PROMPTS[0] * 3, max_tokens=10))
    sched.run()
    requests = [
        wb.Request(prompt=PROMPTS[0] * 3 + " x", max_tokens=10),  # a prefix hit on cached pages
        wb.Request(prompt=PROMPTS[2], max_tokens=20),  # aborted in the middle
    ]
    uids = [sched.submit(r) for r in requests]
    samples = sched.submit_n(wb.Request(prompt=PROMPTS[5], max_tokens=9, temperature=0.9, seed=4), 2)
    for _ in range(4):
        sched.admit(), sched.step(), sched.filter()
    sched.abort(uids[1])
    sched.run()
    assert [e.n_cached for e in sched.events if e.kind == "admit"][1] > 0
    for uid, request in [
        (first, wb.Request(prompt=PROMPTS[0] * 3, max_tokens=10)),
        (uids[0], requests[0]),
        (samples[1], wb.Request(prompt=PROMPTS[5], max_tokens=9, temperature=0.9, seed=5)),
    ]:
        alone = wb.Scheduler(model, tok, **settings)
        solo = alone.submit(request)
        alone.run()
        assert (sched.tokens(uid), sched.logprobs(uid)) == (alone.tokens(solo), alone.logprobs(solo))


# rows bit-equal to their run alone, printed as "default N" and "invariant N" (of len(PROMPTS))
OPENBLAS_SCRIPT = f"""
import workbench as wb
model, tok = wb.load()
def records(mode, prompts):
    s = wb.Scheduler(model, tok, layout="packed", max_batch=4, batch_invariant=mode, page_size=4,
                     max_num_batched_tokens=16)
    uids = [s.submit(wb.Request(prompt=p, max_tokens=8, top_logprobs=2)) for p in prompts]
    s.run()
    return [(s.tokens(u), s.logprobs(u), s.top_logprobs(u)) for u in uids]
for mode, name in ((False, "default"), (True, "invariant")):
    together = records(mode, {PROMPTS!r})
    print(name, sum(row == records(mode, [p])[0] for row, p in zip(together, {PROMPTS!r})))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is the Linux CPU's optimized BLAS")
def test_with_openblas_packed_rows_are_bit_equal_alone_only_in_the_mode(monkeypatch):
    """The suite runs with ``WORKBENCH_BLAS=off``; a child process without it loads OpenBLAS."""
    stdout = run_with_openblas(monkeypatch, OPENBLAS_SCRIPT)
    equal = {name: int(n) for name, n in (line.split() for line in stdout.split("\n") if line.strip())}
    assert equal.get("invariant") == len(PROMPTS), stdout
    assert equal["default"] < len(PROMPTS), f"the default path differs from alone somewhere: {equal}"


# A short row beside rows of 31-70 tokens of context, joining while they decode, and a 70-token
# prompt alone cut by budgets of 8-2048 tokens; printed "rows EQUAL OF" and "budgets EQUAL OF".
LONG_CONTEXT_SCRIPT = """
import workbench as wb
model, tok = wb.load()
cfg = dict(layout="packed", batch_invariant=True, max_batch=3)
def alone(req, **kw):
    s = wb.Scheduler(model, tok, **(cfg | kw)); u = s.submit(req); s.run()
    return s.tokens(u), s.logprobs(u)
equal = total = 0
for L in (31, 33, 40, 64, 70):
    reqs = [wb.Request(prompt=list(range(100, 100 + L)), max_tokens=4, stop_ids=[]),
            wb.Request(prompt=[5, 6], max_tokens=4, stop_ids=[])]
    s = wb.Scheduler(model, tok, **cfg)
    uids = [s.submit(reqs[0])]
    s.admit(); s.step(); s.step()
    uids.append(s.submit(reqs[1]))
    s.run()
    for u, r in zip(uids, reqs):
        equal += (s.tokens(u), s.logprobs(u)) == alone(r)
        total += 1
print("rows", equal, total)
req = wb.Request(prompt=list(range(100, 170)), max_tokens=6, stop_ids=[])
runs = [alone(req, max_batch=1, max_num_batched_tokens=b, prefill_step_size=b) for b in (8, 16, 31, 33, 64, 2048)]
print("budgets", sum(r == runs[-1] for r in runs), len(runs))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is the Linux CPU's optimized BLAS")
def test_with_openblas_rows_beside_long_contexts_and_any_budget_stay_bit_equal_alone(monkeypatch):
    """A token's keys gathered as ``pool[slots].transpose(...)`` (positions ``n_kv_heads * D``
    apart) went through OpenBLAS otherwise than a left-padded first key block, so its log-prob
    moved with the longest context in its block of tokens (a row beside a neighbour of 32+
    tokens, a prompt cut by another budget: 5e-7 to 4e-6 off, tokens equal; found by a
    break-it pass). The reference BLAS the suite runs on rounds both paths alike, so a child
    process with OpenBLAS checks it."""
    stdout = run_with_openblas(monkeypatch, LONG_CONTEXT_SCRIPT)
    got = {line.split()[0]: line.split()[1:] for line in stdout.splitlines() if line.strip()}
    assert got["rows"][0] == got["rows"][1] == "10" and got["budgets"] == ["6", "6"], got


def test_the_compose_pair_runs_with_every_row_equal_alone(bundled):
    model, tok = bundled
    result = check_pair(model, tok, ("packed", "batch_invariant"))
    assert result.result == "runs" and result.rows == 8 == result.equal, result
