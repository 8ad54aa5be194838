"""Structured output per row (``workbench.engine.levers.constrained``): ``Request(json_schema=
/ regex= / choices=)`` as a per-row llguidance mask inside the batch.

Constrained and free rows, and different schemas, share one batch: every output satisfies
its constraint (``json.loads`` + ``jsonschema``, ``re.fullmatch``, membership), every free
row equals its solo mlx-lm run token for token, every constrained row equals its
constrained solo run (mlx-lm's ``generate_step`` with the same grammar mask), so no
constraint reaches another row. The grammar state follows the row through preemption,
checkpoint / restore / fork, the prompt cache and interrupted calls.
"""

from __future__ import annotations

import json
import sys

import mlx.core as mx
import pytest

import workbench as wb
from workbench.engine.levers import constrained
from workbench.verify import oracle
from workbench.verify.constrained import constrained_reference, satisfies

from .interrupts import Injector, engine_state, patched_eval

pytest.importorskip("llguidance", reason="structured output needs the `structured` extra (llguidance)")

pytestmark = pytest.mark.model

PERSON = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
COLOR = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["color", "tags"],
    "additionalProperties": False,
}
CONSTRAINTS = [
    dict(json_schema=PERSON),
    dict(json_schema=json.dumps(COLOR)),
    dict(regex=r"[a-z]{2,6}\(\d\)"),
    dict(choices=["yes", "no", "maybe so", "a.b|c"]),
]


def requests(prompt, max_tokens=40):
    """Four constrained requests (two schemas, a regex, choices) and three free ones."""
    out = [
        wb.Request(prompt=prompt(5 + 3 * i, 40 * i), max_tokens=max_tokens, **c)
        for i, c in enumerate(CONSTRAINTS)
    ]
    return out + [wb.Request(prompt=prompt(4 + 7 * i, 300 + 50 * i), max_tokens=12) for i in range(3)]


def run_all(sched, reqs):
    uids = [sched.submit(r) for r in reqs]
    sched.run()
    return uids


@pytest.mark.parametrize("pipeline", [True, False])
def test_constrained_and_free_rows_in_one_batch_each_equal_their_solo_run(
    make_sched, bundled, prompt, pipeline
):
    model, tok = bundled
    sched = make_sched(max_batch=7, pipeline=pipeline)
    reqs = requests(prompt)
    uids = run_all(sched, reqs)
    for uid, req in zip(uids, reqs, strict=True):
        valid = sched.request_of(uid)
        if req.constrained:
            assert sched.finish_reason(uid) == "stop", (uid, sched.text(uid))
            assert satisfies(req, sched.text(uid)), (req, sched.text(uid))
            ref = constrained_reference(model, tok, valid, sched.vocab_size)
        else:
            ref = oracle.solo_reference(model, oracle.ref_request(valid))
        result = oracle.compare_row(uid, oracle.scheduler_trace(sched, uid), ref)
        assert result.match and sched.tokens(uid) == ref.tokens, result.describe()


def test_a_free_row_has_the_same_tokens_beside_constrained_rows_as_beside_free_ones(make_sched, prompt):
    reqs = requests(prompt)
    free_only = [wb.Request(prompt=r.prompt, max_tokens=r.max_tokens) for r in reqs]
    a, b = make_sched(max_batch=7), make_sched(max_batch=7)
    ua, ub = run_all(a, reqs), run_all(b, free_only)
    for i in range(len(CONSTRAINTS), len(reqs)):
        assert a.tokens(ua[i]) == b.tokens(ub[i])
        assert a.logprobs(ua[i]) == b.logprobs(ub[i])  # bit for bit: the mask touched only its own row


def test_a_sampled_constrained_row_equals_itself_alone(make_sched, prompt):
    reqs = [
        wb.Request(prompt=prompt(6, 10 * i), max_tokens=40, temperature=0.9, seed=7 + i, **c)
        for i, c in enumerate(CONSTRAINTS)
    ]
    batched = make_sched(max_batch=4)
    uids = run_all(batched, reqs)
    for uid, req in zip(uids, reqs, strict=True):
        alone = make_sched(max_batch=1)
        (solo,) = run_all(alone, [req])
        assert batched.tokens(uid) == alone.tokens(solo)
        assert batched.finish_reason(uid) == "stop" and satisfies(req, batched.text(uid)), batched.text(uid)


