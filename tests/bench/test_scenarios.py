"""The benchmark's definitions on hand-built data: run order, the decode window, the
head-of-line numbers, the driver, the roofline arithmetic."""

import pandas as pd
import pytest

from workbench.bench.engines import Arrival, drive
from workbench.bench.roofline import DecodeCost, bounds_tok_per_s
from workbench.bench.scenarios import alternating, decode_window, head_of_line_numbers


def test_alternating_runs_reverse_every_other_round():
    assert alternating(["a", "b", "c"], 3) == [
        (0, "a"),
        (0, "b"),
        (0, "c"),
        (1, "c"),
        (1, "b"),
        (1, "a"),
        (2, "a"),
        (2, "b"),
        (2, "c"),
    ]


def test_decode_window_starts_after_the_first_iteration_with_tokens():
    # iteration 0 prefills (no tokens), 1 reads the first tokens, 2..4 decode 4 rows each
    it = pd.DataFrame({"iteration": range(5), "time_s": [1.0, 3.0, 3.5, 4.0, 5.0], "tokens": [0, 4, 4, 4, 4]})
    w = decode_window(it)
    assert w == {"tok_per_s": 12 / 2.0, "window_s": 2.0, "tokens": 12, "step_s": 0.5}


def _hol_events():
    # rows 0 and 1 decode every 1 s until joiner 2 arrives at 2.5 s; it is admitted at 3.2,
    # its chunks are logged at 3.6 and 4.8 (a running token at 4.2 between them), its first
    # token at 6.0; the running rows then wait from 4.2 to 6.5
    rows = [("token", u, t) for u in (0, 1) for t in (1.0, 2.0, 3.0, 4.2, 6.5, 7.5)]
    rows += [
        ("submit", 2, 2.5),
        ("admit", 2, 3.2),
        ("prefill", 2, 3.6),
        ("prefill", 2, 4.8),
        ("token", 2, 6.0),
    ]
    ev = pd.DataFrame(rows, columns=["kind", "uid", "time_s"]).sort_values("time_s", kind="stable")
    return ev.assign(role=["joiner" if u == 2 else "running" for u in ev.uid], engine="e")


def test_head_of_line_numbers_from_events():
    n = head_of_line_numbers(_hol_events(), "e")
    assert n["max_gap_s"] == pytest.approx(2.3)  # 4.2 -> 6.5 overlaps the join; 6.5 -> 7.5 comes after
    assert n["step_s"] == 1.0  # gaps that ended before the joiner arrived
    assert n["chunk_s"] == pytest.approx(0.6)  # 4.8 - 4.2 (the event before it) beats 3.6 - 3.2


class _FakeEngine:
    """Each iteration makes one token per submitted, unfinished request (2 tokens each)."""

    def __init__(self):
        self.left, self.events, self.log = {}, [], []

    def submit(self, prompt, max_tokens):
        uid = len(self.log)
        self.log.append(("submit", uid, prompt))
        self.left[uid] = max_tokens
        return uid

    def iterate(self):
        for uid in list(self.left):
            self.left[uid] -= 1
            if not self.left[uid]:
                del self.left[uid]
        self.log.append(("iterate",))
        return 1

    @property
    def idle(self):
        return not self.left


def test_drive_submits_by_iteration_and_runs_until_idle():
    engine = _FakeEngine()
    it = drive(engine, [Arrival((1,), 2), Arrival((2,), 2, at_iteration=3)])
    assert [e[0] for e in engine.log] == ["submit", "iterate", "iterate", "submit", "iterate", "iterate"]
    assert it.iteration.tolist() == [0, 1, 2, 3] and it.tokens.tolist() == [1, 1, 1, 1]


def test_roofline_bounds_are_bytes_and_flops_over_rates():
    cost = DecodeCost(
        weight_bytes=1000, weight_params=250, kv_bytes_per_token=10, attention_flops_per_token=4
    )
    b = bounds_tok_per_s(cost, rows=2, context_tokens=50, bandwidth_bytes_per_s=2000, flops_per_s=4000)
    assert b["bytes_per_step"] == 2000  # 1000 + 2 * 50 * 10
    assert b["memory_tok_per_s"] == 2.0  # 2 rows * 2000 / 2000
    assert b["compute_tok_per_s"] == pytest.approx(2 * 4000 / (2 * (500 + 200)))
    assert b["attainable_tok_per_s"] == 2.0
