"""The per-request LoRA views from a hand-built bank and snapshot: which slot each row
gathers at each wrapped layer (grid, text, figure), and a run's slots coloured by adapter."""

from types import SimpleNamespace

import numpy as np
import pytest
from matplotlib.colors import to_hex

from workbench.observe.events import Event
from workbench.views.adapters import (
    ADAPTER_COLOURS,
    BASE,
    adapter_slots,
    adapters_text,
    render_adapter_slots,
    render_adapters,
    wrapped_layers,
)

L = "model.layers.{}.{}"
BANK = SimpleNamespace(
    names=("numbers", "prose"),
    adapters={
        "numbers": SimpleNamespace(targets=(L.format(1, "mlp.down_proj"), L.format(1, "self_attn.q_proj"))),
        "prose": SimpleNamespace(
            targets=tuple(L.format(i, m) for i in (0, 1, 10) for m in ("mlp.down_proj", "self_attn.q_proj"))
        ),
    },
)
SNAP = SimpleNamespace(uids=(4, 7, 9), adapters=("prose", "numbers", None))


def test_the_wrapped_layers_run_in_the_models_order_and_each_row_gathers_its_adapters_slot():
    assert wrapped_layers(BANK) == [
        L.format(0, "self_attn.q_proj"),
        L.format(0, "mlp.down_proj"),
        L.format(1, "self_attn.q_proj"),
        L.format(1, "mlp.down_proj"),
        L.format(10, "self_attn.q_proj"),  # layer 10 after layer 1, not between 1 and 2
        L.format(10, "mlp.down_proj"),
    ]
    assert adapter_slots(SNAP, BANK).tolist() == [[2] * 6, [0, 0, 1, 1, 0, 0], [0] * 6]
    with pytest.raises(ValueError, match="row 0 selects adapter 'poetry'"):
        adapter_slots(SimpleNamespace(uids=(0,), adapters=("poetry",)), BANK)


def test_the_text_form_says_where_each_row_gets_a_delta():
    assert adapters_text(SNAP, BANK).splitlines() == [
        "6 wrapped Linear layers; slot 0 = base model (zero delta)",
        "uid 4 | prose   slot 2 | a delta at 6 of 6 layers",
        "uid 7 | numbers slot 1 | a delta at 2 of 6 layers (layer 1: q, down)",
        "uid 9 | none    slot 0 | no delta (the base model)",
    ]


def test_the_figure_labels_each_cell_with_its_slot_and_names_the_rows_and_layers():
    fig = render_adapters(SNAP, BANK, title="lora")
    ax = fig.axes[0]
    cells = [t.get_text() for t in ax.texts if t.get_text().isdigit()]
    assert cells == [str(v) for v in adapter_slots(SNAP, BANK).ravel()]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["uid 4: prose", "uid 7: numbers", "uid 9: none"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["q", "down"] * 3
    assert {t.get_text() for t in ax.texts} >= {"layer 0", "layer 1", "layer 10"}
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["base model: zero delta (slot 0)", "numbers (slot 1)", "prose (slot 2)"]
    image = ax.images[0]
    rgba = image.cmap(image.norm(image.get_array()))
    assert to_hex(rgba[1, 2]) == ADAPTER_COLOURS[0] and to_hex(rgba[2, 0]) == BASE


def _run():
    """uid 0 (prose) steps 0-2 in slot 0, uid 1 (base) steps 0-1 in slot 1, then uid 2
    (numbers) takes slot 1 at step 3 after an idle step."""
    ev = [Event("join", 0, 0, 0.0), Event("join", 1, 0, 0.0)]
    ev += [Event("token", u, s, 0.0) for s in range(3) for u in (0, 1) if not (u == 1 and s == 2)]
    ev += [Event("evict", 1, 2, 0.0), Event("join", 2, 3, 0.0), Event("token", 2, 3, 0.0)]
    return ev


def test_the_run_figure_colours_each_token_by_its_rows_adapter_and_hatches_idle_slots():
    adapter_of = {0: "prose", 1: None, 2: "numbers"}
    fig = render_adapter_slots(_run(), 2, adapter_of, BANK.names)
    ax = fig.axes[0]
    image = ax.images[0]
    rgba = image.cmap(image.norm(image.get_array()))
    hexes = np.vectorize(to_hex, signature="(n)->()")(rgba)
    assert hexes[0, :3].tolist() == [ADAPTER_COLOURS[1]] * 3  # prose
    assert hexes[1].tolist()[:2] == [BASE] * 2 and hexes[1, 3] == ADAPTER_COLOURS[0]  # base, then numbers
    hatched = [p for p in ax.patches if p.get_hatch() == "//"]
    assert [(p.get_x() + 0.5, p.get_y() + 0.5) for p in hatched] == [(3.0, 0.0), (2.0, 1.0)]
    assert [t.get_text() for t in ax.texts] == ["uid 0", "uid 1", "uid 2"]
    with pytest.raises(ValueError, match=r"\[2\] missing"):
        render_adapter_slots(_run(), 2, {0: "prose", 1: None}, BANK.names)
