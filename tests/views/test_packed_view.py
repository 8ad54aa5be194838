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
        .axes[1]
        .get_title(loc="left")
        .startswith("packed forward of step 2: 6 tokens x 9 keys")
    )
    assert "3/3 pages" in render_page_table(snap).axes[0].get_title(loc="left")
    assert len(render_token_budget(running.history).axes[0].patches) == 4


def _legend_labels(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_the_packed_mask_legend_lists_only_the_kinds_drawn_and_names_the_query_axis(running, bundled):
    fig = render_packed_mask(running.snapshot())  # a decode row beside a joiner's first chunk: every kind
    assert _legend_labels(fig) == [
        "masked (another request's key, or later)",
        "cached key (an earlier forward)",
        "key of this forward (prefill chunk)",
        "own key (the query's token)",
        "decode query",
        "prefill query",
    ]
    strip = fig.axes[0]
    assert strip.get_ylabel() == "query (uid@position)"
    assert [t.get_text() for t in strip.get_yticklabels()][:2] == ["0@3", "1@0"]
    alone = wb.Scheduler(*bundled, layout="packed", page_size=4)
    alone.submit(wb.Request(prompt="def f(x):", max_tokens=2))
    alone.admit()
    alone.step()  # a first prefill chunk only: no cached key, no decode query
    assert "cached key (an earlier forward)" not in _legend_labels(render_packed_mask(alone.snapshot()))
    assert "decode query" not in _legend_labels(render_packed_mask(alone.snapshot()))


def test_packed_cells_mark_cached_new_and_own_keys():
    from workbench.observe.packed import Chunk
    from workbench.views.packed import CACHED, MASKED, NEW, OWN, packed_cells

    cells = packed_cells((Chunk(0, 2, 1, "decode"), Chunk(1, 1, 2, "prefill")))
    assert cells.tolist() == [
        [CACHED, CACHED, OWN, MASKED, MASKED, MASKED],
        [MASKED, MASKED, MASKED, CACHED, OWN, MASKED],
        [MASKED, MASKED, MASKED, CACHED, NEW, OWN],
    ]


def test_the_page_table_numbers_pages_in_request_order_says_no_free_page_and_writes_kib(running):
    snap = running.snapshot()  # 3/3 pages: uid 0's page, uid 1's two pages, none free
    fig = render_page_table(snap)
    ax = fig.axes[0]
    title = ax.get_title(loc="left")
    assert "KiB held" in title and "bytes" not in title and ",000" not in title
    assert "no free page" in _texts(ax)
    assert sorted(_texts(ax)) == ["0", "0", "1", "no free page"]  # each page's index in its request
    assert _legend_labels(fig) == [
        "tokens held (a full page is all blue)",
        "room left in a partly filled page",
        "free page",
    ]
    running.run()
    running.filter()
    freed = render_page_table(running.snapshot())
    assert "no free page" not in _texts(freed.axes[0])


def test_the_page_table_draws_only_palette_colours(running):
    from matplotlib.colors import to_hex

    from workbench.views import style

    ax = render_page_table(running.snapshot()).axes[0]
    colours = {to_hex(p.get_facecolor()) for p in ax.patches}
    assert colours <= {style.ATTENDED, style.UNUSED, style.LATER}, colours
    assert not ax.images  # no colormap: every cell a patch in a palette colour


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
