"""The compact event-log tables the observe, views and sim tests are written in."""

import pytest

from tests.observe.event_logs import event_log
from workbench.observe.events import Event


def test_a_table_row_is_kind_uid_step_time_then_named_fields():
    log = event_log(
        """
        submit 0 0 0.5 n_tokens=4  # a comment
        token 1 2 3.0 token=7 logprob=-0.25
        finish 1 2 3.0 finish_reason=length
        join 2
        """
    )
    assert log == [
        Event("submit", 0, 0, 0.5, n_tokens=4),
        Event("token", 1, 2, 3.0, token=7, logprob=-0.25),
        Event("finish", 1, 2, 3.0, finish_reason="length"),
        Event("join", 2, 0, 0.0),
    ]


def test_a_row_list_is_the_same_event_for_each_row_in_order():
    assert event_log("token 2,0 3 1.5 token=7") == [
        Event("token", 2, 3, 1.5, token=7),
        Event("token", 0, 3, 1.5, token=7),
    ]


def test_an_unknown_field_is_refused():
    with pytest.raises(TypeError, match="n_tokes"):
        event_log("admit 0 n_tokes=3")