def test_the_constraint_shows_in_the_request_view_and_the_snapshot(make_sched, prompt):
    sched = make_sched(max_batch=2)
    c = sched.submit(wb.Request(prompt=prompt(5), max_tokens=8, regex=r"[0-9]+"))
    f = sched.submit(wb.Request(prompt=prompt(5), max_tokens=8))
    sched.admit()
    assert sched.request(c).constraint == "regex=[0-9]+" and sched.request(f).constraint == ""
    assert sched.snapshot().constraints == ("regex=[0-9]+", "")
    rows = sched.snapshot().text().splitlines()
    assert rows[1].endswith("regex=[0-9]+") and "regex" not in rows[2]


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            dict(json_schema=PERSON, regex="a"),
            r"at most one of json_schema, regex, choices; got \['json_schema', 'regex'\]",
        ),
        (dict(regex="[a-"), r"(?s)regex: llguidance refuses it: .*unclosed character class"),
        (dict(regex=""), r"regex must be a non-empty str"),
        (dict(regex=3), r"regex must be a non-empty str, got 3"),
        (dict(json_schema="{not json"), r"json_schema must be a JSON schema object .* the text is not JSON"),
        (dict(json_schema=[1, 2]), r"json_schema must be a JSON schema object .* got list"),
        (dict(json_schema={"type": "foo"}), r"(?s)json_schema: llguidance refuses it: .*foo"),
        (dict(choices=[]), r"choices must be a non-empty list of non-empty str"),
        (dict(choices="yes"), r"choices must be a non-empty list"),
        (dict(choices=["a", ""]), r"choices\[1\] must be a non-empty str, got ''"),
        (dict(choices=["a", 2]), r"choices\[1\] must be a non-empty str, got 2"),
        # A break-it pass (2026-12-08): llguidance's serde message named no field; the others a bare
        # UnicodeEncodeError.
        (dict(json_schema={"type": "\ud800"}), r"^json_schema must be valid Unicode text: a lone surrogate"),
        (dict(json_schema='{"type": "\\ud800"}'), r"^json_schema must be valid Unicode text"),  # the escape
        (dict(json_schema={"maximum": float("nan")}), r"^json_schema: llguidance refuses it: expected value"),
        (
            dict(regex="a\ud800"),
            r"^regex must be valid Unicode text: a lone surrogate '\\ud800' at character 1",
        ),
        (dict(choices=["a", "\udfff"]), r"^choices\[1\] must be valid Unicode text: a lone surrogate"),
    ],
)
def test_a_bad_constraint_is_refused_at_submit_naming_the_field_and_nothing_changes(
    make_sched, fields, message
):
    sched = make_sched()
    with pytest.raises(ValueError, match=message):
        sched.submit(wb.Request(prompt=[1, 2, 3], **fields))
    assert not sched.requests and not sched.events


@pytest.mark.parametrize("regex", ["a{1000000}", "b|a{1000000}"])
def test_a_constraint_beyond_llguidances_limits_is_refused_at_submit_and_its_neighbours_run_on(
    make_sched, prompt, regex
):
    good = wb.Request(prompt=prompt(5), max_tokens=12, regex=r"[a-z]{2,6}\(\d\)")
    free = wb.Request(prompt=prompt(9, 50), max_tokens=8)
    sched = make_sched(max_batch=3)
    uids = [sched.submit(good), sched.submit(free)]
    sched.admit(), sched.step()
    before = engine_state(sched)
    limit = r"regex: llguidance cannot compile it within its limits \(its lexer fuel ran out\): .*"
    limit += "initial_lexer_fuel=1,000,000"
    for _ in range(2):  # the second time from the cache of compiled grammars, the same refusal
        with pytest.raises(ValueError, match=limit):
            sched.submit(wb.Request(prompt=prompt(5), max_tokens=8, regex=regex))
        assert engine_state(sched) == before
    sched.run()
    alone = make_sched(max_batch=3)
    alone_uids = [alone.submit(good), alone.submit(free)]
    alone.run()
    assert [sched.tokens(u) for u in uids] == [alone.tokens(u) for u in alone_uids]
    assert sched.finish_reason(uids[0]) == "stop" and satisfies(good, sched.text(uids[0]))


def test_a_grammar_is_compiled_once_and_each_row_starts_from_a_copy(make_sched, prompt, monkeypatch):
    compiles = []
    compile_ = constrained._compile
    monkeypatch.setattr(constrained, "_compile", lambda *a: compiles.append(a[0]) or compile_(*a))
    monkeypatch.setattr(constrained, "_COMPILED", type(constrained._COMPILED)())
    sched = make_sched(max_batch=4)
    reqs = [
        wb.Request(prompt=prompt(5 + i, 30 * i), max_tokens=20, regex=r"[a-z]{2,6}\(\d\)") for i in range(4)
    ]
    uids = [sched.submit(r) for r in reqs]
    sched.run()
    assert len(compiles) == 1
    for uid, req in zip(uids, reqs, strict=True):
        assert sched.finish_reason(uid) == "stop" and satisfies(req, sched.text(uid))


