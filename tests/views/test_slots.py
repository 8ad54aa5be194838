"""Slot x step view on hand-built event logs, and static against continuous batching of the
same requests on the real engine."""

import numpy as np
import pytest
from matplotlib.figure import Figure

import workbench as wb
from tests.observe.event_logs import event_log
from workbench.views.slots import IDLE, render_slots, slot_grid, slots_text, utilisation
from workbench.workloads.static_batching import run_static
from workbench.workloads.workload import prompt_maker


def test_a_joiner_takes_the_slot_an_evicted_request_freed():
    log = event_log(
        """
        join 0 0
        join 1 0
        token 0 0
        token 1 0
        token 1 1
        evict 0 1
        join 2 2
        token 2 2
        token 1 2
        """
    )
    grid = slot_grid(log, 2)
    assert grid.tolist() == [[0, IDLE, 2], [1, 1, 1]]
    assert (
        slots_text(grid)
        == "3 decode steps, 5 tokens in 6 slot-steps: 83% busy\nslot 0 | 0 . 2\nslot 1 | 1 1 1"
    )
    assert utilisation(grid) == pytest.approx(5 / 6)


def test_more_holders_than_slots_is_refused():
    with pytest.raises(ValueError, match="all 1 slots are held"):
        slot_grid(event_log("join 0 0\njoin 1 0"), 1)


def test_render_slots_draws_one_strip_per_run():
    grid = np.array([[0, 0, IDLE], [1, IDLE, IDLE]])
    assert isinstance(render_slots([("a", grid), ("b", grid[:, :2])]), Figure)
    with pytest.raises(ValueError, match="at least one run"):
        render_slots([])


def test_static_batching_waits_for_the_longest_row_and_gives_the_same_tokens():
    model, tokenizer = wb.load()
    prompt = prompt_maker(tokenizer)
    wanted = [(5, 2), (4, 6), (3, 3), (6, 2)]
    make = lambda: [
        wb.Request(prompt=prompt(n, 9 * i), max_tokens=m, stop_ids=[]) for i, (n, m) in enumerate(wanted)
    ]
    static = wb.Scheduler(model, tokenizer, max_batch=2)
    run_static(static, make())
    continuous = wb.Scheduler(model, tokenizer, max_batch=2)
    for r in make():
        continuous.submit(r)
    continuous.run()
    # static: batch {0, 1} runs 6 steps (uid 1's length), then {2, 3} 3 steps; continuous: 7 steps
    assert slot_grid(static.events, 2).tolist() == [
        [0, 0, IDLE, IDLE, IDLE, IDLE, 2, 2, 2],
        [1, 1, 1, 1, 1, 1, 3, 3, IDLE],
    ]
    assert static.step_index == 9 and continuous.step_index < static.step_index
    assert all(static.tokens(u) == continuous.tokens(u) for u in range(4))
    with pytest.raises(ValueError, match="needs an idle scheduler"):
        static.submit(wb.Request(prompt=prompt(3), max_tokens=2))
        run_static(static, [])
