"""One forward described once (:mod:`workbench.engine.forward`) and the one place its levers
are installed (:class:`workbench.engine.forward.ForwardLevers`)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import mlx.nn as nn
import pytest

from workbench.engine.forward import DECODE, PACKED, PREFILL, VERIFY, Forward, ForwardLevers
from workbench.engine.levers.invariant import Invariance
from workbench.engine.levers.lora import AdapterBank, Selection
from workbench.engine.model_hooks import hooks_of
from workbench.engine.packed.verify import verify_chunks
from workbench.observe.packed import Chunk


def row(uid: int, adapter: str | None) -> SimpleNamespace:
    """A batch row as the description reads it (``uid``, ``valid.request.adapter``)."""
    return SimpleNamespace(uid=uid, valid=SimpleNamespace(request=SimpleNamespace(adapter=adapter)))


def bank() -> AdapterBank:
    """A bank of two adapters with no layers: the selection alone is what is checked."""
    return AdapterBank(("a", "b"), {}, {}, (0.0, 2.0, 0.5), Selection(), 0)


def test_a_padded_decode_describes_one_token_per_row_each_sampling():
    f = Forward.of_rows(DECODE, [row(7, None), row(3, "a"), row(9, "b")], [5, 2, 11])
    assert f.kind == DECODE
    assert f.uids == (7, 3, 9) and f.adapters == (None, "a", "b")
    assert f.held == (5, 2, 11) and f.n_tokens == (1, 1, 1)
    assert f.samples == (True, True, True) and f.verifies == (0, 0, 0)
    assert f.token_positions() == [5, 2, 11]  # left padding is the layout's, not the description's
    assert f.sampling() == [0, 1, 2]


def test_a_verify_describes_each_rows_drafts_over_the_padded_width():
    drafts = [[4, 5, 6], [], [8]]
    f = Forward.of_rows(VERIFY, [row(1, "a"), row(2, None), row(3, "b")], [10, 4, 7], 4, verifies=[3, 0, 1])
    assert f.n_tokens == (4, 4, 4) and f.verifies == tuple(map(len, drafts))
    assert (
        f.token_adapters() == ["a"] * 4 + [None] * 4 + ["b"] * 4
    )  # each row's adapter at all 1 + K positions
    assert f.token_positions()[:4] == [10, 11, 12, 13]


def test_a_packed_forward_describes_chunks_per_token_and_which_sample():
    chunks = (Chunk(0, 5, 1, "decode"), Chunk(2, 0, 6, "prefill", samples=False), Chunk(1, 3, 2, "prefill"))
    f = Forward.of_chunks(chunks, {0: "a", 1: None, 2: "b"})
    assert f.kind == PACKED and f.uids == (0, 2, 1)
    assert f.token_adapters() == ["a"] + ["b"] * 6 + [None] * 2
    assert f.token_positions() == [5, 0, 1, 2, 3, 4, 5, 3, 4]
    assert f.samples == (True, False, True) and f.sampling() == [0, 2]
    assert f.verifies == (0, 0, 0)


def test_a_packed_verify_counts_drafts_on_the_rows_first_chunk_only():
    chunks = verify_chunks([Chunk(0, 5, 1, "decode"), Chunk(1, 2, 1, "decode")], {0: [7, 8]})
    f = Forward.of_chunks(chunks, {0: None, 1: None}, {0: [7, 8]})
    assert f.uids == (0, 0, 0, 1) and f.held == (5, 6, 7, 2)
    assert f.verifies == (2, 0, 0, 0)


def test_a_description_refuses_an_unknown_kind_or_ragged_fields():
    with pytest.raises(ValueError, match="kind 'sample'"):
        Forward("sample", (1,), (None,), (0,), (1,), (True,), (0,))
    with pytest.raises(ValueError, match="held: 2 entries for 1 segments"):
        Forward(DECODE, (1,), (None,), (0, 1), (1,), (True,), (0,))
    with pytest.raises(KeyError):
        Forward.of_chunks([Chunk(4, 0, 1, "decode")], {})


def test_applied_selects_each_rows_adapter_for_the_forward_only():
    b = bank()
    levers = ForwardLevers(nn.Linear(2, 2), adapters=b)
    with levers.applied(Forward.of_rows(DECODE, [row(0, "b"), row(1, None), row(2, "a")], [3, 3, 3])) as path:
        assert b.selection.rows.tolist() == [2, 0, 1]
        assert b.selection.scale.reshape(-1).tolist() == [0.5, 0.0, 2.0]
        assert path == ""  # no fast paths configured
    assert b.selection.rows is None and b.selection.scale is None


def test_applied_hands_a_packed_forward_its_tokens_to_the_per_token_selection():
    seen = []

    @contextlib.contextmanager
    def select_tokens(bank, chunks, adapter_of):
        seen.append(([(c.uid, c.n_tokens) for c in chunks], dict(adapter_of)))
        yield

    levers = ForwardLevers(nn.Linear(2, 2), adapters=bank(), select_tokens=select_tokens)
    chunks = (Chunk(0, 5, 1, "decode"), Chunk(1, 0, 3, "prefill"))
    with levers.applied(Forward.of_chunks(chunks, {0: "a", 1: None})):
        pass
    assert seen == [([(0, 1), (1, 3)], {0: "a", 1: None})]
    with pytest.raises(ValueError, match="select_tokens"):
        with ForwardLevers(nn.Linear(2, 2), adapters=bank()).applied(
            Forward.of_chunks(chunks, {0: "a", 1: None})
        ):
            pass


@pytest.mark.parametrize(
    ("kind", "hooked"), [(PREFILL, False), (DECODE, True), (VERIFY, True), (PACKED, True)]
)
def test_the_invariant_mode_hooks_every_forward_but_a_padded_prefill_chunk(kind, hooked):
    model = nn.Sequential(nn.Linear(2, 2))
    levers = ForwardLevers(model, invariant=Invariance("cpu", {}))
    f = Forward(kind, (0,), (None,), (4,), (1,), (kind != PREFILL,), (0,))
    with levers.applied(f):
        assert (hooks_of(model).projections is not None) is hooked
    assert hooks_of(model).projections is None


def test_the_quantized_attention_path_is_set_on_padded_forwards_only():
    model = nn.Sequential(nn.Linear(2, 2))
    levers = ForwardLevers(model, quantized_attention="dequantize")
    with levers.applied(Forward.of_rows(PREFILL, [row(0, None)], [0], 8, samples=False)):
        assert hooks_of(model).quantized is not None
    with levers.applied(Forward.of_chunks([Chunk(0, 0, 8, "prefill")], {0: None})):
        assert hooks_of(model).quantized is None  # pages attend by themselves
    assert hooks_of(model).quantized is None
