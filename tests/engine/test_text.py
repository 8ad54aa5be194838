"""Stop strings and streaming text (workbench/engine/text.py and the scheduler's text path)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.engine.text import RowText, sync, visible_text

pytestmark = pytest.mark.model


def _solo(make_sched, request):
    sched = make_sched()
    uid = sched.submit(request)
    sched.run()
    return sched, uid


def _straddling_stop(tokenizer, tokens):
    """A 3-character substring of the decoded tokens that begins in one token and ends in a
    later one (so it can only be found across a token boundary), its start, and the index of
    the token that completes it."""
    ends = [len(tokenizer.decode(tokens[: i + 1])) for i in range(len(tokens))]
    text = tokenizer.decode(tokens)
    for i in range(len(tokens) - 1):
        start = ends[i] - 1  # the last character of token i ...
        stop = text[start : start + 3]  # ... and the next characters, from later tokens
        if start >= 4 and ends[i] > (ends[i - 1] if i else 0) and len(stop) == 3 and text.find(stop) == start:
            return stop, start, next(j for j, e in enumerate(ends) if e >= start + 3)
    raise AssertionError("no straddling substring found")


def test_a_stop_string_across_token_boundaries_ends_the_row_before_it_and_nothing_after_leaks(
    make_sched, prompt
):
    base = wb.Request(prompt=prompt(9, 40), max_tokens=40, stop_ids=[])
    free, u = _solo(make_sched, base)
    tokens, full = free.tokens(u), free.text(u)
    stop, start, done = _straddling_stop(free.tokenizer, tokens)
    sched, uid = _solo(
        make_sched, wb.Request(prompt=prompt(9, 40), max_tokens=40, stop_ids=[], stop=["@@never@@", stop])
    )
    assert sched.finish_reason(uid) == "stop"
    assert sched.tokens(uid) == tokens[: done + 1]  # the row ended on the token completing the stop string
    assert sched.text(uid) == full[:start] and stop not in sched.text(uid)
    report = sched.report().requests
    assert report.set_index("uid").loc[uid, "text"] == full[:start]
    assert report.set_index("uid").loc[uid, "finish_reason"] == "stop"


def test_single_token_stop_ids_still_end_a_row_and_hide_their_token(make_sched, prompt):
    free, u = _solo(make_sched, wb.Request(prompt=prompt(9, 40), max_tokens=10, stop_ids=[]))
    third = free.tokens(u)[2]
    sched, uid = _solo(
        make_sched, wb.Request(prompt=prompt(9, 40), max_tokens=10, stop_ids=[third], stop=["@@"])
    )
    first = free.tokens(u).index(third)
    assert sched.tokens(uid) == free.tokens(u)[: first + 1] and sched.finish_reason(uid) == "stop"
    assert sched.text(uid) == free.tokenizer.decode(free.tokens(u)[:first])


def test_stream_yields_pieces_that_join_to_the_text_and_never_show_a_stop_string_prefix(make_sched, prompt):
    free, u = _solo(make_sched, wb.Request(prompt=prompt(9, 40), max_tokens=40, stop_ids=[]))
    stop, start, _ = _straddling_stop(free.tokenizer, free.tokens(u))
    sched = make_sched(max_batch=2)
    uid = sched.submit(wb.Request(prompt=prompt(9, 40), max_tokens=40, stop_ids=[], stop=[stop]))
    other = sched.submit(wb.Request(prompt=prompt(5, 3), max_tokens=30, stop_ids=[]))
    pieces = list(sched.stream(uid))
    assert sched.finish_reason(uid) == "stop" and len(pieces) >= 2
    assert "".join(pieces) == sched.text(uid) == free.text(u)[:start]
    assert all(p for p in pieces)
    assert not sched.status(other).value == "queued" and sched.tokens(other)  # the neighbour advanced too


def test_stream_all_gives_every_row_its_text_piece_by_piece(make_sched, prompt):
    sched = make_sched(max_batch=3)
    uids = [
        sched.submit(wb.Request(prompt=prompt(4 + 3 * i, 17 * i), max_tokens=6 + 4 * i, stop_ids=[]))
        for i in range(5)
    ]
    got: dict[int, str] = {}
    counts: dict[int, int] = {}
    for uid, piece in sched.stream_all():
        got[uid] = got.get(uid, "") + piece
        counts[uid] = counts.get(uid, 0) + 1
    assert sched.idle
    for uid in uids:
        assert got.get(uid, "") == sched.text(uid) == sched.tokenizer.decode(sched.tokens(uid))
    assert max(counts.values()) > 1


def test_a_multi_byte_character_split_across_tokens_is_never_streamed_half_done(bundled):
    _, tokenizer = bundled
    text = "s = 'héllo wörld ✓ ünïcode →'\n"
    tokens = tokenizer.encode(text)
    assert any("\ufffd" in tokenizer.decode([t]) for t in tokens)  # some character really is split
    row = RowText(tokenizer)
    seen = []
    for t in tokens:
        row.feed(t)
        seen.append(row.ready)
    assert all("\ufffd" not in s for s in seen)
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:]))  # only ever grows
    sync(row, tokens, True)
    assert row.text == text == visible_text(tokenizer, tokens, "length", set())


def test_a_stop_string_is_held_back_while_it_may_still_complete(bundled):
    _, tokenizer = bundled
    row = RowText(tokenizer, ["\n\n"])
    for t in tokenizer.encode("x = 1\n"):
        row.feed(t)
    assert row.text.startswith("x = 1") and row.ready == "x = 1"
    row.close()
    assert row.ready == row.text == "x = 1\n"


def test_text_state_is_undone_by_an_interrupted_step_and_carried_by_checkpoint_and_fork(make_sched, prompt):
    free, u = _solo(make_sched, wb.Request(prompt=prompt(9, 40), max_tokens=40, stop_ids=[]))
    stop, start, done = _straddling_stop(free.tokenizer, free.tokens(u))
    hits = {"n": 0}

    def interrupt_on_the_stop_token(uid, token):
        hits["n"] += 1
        if hits["n"] == done + 1:
            raise KeyboardInterrupt

    sched = make_sched()
    uid = sched.submit(
        wb.Request(
            prompt=prompt(9, 40),
            max_tokens=40,
            stop_ids=[],
            stop=[stop],
            on_token=interrupt_on_the_stop_token,
        )
    )
    cp = None
    with pytest.raises(KeyboardInterrupt):
        while True:
            sched.admit()
            if len(sched.tokens(uid)) == 2:
                cp = sched.checkpoint()
            before = sched.text(uid)
            sched.step()
            sched.filter()
    assert sched.text(uid) == before and sched.finish_reason(uid) is None and sched.check().ok
    sched.run()
    assert sched.text(uid) == free.text(u)[:start] and sched.finish_reason(uid) == "stop"
    branch = sched.fork()  # independent: restoring the original below does not touch it
    sched.restore(cp)
    assert sched.finish_reason(uid) is None and len(sched.tokens(uid)) == 2
    rest = "".join(sched.stream(uid))
    assert rest == sched.text(uid) == free.text(u)[:start]
    assert branch.text(uid) == free.text(u)[:start] and branch.finish_reason(uid) == "stop"


def _interrupted_at_every_line(call, reset, check):
    """``call()`` interrupted by KeyboardInterrupt at its 1st executed engine line, then
    (after ``reset()``) at its 2nd, ... until it completes; ``check()`` after each
    interrupt. Returns the number of interrupts and the completed call's result."""
    from .interrupts import Injector, LineTracer

    injector = Injector()
    tracer, k = LineTracer(injector), 1
    while True:
        reset()
        injector.arm(k)
        try:
            with tracer.tracing():
                result = call()
        except KeyboardInterrupt:
            check(k)
            k += 1
            continue
        finally:
            injector.disarm()
        return k - 1, result


