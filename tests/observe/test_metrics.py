"""Metrics computed from synthetic events with exact expected values."""

import math

import pytest

from tests.observe.event_logs import event_log
from workbench.observe.events import Event, events_frame
from workbench.observe.metrics import percentiles, request_metrics, throughput_tok_per_s, token_gaps


def _events():
    # uid 0: submitted at 0 s, admitted at 1 s, tokens at 2, 3, 5 s, finishes at 5 s (length)
    # uid 1: submitted at 1 s, admitted at 4 s, one token at 6 s, stops at 6 s
    # uid 2: submitted at 2 s, still queued
    return events_frame(
        event_log(
            """
            submit 0 0 0.0 n_tokens=7
            submit 1 0 1.0 n_tokens=3
            admit 0 0 1.0 row=0 n_tokens=7
            submit 2 0 2.0 n_tokens=9
            token 0 0 2.0 row=0 token=11 logprob=-1.0
            token 0 1 3.0 row=0 token=12 logprob=-1.0
            admit 1 2 4.0 row=1 n_tokens=3
            token 0 2 5.0 row=0 token=13 logprob=-1.0
            finish 0 2 5.0 row=0 finish_reason=length
            token 1 3 6.0 row=1 token=0 logprob=-0.5
            finish 1 3 6.0 row=1 finish_reason=stop
            """
        )
    )


def test_request_metrics_from_events_are_exact():
    r = request_metrics(_events(), decode=lambda toks, uid: ",".join(map(str, toks))).set_index("uid")
    assert r.loc[0, "queue_s"] == 1.0
    assert r.loc[0, "ttft_s"] == 2.0
    assert r.loc[0, "tpot_s"] == 1.5
    assert r.loc[0, "e2e_s"] == 5.0
    assert r.loc[0, "generated_tokens"] == 3
    assert r.loc[0, "text"] == "11,12,13"
    assert r.loc[1, "queue_s"] == 3.0
    assert r.loc[1, "ttft_s"] == 5.0
    assert math.isnan(r.loc[1, "tpot_s"])
    assert r.loc[1, "finish_reason"] == "stop"
    assert r.loc[1, "prompt_tokens"] == 3


def test_a_queued_request_has_no_latencies_yet():
    r = request_metrics(_events()).set_index("uid")
    assert r.loc[2, "generated_tokens"] == 0
    assert math.isnan(r.loc[2, "ttft_s"]) and math.isnan(r.loc[2, "queue_s"])
    assert r.loc[2, "finish_reason"] == ""


def test_throughput_is_tokens_over_first_submit_to_last_token():
    assert throughput_tok_per_s(_events()) == pytest.approx(4 / 6.0)


def test_throughput_without_tokens_is_nan():
    assert math.isnan(throughput_tok_per_s(events_frame([Event("submit", 0, 0, 0.0)])))


def test_token_gaps_pair_consecutive_tokens_of_each_request():
    gaps = token_gaps(_events())
    assert gaps.uid.tolist() == [0, 0]
    assert gaps.from_s.tolist() == [2.0, 3.0] and gaps.to_s.tolist() == [3.0, 5.0]
    assert gaps.gap_s.tolist() == [1.0, 2.0]  # their mean is uid 0's tpot_s, 1.5


def test_percentiles_ignore_nan():
    import pandas as pd

    p = percentiles(pd.Series([1.0, 2.0, 3.0, math.nan]))
    assert p["p50"] == 2.0
    assert p["p95"] == pytest.approx(2.9)


def test_unknown_event_kind_is_refused():
    with pytest.raises(ValueError, match="Event.kind"):
        Event("tokens", 0, 0, 0.0)


def test_step_metrics_count_batch_size_from_joins_and_evictions_and_rate_from_step_gaps(two_request_events):
    from workbench.observe.metrics import step_metrics

    s = step_metrics(two_request_events)
    assert s.step.tolist() == [0, 1, 2]
    assert s.batch_size.tolist() == [2, 2, 1]
    assert s.tokens.tolist() == [2, 2, 1]
    assert s.time_s.tolist() == [2.0, 3.0, 4.0]
    assert math.isnan(s.step_s[0]) and s.step_s.tolist()[1:] == [1.0, 1.0]
    assert s.tok_per_s.tolist()[1:] == [2.0, 1.0]


def test_step_metrics_of_a_log_without_tokens_is_empty(two_request_events):
    from workbench.observe.metrics import STEP_COLUMNS, step_metrics

    s = step_metrics(two_request_events[two_request_events.kind != "token"])
    assert s.empty and list(s.columns) == STEP_COLUMNS


# -- service levels, goodput, occupancy, padding (hand-built data) ------------------------


def test_the_span_runs_from_the_first_submit_to_the_last_token():
    from workbench.observe.metrics import span_s

    assert span_s(_events()) == 6.0


def test_meeting_the_slo_needs_a_finish_and_both_bounds():
    from workbench.observe.metrics import SLO, meets_slo

    r = request_metrics(_events())  # uid 0: ttft 2, tpot 1.5; uid 1: ttft 5, one token; uid 2 queued
    assert meets_slo(r, SLO()).tolist() == [True, True, False]
    assert meets_slo(r, SLO(ttft_s=2.0)).tolist() == [True, False, False]
    assert meets_slo(r, SLO(tpot_s=1.0)).tolist() == [False, True, False]  # a one-token row has no TPOT


