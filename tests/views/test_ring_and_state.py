"""Ring-buffer and state-vs-KV views on live tiny models and hand-built snapshots."""

import numpy as np
import pytest
from matplotlib.figure import Figure

import workbench as wb
from tests.views.test_views import full_snapshot
from workbench.runtime.loading import DATA_DIR
from workbench.views.ring import render_ring, ring_cells, slot_positions
from workbench.views.state import group_bytes, render_state, state_text
from workbench.workloads.workload import prompt_maker, prompt_of_length


def test_ring_cells_put_the_write_slot_at_the_write_index_once_wrapped_else_last():
    assert ring_cells(np.array([True, True, False]), 0, True) == ["write", "attended", "masked"]
    assert ring_cells(np.array([False, True, True]), None, False) == ["masked", "attended", "write"]


def two_window_rows() -> wb.Scheduler:
    """tiny-gemma3 (a window of 8) after admitting a 3-token and an 11-token prompt."""
    model, tokenizer = wb.load(DATA_DIR / "models" / "tiny-gemma3")
    prompt = prompt_maker(tokenizer)
    sched = wb.Scheduler(model, tokenizer, max_batch=2)
    sched.submit(wb.Request(prompt=prompt(3), max_tokens=4))
    sched.submit(wb.Request(prompt=prompt(11, 60), max_tokens=4))
    sched.admit()
    return sched


def test_rings_of_a_live_window_group_follow_the_snapshots_write_index():
    sched = two_window_rows()
    snaps = [sched.snapshot()]
    sched.step()
    snaps.append(sched.snapshot())
    for snap in snaps:
        g = snap.group("window8")
        assert [ring_cells(m, g.write_index, g.wrapped).index("write") for m in g.mask] == [g.write_index] * 2
    fig = render_ring(snaps, "window8")
    assert isinstance(fig, Figure)
    with pytest.raises(ValueError, match="not a sliding window"):
        render_ring(snaps, "full")


def test_each_slot_is_labelled_with_the_token_position_it_holds_and_a_steps_rings_sit_in_one_line():
    snap = two_window_rows().snapshot()
    g = snap.group("window8")
    short, long = (slot_positions(m, g.write_index, g.wrapped, o) for m, o in zip(g.mask, snap.offset))
    # the 3-token row: its tokens 0, 1, 2 in slots 6, 7, 0, position 3 written to slot 1 next
    assert short == [2, 3, None, None, None, None, 0, 1] and g.write_index == 1
    # the 11-token row has wrapped: slot 1 is written with 11, over the oldest token (3)
    assert long == [10, 11, 4, 5, 6, 7, 8, 9]
    for m, t, o in zip(g.mask, g.mask_temporal, snap.offset):  # agrees with the temporal mask
        held = sorted(p for p in slot_positions(m, g.write_index, g.wrapped, o) if p is not None)
        assert held == list(range(int(o) - int(t.sum()) + 1, int(o) + 1))
    fig = render_ring([snap], "window8")
    rings = [ax for ax in fig.axes if ax.patches]
    assert len(rings) == 2 and len({round(ax.get_position().y0, 3) for ax in rings}) == 1  # one line
    assert rings[1].get_title().endswith("writes 11 over 3")
    assert rings[0].get_title().endswith("writes 3 over padding")
    assert "11" in [t.get_text() for t in rings[1].texts]


def test_state_bytes_stay_flat_while_the_kv_cache_grows():
    model, tokenizer = wb.load(DATA_DIR / "models" / "tiny-qwen3-next")
    sched = wb.Scheduler(model, tokenizer, max_batch=2, history_size=64)
    sched.submit(wb.Request(prompt=prompt_of_length(tokenizer, 3), max_tokens=6, stop_ids=[]))
    sched.run()
    shown = [s for s in sched.history if s.batch_size]
    ssm = [group_bytes(s, s.group("ssm")) for s in shown]
    full = [group_bytes(s, s.group("full")) for s in shown]
    assert len(set(ssm)) == 1 and full == sorted(full) and full[-1] > full[0]
    assert full[0] == shown[0].group("full").token_bytes * shown[0].kv_width_tokens
    assert state_text(shown).splitlines()[0].split() == [
        "step",
        "rows",
        "longest",
        "context",
        "ssm",
        "KiB",
        "full",
        "KiB",
    ]
    assert isinstance(render_state(list(sched.history)), Figure)
    with pytest.raises(ValueError, match="a snapshot with rows"):
        render_state([full_snapshot(uids=(), left_padding=(), width=0)])


def test_a_pure_recurrent_snapshot_says_it_has_no_kv_cache():
    model, tokenizer = wb.load(DATA_DIR / "models" / "tiny-mamba2")
    sched = wb.Scheduler(model, tokenizer, max_batch=2)
    sched.submit(wb.Request(prompt=prompt_of_length(tokenizer, 3), max_tokens=2))
    sched.admit()
    head = sched.snapshot().text().splitlines()[0]
    assert "no KV cache (recurrent state only)" in head and "KV width" not in head and "state bytes" in head


def hybrid_snapshot(context: int, state_bytes: int = 2200, token_bytes: int = 100):
    """A one-row stand-in of a hybrid snapshot: an ``ssm`` state and a ``full`` KV cache of
    ``context`` positions."""
    from types import SimpleNamespace

    groups = (
        SimpleNamespace(name="ssm", kv_bytes=state_bytes, token_bytes=0, kv_width_tokens=0),
        SimpleNamespace(name="full", kv_bytes=0, token_bytes=token_bytes, kv_width_tokens=context),
    )
    return SimpleNamespace(
        batch_size=1,
        context_tokens=(context,),
        groups=groups,
        group=lambda name: next(g for g in groups if g.name == name),
    )


def test_the_crossing_is_where_the_kv_cache_first_holds_more_than_the_state_and_is_drawn():
    from workbench.views.state import crossing_tokens

    history = [hybrid_snapshot(c) for c in range(18, 30)]
    assert crossing_tokens(history) == 23  # 22 x 100 bytes equals the 2200-byte state: not more
    assert crossing_tokens(history[:5]) is None
    ax = render_state(history).axes[0]
    (line,) = [ln for ln in ax.lines if ln.get_linestyle() == ":"]
    assert list(line.get_xdata()) == [23, 23]
    assert ax.texts[0].get_text().startswith("from 23 tokens on, the KV cache")
    assert not [ln for ln in render_state(history[:5]).axes[0].lines if ln.get_linestyle() == ":"]


def test_the_ring_says_its_orange_slot_shows_the_fed_token_not_what_the_slot_holds():
    fig = render_ring([two_window_rows().snapshot()], "window8")
    # the orange slot of uid 1's ring is labelled 11 (the fed token) while it still holds 3:
    # the subtitle and the legend must say what orange shows
    subtitle = fig._suptitle.get_text()
    assert "in orange, the fed token about to be written there" in subtitle
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[0] == "the slot the fed token is written to (shows the fed token)"
    ring = next(ax for ax in fig.axes if ax.patches)
    slot_numbers = [
        t for t in ring.texts if t.get_text() in {str(j) for j in range(8)} and t.get_fontsize() == 8
    ]
    assert len(slot_numbers) >= 8  # the slot numbers outside: 8 pt, not x-small