def test_text_rebuilt_after_a_restore_is_interrupt_safe_and_the_stop_is_still_found(make_sched, prompt):
    """A KeyboardInterrupt at any line of the rebuild of a row's text (after ``restore``,
    ``fork`` or a rollback the text is rebuilt from the tokens on the next read) leaves no
    text claiming a token it never decoded: ``check()`` is ok, the next read gives the
    uninterrupted text, and a stop string completed later still ends the row there."""
    free, u = _solo(make_sched, wb.Request(prompt=prompt(9, 40), max_tokens=40, stop_ids=[]))
    stop, start, done = _straddling_stop(free.tokenizer, free.tokens(u))
    sched = make_sched()
    uid = sched.submit(wb.Request(prompt=prompt(9, 40), max_tokens=40, stop_ids=[], stop=[stop]))
    while len(sched.tokens(uid)) < done - 1:
        sched.admit(), sched.step()
    cp = sched.checkpoint()
    expected = visible_text(sched.tokenizer, sched.tokens(uid), None, set(), [stop], closed=False)

    def after_interrupt(k):
        report = sched.check()
        assert report.ok, f"text() interrupted at line {k}:\n{report}"
        assert sched.text(uid) == expected, k  # the next read is whole

    n, text = _interrupted_at_every_line(lambda: sched.text(uid), lambda: sched.restore(cp), after_interrupt)
    assert n >= 20 and text == expected
    for k in range(1, n + 1, 3):  # interrupted at line k, then the row runs on: the stop string ends it
        sched.restore(cp)
        assert _interrupt_once(sched, uid, k)
        sched.run()
        assert sched.finish_reason(uid) == "stop", k
        assert sched.tokens(uid) == free.tokens(u)[: done + 1] and sched.text(uid) == free.text(u)[:start], k