def test_a_limit_llguidance_hits_on_a_token_is_named_as_a_limit_not_blamed_on_the_token(bundled, monkeypatch):
    _, tok = bundled
    llg = constrained._llguidance()
    grammar = llg.LLMatcher.grammar_from_regex("a{100000}")
    ll_tok = constrained.ll_tokenizer(tok, 4096)
    # a matcher whose first mask spends its lexer fuel (a tenth of the default: quick), as
    # a row's did before grammars were compiled at submit
    raw = llg.LLMatcher(ll_tok, grammar, log_level=0, limits=llg.LLParserLimits(initial_lexer_fuel=100_000))
    raw.compute_bitmask()
    monkeypatch.setattr(constrained, "compiled", lambda *a: raw)
    row = constrained.RowGrammar(constrained.Constraint("regex", "a{100000}", grammar), ll_tok, 1)
    with pytest.raises(constrained.GrammarError) as caught:
        row.sync(tok.encode("a", add_special_tokens=False))
    message = str(caught.value)
    assert message.startswith(
        "regex: llguidance cannot compile it within its limits (its lexer fuel ran out)"
    )
    assert "initial_lexer_fuel=" in message and message.endswith("(at generated token 0)")
    assert "refuses" not in message


def test_without_llguidance_a_constrained_request_names_the_extra_to_install(make_sched, monkeypatch):
    sched = make_sched()
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance now raises ImportError
    with pytest.raises(ImportError, match=r'pip install -e "\.\[structured\]"'):
        sched.submit(wb.Request(prompt=[1, 2, 3], regex="[0-9]+"))
    assert not sched.requests
    sched.submit(wb.Request(prompt=[1, 2, 3]))  # free rows need no llguidance


def test_a_token_the_grammar_refuses_ends_only_its_own_row(make_sched, bundled, prompt):
    model, tok = bundled
    letter = tok.encode("x", add_special_tokens=False)[0]
    sched = make_sched(max_batch=3)
    bad = sched.submit(
        wb.Request(
            prompt=prompt(5), max_tokens=6, regex=r"[0-9]+", sampler=lambda logprobs: mx.array([letter])
        )
    )  # ignores the mask
    good = sched.submit(wb.Request(prompt=prompt(5), max_tokens=20, regex=r"[0-9]{3}"))
    free = sched.submit(wb.Request(prompt=prompt(9, 50), max_tokens=8))
    sched.run()
    assert sched.finish_reason(bad) == "error"
    assert sched.error(bad).startswith(
        f"regex: the grammar refuses token {letter} ('x') after 0 generated token(s)"
    )
    assert sched.finish_reason(good) == "stop" and satisfies(
        wb.Request(prompt=[1], regex=r"[0-9]{3}"), sched.text(good)
    )
    ref = oracle.solo_reference(model, oracle.ref_request(sched.request_of(free)))
    assert sched.tokens(free) == ref.tokens


def test_a_complete_grammar_finishes_the_row_stop_without_an_eos_token(make_sched, bundled, prompt):
    _, tok = bundled
    sched = make_sched()
    uid = sched.submit(wb.Request(prompt=prompt(5), max_tokens=30, choices=["maybe so"]))
    sched.run()
    assert sched.finish_reason(uid) == "stop" and sched.text(uid) == "maybe so"
    assert not set(sched.tokens(uid)) & set(tok.eos_token_ids)


@pytest.mark.parametrize("custom", [False, True], ids=["no stop ids", "custom stop ids"])
def test_a_constrained_row_ends_at_eos_and_never_shows_its_text_whatever_its_stop_ids(
    make_sched, bundled, prompt, custom
):
    _, tok = bundled
    eos = set(tok.eos_token_ids)
    eos_text = tok.decode(sorted(eos))
    # "@" is a token no constraint here allows: a stop id the rows never meet
    stop_ids = tok.encode("@", add_special_tokens=False) if custom else []
    # (ab)* accepts the empty output: the model's first choice is EOS
    constraints = [*CONSTRAINTS, dict(regex=r"(ab)*"), dict(regex=r"[0-9]+")]
    reqs = [
        wb.Request(prompt=prompt(5 + 3 * i, 40 * i), max_tokens=30, stop_ids=stop_ids, **c)
        for i, c in enumerate(constraints)
    ]
    sched = make_sched(max_batch=len(reqs))
    uids = [sched.submit(r) for r in reqs]
    streamed = {u: "" for u in uids}
    for uid, piece in sched.stream_all():
        streamed[uid] += piece
    ended_at_eos = 0
    for uid, req in zip(uids, reqs, strict=True):
        text = sched.text(uid)
        assert eos_text not in text and satisfies(req, text), (req, text, sched.tokens(uid))
        assert streamed[uid] == text
        assert not eos & set(sched.tokens(uid)[:-1])  # EOS only ever ends a row
        if sched.tokens(uid)[-1] in eos:
            assert sched.finish_reason(uid) == "stop"
            ended_at_eos += 1
    assert ended_at_eos >= 1  # (ab)* at least: the case this test is about
    texts = dict(zip(sched.report().requests["uid"], sched.report().requests["text"], strict=True))
    assert all(texts[u] == sched.text(u) for u in uids)


