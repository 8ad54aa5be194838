"""Sarathi-Serve's schedule comparison on the cost clock: the Azure window through the
packed layout under each schedule and token budget, every forward priced by the bundled
tiny-llama cost model, beside the padded layout and mlx-lm on the same clock.

``python -m workbench.bench.packed_cost [budget ...]`` prints one markdown table (TTFT and
ITL p50 / p95 / p99, tokens per second), the same on every run and machine. Beside each
budget's three schedules, the hybrid one paced (``pacing=Pacing(itl_target_steps=t,
cost_model=...)`` at each of :data:`PACED_STEPS`, the charging cost model its prior): each
forward's prefill tokens capped so its predicted time stays within ``t`` x its decode rows'
forward (:mod:`workbench.engine.levers.packed_pacing`).

Knows: :mod:`workbench.bench.packed` (the Azure arrivals, the latency rows), the virtual
clock and cost model of :mod:`workbench.sim`, the cost-clock driver of
:mod:`workbench.bench.pacing`. Must not know: the engine's internals.

A packed ``[1, T]`` forward costs one forward's fixed cost plus each token's own
(:meth:`workbench.engine.levers.cost.CostModel.packed_s`: decode rows by the keys they
attend, prefill chunks by their tokens and causal pairs), so the comparison is of the
schedules alone: which tokens share a forward, not Python's overheads. Pipelining is off
(``pipeline=False``): on a virtual clock it hides nothing and would stamp each token one
forward late.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from ..engine.levers.pacing import Pacing
from ..runtime.loading import DATA_DIR, load
from ..sim.clocks import VirtualClock
from ..sim.costmodel import CostedModel, CostModel
from .engines import Arrival, MlxLmEngine
from .pacing import drive_virtual
from .packed import (
    CHUNK_TOKENS,
    MAX_BATCH,
    MLX_LM_EQUAL,
    PADDED,
    PAGE_TOKENS,
    TrackedWorkbench,
    azure_arrivals,
    latency,
    readings,
)
from .packed_sweep import sweep_table
from .scenarios import MLX_LM

BUDGETS = (32, 64, 512)  # tokens per packed forward
SCHEDULES = ("hybrid", "prefill-first", "decode-first")
PACED_STEPS = (2.0, 4.0)  # paced hybrid: the time budget in decode-only forwards
COST_MODEL = DATA_DIR / "costmodels" / "tiny-llama-linux-x86_64.json"

Build = Callable[[], tuple[Any, VirtualClock, CostedModel]]  # a fresh engine on its own clock


def cost_factories(
    model: Any,
    tokenizer: Any,
    cost: CostModel,
    budgets: Sequence[int] = BUDGETS,
    paced_steps: Sequence[float] = PACED_STEPS,
) -> dict[str, Build]:
    """Builders of fresh engines on a fresh virtual clock: the packed layout under each of
    :data:`SCHEDULES` at each budget (``"hybrid, 64"``) and the hybrid one paced at each of
    ``paced_steps`` (``"hybrid, 64, paced 2x"``: ``Pacing(itl_target_steps=t,
    cost_model=cost)``), then the padded layout, mlx-lm as shipped and mlx-lm with at most
    ``MAX_BATCH`` requests in flight (:data:`~workbench.bench.packed.MLX_LM_EQUAL`; chunks of
    :data:`CHUNK_TOKENS`); ``MAX_BATCH`` rows, pages of ``PAGE_TOKENS``."""

    def build(make: Callable[[CostedModel, VirtualClock], Any]) -> Build:
        def fresh() -> tuple[Any, VirtualClock, CostedModel]:
            clock = VirtualClock()
            costed = CostedModel(model, clock, cost)
            return make(costed, clock), clock, costed

        return fresh

    def packed(schedule: str, budget: int, pacing: Pacing | None = None) -> Build:
        settings = dict(layout="packed", page_size=PAGE_TOKENS, max_num_batched_tokens=budget, pacing=pacing)
        return build(
            lambda m, c: TrackedWorkbench(
                m,
                tokenizer,
                MAX_BATCH,
                budget,  # prefill_step_size: a packed forward's tokens are its budget
                clock=c,
                history_size=0,
                pipeline=False,
                packed_schedule=schedule,
                **settings,
            )
        )

    out = {}
    for b in budgets:
        out |= {f"{s}, {b}": packed(s, b) for s in SCHEDULES}
        out |= {
            f"hybrid, {b}, paced {t:g}x": packed("hybrid", b, Pacing(itl_target_steps=t, cost_model=cost))
            for t in paced_steps
        }
    out[PADDED] = build(
        lambda m, c: TrackedWorkbench(m, tokenizer, MAX_BATCH, CHUNK_TOKENS, clock=c, history_size=0)
    )
    out[MLX_LM] = build(lambda m, c: MlxLmEngine(m, MAX_BATCH, CHUNK_TOKENS, clock=c))
    out[MLX_LM_EQUAL] = build(
        lambda m, c: MlxLmEngine(m, MAX_BATCH, CHUNK_TOKENS, clock=c, max_in_flight=MAX_BATCH)
    )
    return out


def run_on_cost_clock(build: Build, arrivals: list[Arrival]) -> tuple[pd.DataFrame, list, list]:
    """One fresh engine through ``arrivals`` on its virtual clock
    (:func:`workbench.bench.pacing.drive_virtual`). Returns its events, KV samples and
    iteration spans (:class:`~workbench.bench.latency_goals.Span`, on the virtual clock)."""
    engine, clock, costed = build()
    try:
        drive_virtual(engine, arrivals, clock, costed)
        return readings(engine)
    finally:
        engine.close()


def run_cost(
    budgets: Sequence[int] = BUDGETS, echo: Callable[[str], None] = print
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every engine of :func:`cost_factories` once through the Azure window on the cost
    clock. Returns ``(summary, kv)`` as :func:`workbench.bench.packed.latency`."""
    model, tokenizer = load("tiny-llama")
    fac = cost_factories(model, tokenizer, CostModel.load(COST_MODEL), budgets)
    return latency(
        fac, azure_arrivals(tokenizer), 1, "sarathi-cost", echo, warm_up=False, run=run_on_cost_clock
    )


def main(argv: Sequence[str] = ()) -> None:
    """Run the comparison (budgets from ``argv``, else :data:`BUDGETS`) and print its table."""
    summary, _ = run_cost(tuple(int(a) for a in argv) or BUDGETS)
    print(sweep_table(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