def _interrupt_once(sched, uid, k):
    """Read ``sched.text(uid)`` interrupted at its ``k``-th engine line; True if it was."""
    from .interrupts import Injector, LineTracer

    injector = Injector()
    injector.arm(k)
    try:
        with LineTracer(injector).tracing():
            sched.text(uid)
    except KeyboardInterrupt:
        return True
    finally:
        injector.disarm()
    return False


def test_check_finds_a_text_that_disagrees_with_the_tokens(make_sched, prompt):
    sched = make_sched()
    uid = sched.submit(wb.Request(prompt=prompt(9, 40), max_tokens=12, stop_ids=[], stop=["@@"]))
    for _ in range(6):
        sched.admit(), sched.step()
    sched.text(uid)
    assert sched.check().ok
    state = sched.requests[uid]
    state.text_state.n_tokens += 1  # claims a token it never decoded
    report = sched.check()
    assert not report.ok and f"uid {uid}" in str(report) and "text" in str(report), str(report)
    state.text_state = None
    sched.text(uid)
    state.text_state.feed(sched.tokens(uid)[0])  # decoded a token the row does not have
    assert not sched.check().ok
    state.text_state = None
    assert sched.check().ok
    assert sched.text(uid) == visible_text(
        sched.tokenizer, sched.tokens(uid), None, set(), ["@@"], closed=False
    )


def test_a_stop_check_steps_once_per_new_character_whatever_the_number_of_stop_strings(bundled, monkeypatch):
    """The per-token cost of stop strings does not grow with their number: feeding a row's
    tokens (and reading ``ready`` after each, as a stream does) makes one automaton step per
    new character of text, with 1 stop string or 64 (each 256 characters long)."""
    from workbench.engine import text as text_module
    from workbench.engine.request import MAX_STOP_LENGTH, MAX_STOP_STRINGS

    _, tokenizer = bundled
    tokens = tokenizer.encode("def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n")
    steps = {"n": 0}
    real = text_module.StopAutomaton.step

    def counted(self, state, ch):
        steps["n"] += 1
        return real(self, state, ch)

    monkeypatch.setattr(text_module.StopAutomaton, "step", counted)
    counts = []
    for k in (1, MAX_STOP_STRINGS):
        stops = [(f"\x07{i:03d}" * MAX_STOP_LENGTH)[:MAX_STOP_LENGTH] for i in range(k)]
        row, steps["n"], per_token = RowText(tokenizer, stops), 0, []
        for t in tokens:
            before = steps["n"]
            row.feed(t)
            _ = row.ready  # the property runs the scan being counted
            per_token.append(steps["n"] - before)
        assert row.stop_at is None and sum(per_token) == len(row.text)
        counts.append(per_token)
    assert counts[0] == counts[1]


def _naive(text, stops):
    """(hold, first stop start) by the definition: the longest tail of ``text`` that begins a
    stop string, and the earliest start among stop strings found in ``text``."""
    hold = max((k for s in stops for k in range(1, len(s) + 1) if text.endswith(s[:k])), default=0)
    starts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return hold, min(starts) if starts else None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    stops=st.lists(st.text("abc", min_size=1, max_size=4), min_size=1, max_size=6, unique=True),
    text=st.text("abcd", max_size=30),
)
def test_the_stop_automaton_finds_what_searching_every_string_finds(stops, text):
    from workbench.engine.text import StopAutomaton

    automaton, state, first = StopAutomaton(stops), 0, None
    for i, ch in enumerate(text):
        state = automaton.step(state, ch)
        if first is None and automaton.match[state]:
            first = i + 1 - automaton.match[state]
            assert first == _naive(text[: i + 1], stops)[1]  # the first hit: the earliest start then
        if first is None:
            assert (automaton.depth[state], None) == _naive(text[: i + 1], stops)