def constrained_run(sched, prompt, steps_before=None, between=None):
    """Submit the four constrained requests and one free one; run ``steps_before``
    iterations, call ``between(sched, uids)``, then run to idle. Returns tokens per uid."""
    reqs = requests(prompt)[:5]
    uids = [sched.submit(r) for r in reqs]
    if steps_before is not None:
        for _ in range(steps_before):
            sched.admit(), sched.step(), sched.filter()
        between(sched, uids)
    sched.run()
    return {u: (sched.tokens(u), sched.finish_reason(u)) for u in uids}


def test_preempted_constrained_rows_resume_their_grammar_where_they_stopped(make_sched, prompt):
    plain = constrained_run(make_sched(max_batch=5), prompt)

    def preempt_all(sched, uids):
        for u in uids:
            if sched.status(u) is wb.Status.RUNNING:
                sched.preempt(u)

    assert constrained_run(make_sched(max_batch=5), prompt, 4, preempt_all) == plain


def test_restore_and_fork_continue_each_constrained_row_as_before(make_sched, prompt):
    plain = constrained_run(make_sched(max_batch=5), prompt)
    seen = {}

    def branch(sched, uids):
        cp = sched.checkpoint()
        seen["fork"] = sched.fork()
        sched.run()  # advances every matcher past the checkpoint
        seen["first"] = {u: (sched.tokens(u), sched.finish_reason(u)) for u in uids}
        sched.restore(cp)

    assert constrained_run(make_sched(max_batch=5), prompt, 3, branch) == plain
    assert seen["first"] == plain
    fork = seen["fork"]
    fork.run()
    assert {u: (fork.tokens(u), fork.finish_reason(u)) for u in plain} == plain


def test_a_prompt_cache_hit_starts_a_fresh_grammar(make_sched, prompt):
    sched = make_sched(max_batch=1, prompt_cache=4)
    req = wb.Request(prompt=prompt(30), max_tokens=20, regex=r"[a-z]{2,6}\(\d\)")
    first = sched.submit(req)
    sched.run()
    again = sched.submit(req)
    sched.run()
    assert sched.requests[again].cached_tokens > 0
    assert sched.tokens(again) == sched.tokens(first) and sched.finish_reason(again) == "stop"


@pytest.mark.parametrize("pipeline", [True, False])
def test_an_interrupted_step_never_advances_a_grammar_twice(make_sched, prompt, pipeline):
    plain = constrained_run(make_sched(max_batch=5, pipeline=pipeline), prompt)
    sched = make_sched(max_batch=5, pipeline=pipeline)
    uids = [sched.submit(r) for r in requests(prompt)[:5]]
    injector, interrupts = Injector(), 0
    with patched_eval(injector):
        while not sched.idle:
            for op in (sched.admit, sched.step, sched.filter):
                for k in (1, 2, 3):  # interrupted at its k-th eval point (while it has one) ...
                    before = engine_state(sched)
                    injector.arm(k)
                    try:
                        op()
                    except KeyboardInterrupt:
                        interrupts += 1
                        assert engine_state(sched) == before
                    finally:
                        injector.disarm()
                    if not injector.fired:
                        break
                    injector.fired = 0
                else:
                    op()  # ... then run through
    assert interrupts > 10
    assert {u: (sched.tokens(u), sched.finish_reason(u)) for u in uids} == plain


def test_a_matcher_interrupted_mid_update_is_rebuilt_from_the_tokens(bundled):
    _, tok = bundled
    c = constrained.constraint_of(wb.Request(prompt=[1], regex=r"[a-z]+[0-9]+"), tok, 4096)
    grammar = constrained.row_grammar(c, tok, 4096, prompt_tokens=1)
    ids = tok.encode("abc123", add_special_tokens=False)
    grammar.sync(ids[:2])
    grammar._state = None  # what an interrupt between the detach and the store leaves
    assert grammar.done(ids) is False and grammar.consumed == tuple(ids)
    grammar.sync(ids[:1])  # rolled back (a restore to an earlier step)
    assert grammar.consumed == tuple(ids[:1])
    assert grammar.allowed(ids, 4096)[tok.eos_token_ids.copy().pop()]  # EOS allowed once the digits came


def test_choices_regex_matches_each_choice_literally():
    assert constrained.choices_regex(["a.b|c", "x"]) == r"(a\.b\|c|x)"
