"""2-D attention view: exact text forms on hand-built forwards, and the picture's mask equal
to what the model's layers receive during real prefill forwards (the mask oracle)."""

import numpy as np
import pytest
from matplotlib.figure import Figure

import workbench as wb
from tests.views.test_views import full_snapshot
from workbench.observe.events import Event
from workbench.observe.forward_masks import decode_forward, prefill_forwards
from workbench.verify.mask_oracle import prefill_mismatches, recorded_masks
from workbench.views.attention import (
    CACHED,
    LATER,
    NEW,
    OWN,
    PAD,
    attention_cells,
    attention_text,
    render_attention,
    stacked_cells,
)
from workbench.workloads.workload import prompt_maker


def chunks(*sizes, uid=0):
    log = [Event("admit", uid, 0, 0.0, n_tokens=sum(sizes) + 1)]
    log += [Event("prefill", uid, 0, 0.0, n_tokens=n) for n in sizes]
    return prefill_forwards(log)


def test_text_of_a_chunk_after_cached_tokens_marks_cached_new_own_and_later_keys():
    assert attention_text(chunks(2, 3)[1]) == "\n".join(
        [
            "prefill uid 0: positions 2-4, 2 cached",
            "uid 0  keys 0-4",
            "  q 2 | c c @ . .",
            "  q 3 | c c # @ .",
            "  q 4 | c c # # @",
        ]
    )


def test_text_of_a_padded_row_marks_its_pad_queries_and_keys():
    log = [Event("prefill", 0, 0, 0.0, n_tokens=3), Event("prefill", 1, 0, 0.0, n_tokens=1)]
    assert attention_text(prefill_forwards(log)[0]).splitlines()[-4:] == [
        "uid 1  keys 0-2",
        "  q 0 | @ p p",
        "  q 1 | p p p",
        "  q 2 | p p p",
    ]


def test_text_of_a_decode_step_is_one_line_per_row():
    text = attention_text(decode_forward(full_snapshot(uids=(7, 9), left_padding=(0, 2), width=3)))
    assert text.splitlines()[-2:] == ["  uid 7 | c c c @", "  uid 9 | p p c @"]


def test_cells_attend_exactly_where_the_mask_does_outside_padding():
    log = [Event("prefill", 0, 0, 0.0, n_tokens=4), Event("prefill", 1, 0, 0.0, n_tokens=2)]
    for fm in prefill_forwards(log) + chunks(3, 3, 2):
        cells = attention_cells(fm)
        pad = fm.query_padding[:, :, None] | fm.key_padding[:, None, :]
        assert np.array_equal(np.isin(cells, [NEW, CACHED, OWN]), fm.mask & ~pad)
        assert np.array_equal(cells == PAD, pad)


def test_stacked_chunks_form_the_whole_prompts_causal_triangle():
    cells, starts = stacked_cells(chunks(3, 3, 2))
    assert starts == [0, 3, 6] and cells.shape == (8, 8)
    assert np.array_equal(cells != LATER, np.tril(np.ones((8, 8), bool)))
    with pytest.raises(ValueError, match="single-row forwards of one uid"):
        stacked_cells(chunks(2) + chunks(2, uid=1))


def test_render_attention_draws_one_axes_per_prefill_row_and_refuses_nothing():
    log = [Event("prefill", 0, 0, 0.0, n_tokens=4), Event("prefill", 1, 0, 0.0, n_tokens=2)]
    fig = render_attention(prefill_forwards(log) + [decode_forward(full_snapshot())])
    assert isinstance(fig, Figure) and len([a for a in fig.axes if a.get_visible() and a.axison]) == 3
    assert len(render_attention(chunks(3, 3), stack=True).axes) == 1
    with pytest.raises(ValueError, match="at least one forward"):
        render_attention([])


@pytest.mark.parametrize("chunked_padding", [False, True], ids=["cpu default", "gpu default: batched chunks"])
@pytest.mark.parametrize(
    "prefill_step_size,lengths", [(2048, (6, 2, 4)), (4, (11,)), (4, (11, 5)), (3, (4, 4))]
)
def test_the_views_prefill_masks_equal_what_the_layers_receive(
    prefill_step_size, lengths, chunked_padding, monkeypatch
):
    """Also with a GPU's default (right-padded groups batched chunk by chunk), where a row with
    no real token left in a chunk still rides in its forward."""
    from workbench.engine import prefill

    monkeypatch.setattr(prefill, "chunked_padding_default", lambda: chunked_padding)
    model, tokenizer = wb.load()
    prompt = prompt_maker(tokenizer)
    sched = wb.Scheduler(model, tokenizer, max_batch=4, prefill_step_size=prefill_step_size)
    for i, n in enumerate(lengths):
        sched.submit(wb.Request(prompt=prompt(n, 30 * i), max_tokens=2))
    forwards = 0
    while not sched.snapshot().batch_size or sched.snapshot().prefilling:
        start = len(sched.events)
        with recorded_masks(model, prefill=True) as seen:
            sched.admit()
        mine = [f for f in prefill_forwards(sched.events) if f.first_event >= start]
        assert seen and prefill_mismatches(mine, seen) == []
        forwards += len(mine)
    assert forwards == len(prefill_forwards(sched.events)) >= 1


@pytest.mark.parametrize("rows,prompt_tokens", [(1, 24), (3, 40), (2, 120)])
def test_the_panels_prefill_grid_labels_never_overlap(rows, prompt_tokens):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from tests.views.test_replay import _overlapping_tick_labels
    from workbench.views.panel import IMAGE_WIDTH_IN

    log = [Event("prefill", uid, 0, 0.0, n_tokens=prompt_tokens) for uid in range(rows)]
    fig = render_attention(prefill_forwards(log), columns=rows, width_in=IMAGE_WIDTH_IN)
    FigureCanvasAgg(fig).draw()
    grids = [a for a in fig.axes if a.get_visible() and a.axison]
    assert len(grids) == rows
    for ax in grids:
        assert len([t for t in ax.get_xticklabels() if t.get_text()]) >= 2
        assert _overlapping_tick_labels(ax) == []


def test_a_decode_step_drawn_alone_names_itself_once():
    fig = render_attention([decode_forward(full_snapshot(uids=(7, 9), left_padding=(0, 2), width=3))])
    titles = [ax.get_title(loc="left") for ax in fig.axes] + [
        fig._suptitle.get_text() if fig._suptitle else ""
    ]
    assert [t for t in titles if t] == [decode_forward(full_snapshot(uids=(7, 9))).label]
