"""The latency goals' verdicts, floors and time split (workbench.bench.latency_goals): on
hand-built events and spans, and on a live packed engine against an independent count."""

import math

import pandas as pd
import pytest

from workbench.bench.engines import Arrival, MlxLmEngine, drive
from workbench.bench.latency_goals import (
    Span,
    gap_parts,
    goal_verdicts,
    prefill_floors,
    run_parts,
    ttft_floors,
    ttft_parts,
)
from workbench.bench.packed import PACKED, TrackedWorkbench, _run, factories
from workbench.observe.events import Event, events_frame
from workbench.workloads.workload import prompt_of_length


def frame(*events):
    return events_frame([Event(*e) for e in events])


def test_a_requests_ttft_splits_into_queue_own_prefill_and_waiting_on_other_rows():
    # uid 1 is submitted at 0.00 while a forward runs (span 0), admitted at 0.02 (span 1 starts),
    # waits out span 1 (a forward built before it came, uid 0's token), then span 2 runs its
    # prefill and reads its first token.
    spans = [Span(0.0, 0.02, 0), Span(0.02, 0.05, 0), Span(0.05, 0.10, 30)]
    ev = frame(
        ("submit", 0, 0, -0.1),
        ("admit", 0, 0, -0.1),
        ("submit", 1, 0, 0.0),
        ("token", 0, 0, 0.019),
        ("admit", 1, 1, 0.021),
        ("token", 0, 1, 0.049),
        ("prefill", 1, 2, 0.099),
        ("token", 1, 2, 0.1),
    )
    t = ttft_parts(ev, spans).set_index("uid").loc[1]
    assert t.ttft_s == pytest.approx(0.1)
    assert t.queue_s == pytest.approx(0.021)
    assert t.own_prefill_s == pytest.approx(0.05)  # span 2 only
    assert t.waiting_s == pytest.approx(0.1 - 0.021 - 0.05)


def test_a_gap_counts_the_prefill_of_the_forwards_it_waited_on_not_of_the_one_before():
    # uid 0's tokens are read in spans 0, 1 and 3; span 0 ran 40 prefill tokens (before its
    # first gap opened), span 2 ran 20 inside its second gap and span 3 (which read its third
    # token) 10 more.
    spans = [Span(0.0, 1.0, 40), Span(1.0, 2.0, 0), Span(2.0, 3.0, 20), Span(3.0, 4.0, 10)]
    ev = frame(("token", 0, 0, 0.9), ("token", 0, 1, 1.9), ("token", 0, 3, 3.9))
    g = gap_parts(ev, spans)
    assert g.prefill_tokens.tolist() == [0, 30]
    parts = run_parts(frame(("submit", 0, 0, 0.0), ("admit", 0, 0, 0.0), *ev.itertuples(index=False)), spans)
    assert parts["itl_tail_behind_prefill"] == 1.0 and parts["itl_tail_prefill_tokens"] == 30


def test_an_engine_without_spans_has_no_parts():
    ev = frame(("submit", 0, 0, 0.0), ("token", 0, 0, 0.1), ("token", 0, 1, 0.2))
    assert all(math.isnan(v) for v in run_parts(ev, []).values())


def row(scenario="staggered", engine=PACKED, **kw):
    base = dict(scenario=scenario, engine=engine, ttft_p95_s=0.06, itl_p95_s=0.02)
    return pd.Series(base | kw)


def test_a_missed_goal_names_its_floor_and_where_the_time_went():
    floors = {"ttft_floor_p95_s": 0.04, "itl_floor_s": 0.004}
    parts = {"tail_queue_s": 0.001, "tail_own_prefill_s": 0.05, "tail_waiting_s": 0.009}
    parts |= {"itl_tail_behind_prefill": 0.8, "itl_tail_prefill_tokens": 150.0}
    mine = row(**floors, **parts)
    ref = row(engine="mlx-lm", ttft_p95_s=0.05, itl_p95_s=0.025)
    ttft, itl, both = goal_verdicts(mine, ref)
    assert ttft.startswith("- staggered, workbench, packed: TTFT p95 1.20x mlx-lm") and "missed" in ttft
    assert "floor 0.80x" in ttft and "out of reach of any schedule here" in ttft  # 0.04 / 0.05 > 0.6
    assert "queue 1.0 ms, its own prefill forwards 50.0 ms, waiting on other rows' forwards 9.0 ms" in ttft
    assert itl.endswith("): met") and "floor" not in itl  # 0.02 / 0.025
    assert both.endswith("both goals at once: missed")


def test_a_floor_under_the_goal_does_not_rule_it_out_and_no_floor_is_said():
    ref = row(engine="mlx-lm", ttft_p95_s=0.05, itl_p95_s=0.01)
    ttft, itl, _ = goal_verdicts(row(ttft_floor_p95_s=0.01), ref)
    assert "floor 0.20x" in ttft and "not ruled out by the floor" in ttft
    assert "no floor measured" in itl


def test_prefill_floors_refuse_no_repeats_and_empty_prompts():
    with pytest.raises(ValueError, match="repeats"):
        prefill_floors(None, [[1, 2]], repeats=0)
    with pytest.raises(ValueError, match="empty prompt"):
        prefill_floors(None, [[]])


@pytest.mark.model
def test_the_floors_and_spans_of_a_live_packed_run(bundled):
    model, tok = bundled
    prompts = [tuple(prompt_of_length(tok, n, start=7 * n)) for n in (12, 40, 12)]
    floors = prefill_floors(model, prompts, repeats=1)
    assert sorted(floors) == [12, 40] and all(s > 0 for s in floors.values())
    each = ttft_floors(model, prompts, repeats=1)  # only the prompts at or above the p90 length
    assert each[0] == each[2] == 0.0 and each[1] > 0
    arrivals = [Arrival(p, 3, at_s=0.0) for p in prompts]
    events, _, spans = _run(factories(model, tok, (PACKED,))[PACKED], arrivals)
    # every prompt token but none twice went through a forward: the spans' prefill tokens
    assert sum(s.prefill_tokens for s in spans) == sum(len(p) for p in prompts)
    t = ttft_parts(events, spans)
    assert len(t) == 3 and (t.own_prefill_s > 0).all()
    assert (t.queue_s + t.own_prefill_s + t.waiting_s).to_numpy() == pytest.approx(t.ttft_s.to_numpy())
    assert (t.waiting_s >= -1e-9).all()


@pytest.mark.model
def test_mlx_lm_holds_more_requests_in_flight_than_max_batch_and_the_workbench_does_not(bundled):
    # 3 rows: two finish together while a prefilled prompt waits, so BatchGenerator takes two new
    # prompts by the room it counted before moving that one in, and holds 4 requests at once
    model, tok = bundled
    lengths = (6, 3, 3, 8, 8, 8, 5)
    arrivals = [Arrival(tuple(prompt_of_length(tok, 5 + i, 3 * i)), m) for i, m in enumerate(lengths)]
    mlx = MlxLmEngine(model, 3, 64)
    drive(mlx, arrivals)
    packed = TrackedWorkbench(model, tok, 3, 64, layout="packed", page_size=16, max_num_batched_tokens=64)
    drive(packed, arrivals)
    assert mlx.peak_rows == 4
    assert packed.peak_rows == 3  # the workbench never passes max_batch
