"""Speculation readings from a hand-built event log (exact values)."""

import math

from workbench.observe.events import Event
from workbench.observe.speculation import acceptance, batch_tokens_per_forward, draft_grid


def hand_events():
    """uid 0: drafts (4 of 4, 2 of 3, 1 of 4) at steps 0-2, 11 tokens in 4 steps; uid 1:
    drafts (0 of 3, 1 of 1) at steps 2-3, 5 tokens in 4 steps; uid 2: 2 tokens, no drafts."""
    ev = []
    per_step = {
        0: [(0, 4, 4, 5), (1, 0, 0, 1)],
        1: [(0, 3, 2, 3), (1, 0, 0, 1), (2, 0, 0, 1)],
        2: [(0, 4, 1, 2), (1, 3, 0, 1), (2, 0, 0, 1)],
        3: [(0, 0, 0, 1), (1, 1, 1, 2)],
    }
    for step, rows in per_step.items():
        for uid, drafted, accepted, tokens in rows:
            if drafted:
                ev.append(Event("draft", uid, step, float(step), n_tokens=drafted, n_accepted=accepted))
            ev += [Event("token", uid, step, float(step), token=7) for _ in range(tokens)]
    return ev


def test_acceptance_per_row_counts_drafted_and_accepted_tokens_and_tokens_per_forward():
    t = acceptance(hand_events()).set_index("uid")
    counts = ["draft_steps", "drafted_tokens", "accepted_tokens", "tokens", "token_steps"]
    assert t.loc[0, counts].tolist() == [3, 11, 7, 11, 4]
    assert t.loc[0, "acceptance_rate"] == 7 / 11 and t.loc[0, "tokens_per_forward"] == 11 / 4
    assert t.loc[1, ["drafted_tokens", "accepted_tokens", "tokens"]].tolist() == [4, 1, 5]
    assert t.loc[1, "tokens_per_forward"] == 5 / 4
    assert t.loc[2, "draft_steps"] == 0 and math.isnan(t.loc[2, "acceptance_rate"])
    assert t.loc[2, "tokens_per_forward"] == 1.0


def test_the_batch_tokens_per_forward_is_all_tokens_over_the_steps_that_produced_any():
    assert batch_tokens_per_forward(hand_events()) == 18 / 4
    assert math.isnan(batch_tokens_per_forward([]))


def test_draft_grid_places_each_rows_drafts_at_their_steps():
    uids, drafted, accepted = draft_grid(hand_events())
    assert uids == [0, 1]
    assert drafted.tolist() == [[4, 3, 4, 0], [0, 0, 3, 1]]
    assert accepted.tolist() == [[4, 2, 1, 0], [0, 0, 0, 1]]


def test_the_report_carries_the_speculation_readings():
    from workbench.observe.report import Report

    assert Report(hand_events()).speculation.set_index("uid").loc[0, "accepted_tokens"] == 7