def test_goodput_counts_requests_within_the_slo_per_second_of_span():
    from workbench.observe.metrics import SLO, goodput_req_per_s

    r = request_metrics(_events())
    assert goodput_req_per_s(r, 6.0, SLO(ttft_s=2.0)) == pytest.approx(1 / 6)
    assert goodput_req_per_s(r, 6.0, SLO()) == pytest.approx(2 / 6)
    assert math.isnan(goodput_req_per_s(r, 0.0, SLO()))


def test_occupancy_counts_queued_prefilling_and_running_after_each_event_time():
    from workbench.observe.metrics import occupancy, occupancy_at

    ev = events_frame(
        event_log(
            """
            submit 0 0 0.0
            admit 0 0 1.0
            submit 1 0 1.0  # same time
            join 0 0 2.0
            submit 2 0 0.5  # a submit pinned earlier than the log order
            evict 0 3 4.0
            """
        )
    )
    occ = occupancy(ev)
    assert occ.values.tolist() == [
        [0.0, 1, 0, 0],
        [0.5, 2, 0, 0],
        [1.0, 2, 1, 0],
        [2.0, 2, 0, 1],
        [4.0, 2, 0, 0],
    ]
    at = occupancy_at(occ, [-1.0, 1.5, 9.0])
    assert at[["queued", "prefilling", "running"]].values.tolist() == [[0, 0, 0], [2, 1, 0], [2, 0, 0]]


def test_occupancy_follows_preemption_and_aborts():
    from workbench.observe.metrics import occupancy

    ev = events_frame(
        event_log(
            """
            submit 0 0 0.0
            submit 1 0 0.0
            admit 0 0 1.0
            join 0 0 1.0
            preempt 0 1 2.0
            finish 1 1 3.0 finish_reason=abort
            admit 0 2 4.0
            join 0 2 4.0
            finish 0 3 5.0 finish_reason=length
            evict 0 3 5.0
            """
        )
    )
    assert occupancy(ev).values.tolist() == [
        [0.0, 2, 0, 0],
        [1.0, 1, 0, 1],
        [2.0, 2, 0, 0],
        [3.0, 1, 0, 0],
        [4.0, 0, 0, 1],
        [5.0, 0, 0, 0],
    ]


def test_padding_waste_overall_weights_every_slot_of_every_step():
    from workbench.observe.metrics import padding_waste_overall

    assert padding_waste_overall([2, 0], [8, 4]) == pytest.approx(2 / 12)
    assert padding_waste_overall([], []) == 0.0


def test_batch_size_per_step_drops_at_a_preemption_and_rises_when_the_row_rejoins():
    from workbench.observe.metrics import occupancy, step_metrics

    ev = event_log(
        """
        submit 0 0 0.0
        submit 1 0 0.0
        admit 0 0 0.1
        admit 1 0 0.1
        join 0 0 0.2
        join 1 0 0.2
        """
    )
    ev += [Event("token", u, s, 1.0 + s, token=5) for s in range(4) for u in (0, 1)]
    ev += event_log(
        """
        preempt 0 4 4.5
        token 1 4 5.0 token=5
        admit 0 5 5.2
        join 0 5 5.3
        """
    )
    ev += [Event("token", u, s, 1.0 + s, token=5) for s in (5, 6) for u in (0, 1)]
    frame = events_frame(ev)
    assert step_metrics(frame).batch_size.tolist() == [2, 2, 2, 2, 1, 2, 2]
    by_step = occupancy(frame, by="step").set_index("step")
    assert by_step.loc[4].tolist() == [1, 0, 1] and by_step.loc[5].tolist() == [0, 0, 2]
    with pytest.raises(ValueError, match="by must be"):
        occupancy(frame, by="row")


def test_prefill_chunks_are_timed_from_the_event_before_them_and_leave_the_decode_rate_alone():
    from workbench.observe.metrics import prefill_chunks, prefill_tok_per_s, step_metrics

    ev = events_frame(
        event_log(
            """
            submit 0,1 0 0.0
            admit 0,1 0 1.0
            prefill 0 0 3.0 n_tokens=8
            prefill 1 0 3.0 n_tokens=4  # one batched chunk: 2 s
            join 0,1 0 3.5
            token 0,1 0 4.0 token=1
            submit 2 1 4.2
            admit 2 1 4.5
            prefill 2 1 5.5 n_tokens=10  # 1 s
            token 0,1 1 6.0 token=1
            """
        )
    )
    chunks = prefill_chunks(ev)
    assert chunks[["rows", "tokens", "chunk_s"]].values.tolist() == [[2, 12, 2.0], [1, 10, 1.0]]
    assert chunks.tok_per_s.tolist() == [6.0, 10.0] and prefill_tok_per_s(ev) == 22 / 3.0
    steps = step_metrics(ev)
    assert steps.prefill_s.tolist() == [2.0, 1.0] and steps.step_s.tolist()[1] == 2.0
    assert steps.tok_per_s.tolist()[1] == 2 / (2.0 - 1.0)  # decode alone, not the prefill in between
