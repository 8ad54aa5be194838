"""Sarathi-Serve's comparison on the cost clock (``workbench.bench.packed_cost``): every
packed forward charged, the same numbers on every run, and the schedules' order on a small
window: decode-first keeps the tail ITL lowest, prefill-first stalls the decodes."""

import pytest

from workbench.bench.engines import Arrival
from workbench.bench.packed import latency
from workbench.bench.packed_cost import COST_MODEL, cost_factories, run_on_cost_clock
from workbench.sim.costmodel import CostModel
from workbench.workloads.workload import prompt_of_length

pytestmark = pytest.mark.model


def test_the_cost_clock_comparison_is_deterministic_and_orders_the_schedules(bundled):
    model, tok = bundled
    arrivals = [
        Arrival(tuple(prompt_of_length(tok, n, 11 * i)), 12, at_s=0.01 * i)
        for i, n in enumerate((40, 90, 8, 60, 120, 30))
    ]
    fac = cost_factories(model, tok, CostModel.load(COST_MODEL), (16,))
    names = ["hybrid, 16", "prefill-first, 16", "decode-first, 16"]
    runs = [
        latency({n: fac[n] for n in names}, arrivals, 1, "cost", lambda s: None, False, run_on_cost_clock)[0]
        for _ in range(2)
    ]
    assert runs[0].drop(columns="round").equals(runs[1].drop(columns="round"))
    s = runs[0].set_index("engine")
    assert (s.requests == len(arrivals)).all() and (s.throughput_tok_per_s > 0).all()
    assert s.loc["decode-first, 16", "itl_p99_s"] < s.loc["hybrid, 16", "itl_p99_s"]
    assert s.loc["hybrid, 16", "itl_p99_s"] < s.loc["prefill-first, 16", "itl_p99_s"]
    assert s.loc["hybrid, 16", "ttft_p95_s"] < s.loc["decode-first, 16", "ttft_p95_s"]


def test_pacing_the_hybrid_schedule_cuts_its_tail_itl_on_the_cost_clock(bundled):
    model, tok = bundled
    arrivals = [
        Arrival(tuple(prompt_of_length(tok, n, 11 * i)), 12, at_s=0.01 * i)
        for i, n in enumerate((40, 90, 8, 60, 120, 30))
    ]
    fac = cost_factories(model, tok, CostModel.load(COST_MODEL), (128,), paced_steps=(2.0,))
    assert list(fac)[:4] == [
        "hybrid, 128",
        "prefill-first, 128",
        "decode-first, 128",
        "hybrid, 128, paced 2x",
    ]
    names = ["hybrid, 128", "hybrid, 128, paced 2x"]
    s = latency({n: fac[n] for n in names}, arrivals, 1, "cost", lambda s: None, False, run_on_cost_clock)[0]
    s = s.set_index("engine")
    assert (s.requests == len(arrivals)).all()
    assert s.loc["hybrid, 128, paced 2x", "itl_p99_s"] < s.loc["hybrid, 128", "itl_p99_s"]
