"""The packed views: text forms from a real packed scheduler, figures drawn, the padded
layout refused."""

import pytest

import workbench as wb
from workbench.views.packed import (
    budget_text,
    packed_text,
    render_packed_mask,
    render_page_table,
    render_token_budget,
)
from workbench.workloads.workload import prompt_of_length

pytestmark = pytest.mark.model


@pytest.fixture
def running(bundled):
    model, tok = bundled
    sched = wb.Scheduler(  # not pipelined: the joiner's chunk rides in the very next forward
        model, tok, layout="packed", max_batch=3, page_size=4, max_num_batched_tokens=6, pipeline=False
    )
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 3, 0), max_tokens=6))
    sched.admit()
    sched.step()
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 9, 20), max_tokens=4))
    sched.admit()
    sched.step()
    return sched


def test_the_packed_text_shows_pages_chunks_and_the_mask_of_the_step(running):
    text = packed_text(running.snapshot())
    assert "page table: 3/3 pages of 4 tokens" in text
    assert "packed forward: decode 1 + prefill 5 = 6 tokens of a 6 budget" in text
    assert "       0@3 ####|....." in text and "       1@4 ....|#####" in text


def test_the_budget_text_lists_each_forward_of_the_history(running):
    assert budget_text(running.history).splitlines() == [
        "step  decode  prefill  budget",
        "   1       0        3       6",
        "   2       1        5       6",
    ]


def test_the_figures_draw_from_a_snapshot_and_a_history(running):
    snap = running.snapshot()
    assert (
        render_packed_mask(snap)
        .axes[0]
        .get_title(loc="left")
        .startswith("packed mask of step 2: 6 tokens x 9 keys")
    )
    assert "3/3 pages" in render_page_table(snap).axes[0].get_title(loc="left")
    assert len(render_token_budget(running.history).axes[0].patches) == 4


def test_a_padded_snapshot_is_refused_naming_the_layout(make_sched):
    with pytest.raises(ValueError, match="layout='packed'"):
        packed_text(make_sched().snapshot())


def test_the_panel_on_a_packed_scheduler_shows_its_mask_page_table_and_text(running):
    from workbench import views

    panel = views.Panel(running)
    panel.buttons["Step"].click()
    assert panel.sched.step_index == 3 and panel.error.value == ""
    assert bytes(panel.mask_image.value).startswith(b"\x89PNG") and bytes(panel.kv_image.value).startswith(
        b"\x89PNG"
    )
    assert "page table: " in panel.mask_ascii.value and "packed mask: T=" in panel.mask_ascii.value
