"""An empty batch's mask figure says so and names no Panel button: the same figure is the HTML
replay's mask pane (``views.export``), which has no Submit or Admit button, and a notebook's
figure; the Panel says what to press in its own status line (issue 43: notebook 01's replay
ended on "submit a prompt, then Admit")."""

import workbench as wb
from workbench.views.mask import render_masks


def test_an_empty_batchs_mask_figure_names_no_button(bundled):
    model, tokenizer = bundled
    snap = wb.Scheduler(model, tokenizer, max_batch=2).snapshot()
    assert snap.batch_size == 0
    texts = [t.get_text() for ax in render_masks(snap).axes for t in ax.texts]
    assert texts == ["no rows in the batch"], texts
