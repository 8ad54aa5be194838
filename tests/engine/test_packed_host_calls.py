"""The packed decode step's host Python per row against the padded step's (issue 40: on CUDA the
decode step is host-bound, and at B = 128 the packed step's Python was 1.15-1.20x the padded
step's, its per-row bookkeeping: a ``Want`` and a ``Chunk`` per row, maps rebuilt per step).

Counted, not timed: the Python function calls (and calls of C functions from Python:
``sys.setprofile``'s ``call`` and ``c_call`` events) of one full-batch decode iteration
(``admit(); step(); filter()``) on the 16-layer tiny llama with the GPU benchmark's settings
(``workbench.bench.gpu_packed.engine_makers``), on the graph CUDA gets
(:func:`~workbench.bench.step_nodes.cuda_like`: the packed layout's paged-kernel path). What a
row adds is the slope between B = 4 and B = 16.

Counts at 7a28f4f (the code before this change): per row, packed 121.0 and padded 58.0 calls;
after it, packed 48.0 (these prompts; more rows' page hand-outs in the counted steps add calls).
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

from workbench.bench.gpu_packed import PACKED, PADDED, engine_makers
from workbench.bench.model import make_model
from workbench.bench.step_nodes import STEP_CONFIG, cuda_like, step_arrivals
from workbench.engine.packed import batch as packed_batch
from workbench.runtime.loading import load

SMALL, LARGE = 4, 16
# Prompts of 17-24 tokens (quick to prefill): the counted steps (tokens 3 and 4 of 8) cross no
# page boundary (pages of 16 positions), whose page hand-out is a row's cost once in 16 steps.
SHORT = dataclasses.replace(STEP_CONFIG, prompt_tokens_min=17, prompt_tokens_max=24)


def calls_of(call) -> int:
    """Python-level calls (``call`` and ``c_call`` events) made while ``call()`` runs."""
    n = 0

    def profile(frame, event, arg):
        nonlocal n
        n += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return n


@pytest.fixture(scope="module")
def makers():
    """``(layout -> B -> engine, tokenizer)``: the GPU benchmark's engines on the 16-layer tiny llama."""
    model, tokenizer = make_model(STEP_CONFIG.shape), load()[1]
    return engine_makers(model, tokenizer, STEP_CONFIG), tokenizer


@pytest.fixture(scope="module")
def per_step(makers):
    """``(layout, B) -> calls`` of one full-batch decode iteration (the mean of two)."""
    makers, tokenizer = makers
    seen = {}

    def count(layout: str, B: int) -> float:
        if (layout, B) not in seen:
            with cuda_like():
                engine = makers[layout](B)
                for a in step_arrivals(tokenizer, B, 8, SHORT):
                    engine.submit(a.prompt, a.max_tokens)
                while engine.iterate() != B:  # until every row decodes
                    pass
                engine.iterate()  # the first full-batch iteration after the joins
                counts, made = [], []
                for _ in range(2):
                    counts.append(calls_of(lambda: made.append(engine.iterate())))
                assert made == [B, B]  # full-batch decode iterations were counted
                engine.close()
            seen[layout, B] = sum(counts) / len(counts)
        return seen[layout, B]

    return count


def per_row(count, layout: str) -> float:
    """Calls one more decoding row adds to a full-batch iteration."""
    return (count(layout, LARGE) - count(layout, SMALL)) / (LARGE - SMALL)


def test_a_packed_decode_row_costs_no_more_python_calls_than_a_padded_row(per_step):
    """Per row: the packed layout's plan, index arrays, launch, reads and books take no more
    calls than the padded layout's step (121.0 against 58.0 before this change, 48.0 after)."""
    packed, padded = per_row(per_step, PACKED), per_row(per_step, PADDED)
    assert 0 < packed <= padded, f"packed {packed:.1f} calls a row, padded {padded:.1f}"


def test_a_steady_packed_decode_step_plans_without_wants(makers, monkeypatch):
    """Every row decoding, no row joining: the plan builds no ``Want`` (``plan_chunks`` is
    not called; :func:`workbench.engine.packed.steady.decode_plan` plans)."""
    called = []
    real = packed_batch.plan_chunks
    monkeypatch.setattr(packed_batch, "plan_chunks", lambda *a, **k: called.append(1) or real(*a, **k))
    makers, tokenizer = makers
    engine = makers[PACKED](SMALL)
    for a in step_arrivals(tokenizer, SMALL, 8, SHORT):
        engine.submit(a.prompt, a.max_tokens)
    while engine.iterate() != SMALL:
        pass
    called.clear()
    assert [engine.iterate() for _ in range(3)] == [SMALL] * 3
    assert called == []


def test_the_steady_plan_is_the_full_plan_field_for_field(makers, monkeypatch):
    """:func:`~workbench.engine.packed.steady.decode_plan` builds its ``Chunk`` s without their
    ``__init__``: each must equal, field for field (``vars``, so a field added to ``Chunk`` and
    not set there fails), what ``plan_chunks`` over the batch's ``Want`` s plans at that step."""
    checked = []
    real = packed_batch.decode_plan

    def both(rows, held, unread, budget):
        fast = real(rows, held, unread, budget)
        if fast is not None:
            batch = next(b for b in live if b.rows is rows)
            full = packed_batch.plan_chunks(batch.wants(unread), budget, "hybrid")
            assert [vars(c) for c in fast] == [vars(c) for c in full] and fast == full
            checked.append(len(fast))
        return fast

    live = []
    real_plan = packed_batch.PackedBatch.plan

    def plan(self, *a, **k):
        live[:] = [self]
        return real_plan(self, *a, **k)

    monkeypatch.setattr(packed_batch, "decode_plan", both)
    monkeypatch.setattr(packed_batch.PackedBatch, "plan", plan)
    makers, tokenizer = makers
    engine = makers[PACKED](SMALL)
    for a in step_arrivals(tokenizer, SMALL, 8, SHORT):
        engine.submit(a.prompt, a.max_tokens)
    for _ in range(12):
        engine.iterate()
    assert checked and max(checked) == SMALL
