"""Latency floors: the decode step read from hand-built event logs, the floors taken as
the lowest over engines and repeats, their errors, and a measured TTFT floor read from real solo runs."""

import pandas as pd
import pytest

import workbench as wb
from workbench.bench.engines import Arrival, MlxLmEngine, WorkbenchEngine, drive
from workbench.bench.floors import full_batch_step_s, measure_floors
from workbench.observe.events import Event, events_frame
from workbench.observe.metrics import request_metrics
from workbench.workloads.workload import prompt_of_length


def log(*events: tuple) -> pd.DataFrame:
    return events_frame([Event(kind, uid, 0, t) for kind, uid, t in events])


def test_the_full_batch_step_is_the_median_gap_once_every_row_has_its_first_token():
    # uid 0 starts at 1.0, uid 1 at 1.5 (it joined later): gaps from 1.5 on only
    events = log(
        ("submit", 0, 0.0),
        ("submit", 1, 0.0),
        ("token", 0, 1.0),
        ("token", 0, 1.5),
        ("token", 1, 1.5),
        ("token", 0, 1.7),
        ("token", 1, 1.7),
        ("token", 0, 2.0),
        ("token", 1, 2.0),
    )
    assert full_batch_step_s(events) == pytest.approx(0.25)  # gaps 0.2, 0.2, 0.3, 0.3 (not 1.0 -> 1.5)
    with pytest.raises(ValueError, match="decode_tokens"):
        full_batch_step_s(log(("token", 0, 1.0), ("token", 1, 1.2), ("token", 0, 1.4)))


def test_the_floors_are_the_lowest_over_engines_and_repeats():
    calls = []
    ttft_of = {
        ("a", 0): {4: 0.30, 9: 0.50},
        ("b", 0): {4: 0.20, 9: 0.60},
        ("a", 1): {4: 0.25, 9: 0.45},
        ("b", 1): {4: 0.40, 9: 0.70},
    }
    step_of = {("a", 0): 0.10, ("b", 0): 0.08, ("a", 1): 0.09, ("b", 1): 0.12}

    def run(name, arrivals):
        rep = sum(c[0] == name and len(c[1]) > 1 for c in calls)  # batch runs of this engine so far
        calls.append((name, arrivals))
        if len(arrivals) == 1:  # alone, one token
            return log(("submit", 0, 0.0), ("token", 0, ttft_of[name, rep][len(arrivals[0].prompt)]))
        step = step_of[name, rep]
        return log(
            *[("submit", u, 0.0) for u in range(len(arrivals))],
            *[("token", u, 1.0 + k * step) for k in range(4) for u in range(len(arrivals))],
        )

    arrivals = [Arrival((1,) * 4, 8), Arrival((2,) * 9, 8), Arrival((3,) * 4, 8)]
    floors = measure_floors(run, ["a", "b"], arrivals, batch_rows=5, repeats=2, decode_tokens=4)
    assert floors.ttft_by_length_s == {4: 0.20, 9: 0.45}
    assert (floors.itl_s, floors.batch_rows, floors.runs) == (pytest.approx(0.08), 5, 4)
    assert floors.ttft_s(arrivals) == [0.20, 0.45, 0.20]
    solo = [c[1][0].prompt for c in calls if len(c[1]) == 1]
    assert len(solo) == 8 and {len(p) for p in solo} == {4, 9}  # one run per distinct length
    assert all(a.max_tokens == 1 for c in calls if len(c[1]) == 1 for a in c[1])
    batch = [c[1] for c in calls if len(c[1]) > 1][0]
    assert [a.prompt for a in batch] == [arrivals[i % 3].prompt for i in range(5)]  # cycled to 5 rows
    assert all(a.max_tokens == 4 and a.at_s == 0 for a in batch)
    assert "decode step at B = 5 80.0 ms" in floors.text(arrivals)


@pytest.mark.parametrize(
    "kwargs", [dict(names=[]), dict(arrivals=[]), dict(batch_rows=0), dict(repeats=0), dict(decode_tokens=2)]
)
def test_measure_floors_refuses_what_it_cannot_measure(kwargs):
    args = dict(run=None, names=["a"], arrivals=[Arrival((1, 2), 4)], batch_rows=2) | kwargs
    with pytest.raises(ValueError, match="measure_floors"):
        measure_floors(**args)


@pytest.mark.model
def test_a_measured_ttft_floor_is_the_lowest_solo_ttft_of_real_runs_of_the_whole_prompt():
    """Real engines, real clock: the floor is the lowest TTFT of the solo runs it made, each
    one request whose 300-token prompt was prefilled whole and gave one token. (How close it
    is to a solo forward timed directly is a timing comparison, which flakes under load on a
    shared machine: ``scripts/latency_floors.py`` prints it.)"""
    model, tok = wb.load(
        "tiny-llama"
    )  # the floor's rule does not depend on the model: the smallest bundled one
    prompt = prompt_of_length(tok, 300, 0)
    solo_runs = []

    def run(name, arrivals):
        engine = MlxLmEngine(model, 4, 512) if name == "mlx-lm" else WorkbenchEngine(model, tok, 4, 512)
        try:
            drive(engine, arrivals)
            events = events_frame(engine.events)
        finally:
            engine.close()
        if len(arrivals) == 1:
            solo_runs.append((name, events))
        return events

    floors = measure_floors(run, ["mlx-lm", "workbench"], [Arrival(tuple(prompt), 1)], 4, repeats=2)
    assert [name for name, _ in solo_runs] == ["mlx-lm", "workbench"] * 2
    ttft_s = []
    for name, events in solo_runs:
        assert (events.kind == "submit").sum() == 1 and (events.kind == "token").sum() == 1, name
        ttft_s.append(float(request_metrics(events).ttft_s.iloc[0]))
        if name == "workbench":  # the whole prompt prefilled (299 tokens, the last one by the join forward)
            assert events[events.kind == "prefill"].n_tokens.sum() == 299
    assert floors.ttft_by_length_s == {300: min(ttft_s)} and min(ttft_s) > 0
    assert floors.runs == 4
