"""KeyboardInterrupt ("Kernel → Interrupt") landing anywhere inside a public engine call
never corrupts the engine (issue 18).

A script of calls (submits, ``submit_n`` samples sharing one prefill, chunked prefill with
``prefill_step_size=4``, joins by a new batch, by ``extend`` and into a free slot, decode
steps, preemption, aborts, filters that store rows in a prompt cache, and a final ``run()``)
runs on every bundled model family. Every call of the script is first interrupted at its 1st
*point*, called again and interrupted at its 2nd point, and so on until it completes, where a
point is one of:

- ``on_token``: a request's ``on_token`` callback;
- ``processor``: a request's logits processor (identity otherwise);
- ``sampler``: a request's custom sampler (argmax otherwise);
- ``layer``: entry to and exit from any decoder layer (``model.layers[i]`` wrapped);
- ``eval``: before and after every ``mx.eval`` / ``mx.async_eval``;
- ``clock``: a read of the scheduler's clock (every event);
- ``line``: any executed line of the engine's Python code (``sys.settrace``, sampled).

After every interrupt: ``sched.check()`` is ok and the engine equals its state before the
call (snapshot text, every request's state, the events). At the end every request's tokens
and finish reason, and the events before the final ``run()``, equal an uninterrupted run's;
finished greedy rows equal the solo oracle (mlx-lm alone). ``run()`` interrupted keeps the
iterations it completed (tokens so far are a prefix of the uninterrupted ones).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field

import mlx.core as mx
import pytest

import workbench as wb
from tests.families import CACHE_FAMILIES
from workbench.engine.checkpoint import EngineState
from workbench.engine.kv.ledger import alone_bytes
from workbench.engine.runner import ModelRunner
from workbench.runtime.loading import DATA_DIR
from workbench.verify import oracle
from workbench.workloads.workload import prompt_of_length

from .interrupts import Injector, LineTracer, engine_state, facts_of, layer_list, patched_eval, wrapped_layers

pytestmark = pytest.mark.model

FAMILIES = CACHE_FAMILIES
_MODELS: dict = {}


def model_of(family: str):
    folder, _ = FAMILIES[family]
    if folder not in _MODELS:
        _MODELS[folder] = wb.load(DATA_DIR / "models" / folder)
    return _MODELS[folder]


class FakeClock:
    def __init__(self):
        self.now_s = 0.0

    def __call__(self) -> float:
        self.now_s += 0.25
        return self.now_s


KINDS = ("on_token", "processor", "sampler", "layer", "eval", "clock", "line")


# -- the scripts ----------------------------------------------------------------------
# (operation, argument): submit (prompt tokens, prompt start, max_tokens[, priority]);
# abort a uid; preempt the first unfinished running row; run to idle. Chunks are 4 tokens.
SCRIPT = (
    ("submit", (5, 0, 4)),
    ("submit", (10, 40, 14)),
    ("admit", None),
    ("admit", None),
    ("admit", None),
    ("admit", None),  # prefill by chunks, a new batch
    ("step", None),
    ("step", None),
    ("submit", (9, 90, 6)),
    ("admit", None),
    ("step", None),
    ("admit", None),  # a chunk between steps, then a join by extend
    ("step", None),
    ("step", None),
    ("filter", None),  # uid 0 ends: a free slot, stored in the prompt cache
    ("submit", (5, 0, 3)),
    ("admit", None),  # uid 0's prompt: a prompt-cache hit, joins the free slot
    ("step", None),
    ("submit", (7, 200, 3)),
    ("abort", 4),  # aborted while queued
    ("submit", (12, 300, 5)),
    ("admit", None),
    ("abort", 5),  # aborted while prefilling
    ("step", None),
    ("preempt", None),
    ("step", None),
    ("abort", 2),  # aborted while running
    ("admit", None),
    ("step", None),
    ("filter", None),
    ("run", None),
)
# A KV budget of two requests: a high-priority arrival preempts a running row inside admit().
BUDGET_SCRIPT = (
    ("submit", (6, 0, 10, 0)),
    ("submit", (6, 30, 10, 0)),
    ("admit", None),
    ("admit", None),
    ("step", None),
    ("step", None),
    ("submit", (6, 60, 10, 2)),
    ("admit", None),
    ("step", None),
    ("admit", None),
    ("step", None),
    ("filter", None),
    ("run", None),
)
BUDGET_TOKENS = 16  # every request of BUDGET_SCRIPT: prompt 6 + max_tokens 10
# submit_n (prompt tokens, prompt start, max_tokens, n): samples sharing one chunked prefill, one
# aborted while prefilling (the one the others copy), another while running; top-k rows among them.
SAMPLES_SCRIPT = (
    ("submit", (5, 0, 6)),
    ("submit_n", (10, 40, 5, 3)),
    ("admit", None),
    ("admit", None),
    ("abort", 1),
    ("admit", None),
    ("admit", None),
    ("step", None),
    ("submit_n", (7, 90, 4, 2)),
    ("admit", None),
    ("step", None),
    ("admit", None),
    ("step", None),
    ("abort", 5),
    ("step", None),
    ("filter", None),
    ("run", None),
)
# SCRIPT with three times the tokens: speculating rows advance several tokens a step, and the
# script's preempt still needs a running row
SPEC_SCRIPT = tuple(
    (op, (arg[0], arg[1], 3 * arg[2], *arg[3:]) if op == "submit" else arg) for op, arg in SCRIPT
)

CONFIGS = {
    "pipelined": (SCRIPT, {}),
    "plain": (
        SCRIPT,
        dict(pipeline=False, reuse_slots=False, interleave_prefill=False, history_checkpoints=2),
    ),
    "budget": (BUDGET_SCRIPT, dict(budget_requests=2)),
    "packed": (SCRIPT, dict(layout="packed", page_size=4, prefill_step_size=8, prompt_cache=None)),
    "packed-budget": (
        BUDGET_SCRIPT,
        dict(layout="packed", page_size=4, prefill_step_size=8, prompt_cache=None, budget_requests=2),
    ),
    # prefix caching: a repeat prompt and a preempted row resume from cached pages, samples share one prefill
    "packed-cache": (SCRIPT, dict(layout="packed", page_size=4, prefill_step_size=8, prompt_cache=8)),
    "packed-samples": (
        SAMPLES_SCRIPT,
        dict(layout="packed", page_size=4, prefill_step_size=8, prompt_cache=8),
    ),
    "samples": (SAMPLES_SCRIPT, {}),
    "speculative": (SPEC_SCRIPT, dict(speculative="prompt-lookup", num_draft_tokens=3)),
    "draft": (
        SPEC_SCRIPT,
        dict(speculative="the model itself", num_draft_tokens=2),
    ),  # drafts with its own weights
    # a verify forward as more tokens of each row in the packed [1, T] forward, rejected drafts trimmed from pages
    "packed-speculative": (
        SPEC_SCRIPT,
        dict(
            layout="packed", page_size=4, prefill_step_size=8, speculative="prompt-lookup", num_draft_tokens=3
        ),
    ),
    "packed-draft": (
        SPEC_SCRIPT,
        dict(
            layout="packed",
            page_size=4,
            prefill_step_size=8,
            speculative="the model itself",
            num_draft_tokens=2,
        ),
    ),
}


@dataclass
class Outcome:
    tokens: dict
    finish: dict
    facts: list  # events before the final run(), times left out
    interrupts: int = 0
    per_op: list = field(default_factory=list)


def request_hooks(kind: str, injector: Injector) -> dict:
    def on_token(uid, token):
        injector.point()

    def processor(tokens, logits):
        injector.point()
        return logits

    def sampler(logprobs):
        injector.point()
        return mx.argmax(logprobs, axis=-1)

    return {
        "on_token": dict(on_token=on_token),
        "processor": dict(logits_processors=[processor]),
        "sampler": dict(sampler=sampler),
    }.get(kind, {})


def apply(sched, tok, op, arg, hooks):
    if op == "submit":
        n, start, max_tokens, *priority = arg
        sched.submit(
            wb.Request(
                prompt=prompt_of_length(tok, n, start),
                max_tokens=max_tokens,
                stop_ids=[],
                priority=priority[0] if priority else 0,
                **hooks,
            )
        )
    elif op == "submit_n":
        n_tokens, start, max_tokens, n = arg
        sched.submit_n(
            wb.Request(
                prompt=prompt_of_length(tok, n_tokens, start),
                max_tokens=max_tokens,
                stop_ids=[],
                top_logprobs=3,
                **hooks,
            ),
            n,
        )
    elif op == "preempt":
        sched.preempt(next(r.uid for r in sched.batch.rows if not r.finished))
    elif op == "abort":
        sched.abort(arg)
    else:
        getattr(sched, op)()


def interrupted_call(sched, tok, op, arg, hooks, injector, reference_tokens, tracer=None, stride=1):
    """Call ``op`` interrupted at its 1st point, again at its ``1 + stride``-th, and so
    on until it completes; check the engine after each interrupt. Returns the number of
    interrupts.

    ``before`` is read once: each interrupt must leave the engine equal to it (asserted), so the
    next attempt starts from that same state. ``run()`` keeps its completed iterations, so only
    its count of events is read before each attempt."""
    k, n = 1, 0
    before = engine_state(sched) if op != "run" else None
    while True:
        n_events = len(sched.events)
        injector.arm(k)
        try:
            with tracer.tracing() if tracer else contextlib.nullcontext():
                apply(sched, tok, op, arg, hooks)
        except KeyboardInterrupt:
            n += 1
            report = sched.check()
            assert report.ok, f"{op} interrupted at point {k}:\n{report}"
            if (
                op == "run"
            ):  # the iterations done are kept; each row's tokens a prefix of the uninterrupted ones
                for u, s in sched.requests.items():
                    assert s.tokens == reference_tokens[u][: len(s.tokens)], (
                        f"run interrupted at {k}: uid {u}"
                    )
                assert len(sched.events) >= n_events
            else:
                after = engine_state(sched)
                for name, was, now in zip(
                    ("snapshot", "requests", "queue", "step", "idle", "events"), before, after
                ):
                    assert now == was, f"{op} interrupted at point {k} changed the {name}:\n{was}\n---\n{now}"
            k += stride
            continue
        finally:
            injector.disarm()
        return n


def make_scheduler(family: str, config_name: str, clock=None, **extra) -> wb.Scheduler:
    model, tok = model_of(family)
    max_kv_size = FAMILIES[family][1]
    options = (
        dict(max_batch=4, prefill_step_size=4, prompt_cache=4, history_size=4)
        | CONFIGS[config_name][1]
        | extra
    )
    budget_requests = options.pop("budget_requests", None)
    if options.get("speculative") == "the model itself":
        options["speculative"] = model
    if budget_requests and options.get("layout") == "packed":  # pages of 6 + 10 tokens
        options["kv_budget_bytes"] = budget_requests * wb.Scheduler(model, tok, **options).ledger.alone_bytes(
            6, BUDGET_TOKENS - 6
        )
    elif budget_requests:
        options["kv_budget_bytes"] = budget_requests * alone_bytes(  # rows as mlx-lm allocates them
            model, 6, BUDGET_TOKENS - 6, options["prefill_step_size"], max_kv_size, exact_chunks=False
        )
    return wb.Scheduler(model, tok, max_kv_size=max_kv_size, clock=clock or FakeClock(), **options)


def play(
    family: str, config_name: str, kind: str | None, reference: Outcome | None = None, stride: int = 1
) -> tuple[Outcome, wb.Scheduler]:
    """Run the config's script on ``family``, every call interrupted at each of its
    points of ``kind`` in turn (``kind`` None: uninterrupted, the reference)."""
    model, tok = model_of(family)
    injector = Injector()
    hooks = request_hooks(kind or "", injector)
    clock = FakeClock()

    def ticking():
        if kind == "clock":
            injector.point()
        return clock()

    sched = make_scheduler(family, config_name, ticking)
    tracer = LineTracer(injector) if kind == "line" else None
    stack = contextlib.ExitStack()
    if kind == "layer":
        stack.enter_context(wrapped_layers(model, injector))
    elif kind == "eval":
        stack.enter_context(patched_eval(injector))
    facts, total, per_op = None, 0, []
    with stack:
        for op, arg in CONFIGS[config_name][0]:
            if op == "run":
                facts = facts_of(sched.events)
            if kind is None:
                apply(sched, tok, op, arg, hooks)
                continue
            n = interrupted_call(sched, tok, op, arg, hooks, injector, reference.tokens, tracer, stride)
            total += n
            per_op.append((op, n))
    assert sched.idle and sched.check().ok
    outcome = Outcome(
        {u: sched.tokens(u) for u in sched.requests},
        {u: sched.finish_reason(u) for u in sched.requests},
        facts,
        total,
        per_op,
    )
    return outcome, sched


_SOLO: dict = {}  # mlx-lm alone, per model and request: every case replays the same requests


def assert_solo(sched):
    """Every row that finished by stop or length (greedy, or argmax through an identity
    processor or sampler) equals mlx-lm alone (as ``oracle.solo_check``, each reference
    run once per model and request)."""
    uids = [u for u in sched.requests if sched.finish_reason(u) in ("stop", "length")]
    assert uids
    refs = {}
    for u in uids:
        req = oracle.ref_request(sched.request_of(u))
        key = (id(sched.model), req, sched.config.prefill_step_size, sched.config.max_kv_size)
        if key not in _SOLO:
            _SOLO[key] = oracle.solo_reference(
                sched.model,
                req,
                sched.config.prefill_step_size,
                sched.config.max_kv_size,
                tokenizer=sched.tokenizer,
            )
        refs[u] = _SOLO[key]
    check = oracle.compare_traces({u: oracle.scheduler_trace(sched, u) for u in uids}, refs, atol=1e-4)
    assert check.ok, check.text()


_REFERENCES: dict = {}


def reference_of(family: str, config_name: str) -> tuple[Outcome, wb.Scheduler]:
    key = (family, config_name)
    if key not in _REFERENCES:
        _REFERENCES[key] = play(family, config_name, None)
        assert_solo(_REFERENCES[key][1])
    return _REFERENCES[key]


def test_the_scripts_cover_every_kind_of_call_join_and_abort():
    _, sched = reference_of("llama", "pipelined")
    kinds = {e.kind for e in sched.events}
    assert {"submit", "admit", "prefill", "join", "token", "finish", "evict", "preempt"} <= kinds
    assert {e.join_mode for e in sched.events if e.kind == "join"} == {"new batch", "extend", "free slot"}
    assert sorted(sched.finish_reason(u) for u in sched.requests) == ["abort"] * 3 + ["length"] * 3
    assert any(e.n_cached for e in sched.events if e.kind == "admit"), "a prompt-cache hit"
    for name in ("speculative", "draft", "packed-speculative", "packed-draft"):
        _, sched = reference_of("llama", name)
        drafts = [e for e in sched.events if e.kind == "draft"]
        assert sum(e.n_accepted for e in drafts) > 0, f"{name}: drafts accepted"
    _, sched = reference_of("llama", "budget")
    assert [e.uid for e in sched.events if e.kind == "preempt"] == [1], "admit() preempted a row for uid 2"
    _, sched = reference_of("llama", "samples")
    prefilled = {e.uid for e in sched.events if e.kind == "prefill"}
    assert prefilled == {0, 1, 4}, "each submit_n group's prompt is prefilled once, by its first sample"
    assert [sched.finish_reason(u) for u in range(6)] == [
        "length",
        "abort",
        "length",
        "length",
        "length",
        "abort",
    ]
    assert all(len(t) == 3 for u in (2, 3, 4) for t in sched.top_logprobs(u))


def test_the_packed_cache_scripts_take_cached_pages_and_prefill_a_samples_prompt_once():
    _, sched = reference_of("llama", "packed-cache")
    assert any(e.n_cached for e in sched.events if e.kind == "admit"), "cached pages taken at admission"
    _, sched = reference_of("llama", "packed-samples")
    prefilled = {
        u: sum(e.n_tokens for e in sched.events if e.kind == "prefill" and e.uid == u) for u in range(6)
    }
    assert prefilled[1] == 0 and prefilled[1] + prefilled[2] + prefilled[3] == 10, (
        "uid 1 aborted before its prefill: uid 2 prefills the group's 10-token prompt once"
    )


CASES = [(family, "pipelined", kind) for family in FAMILIES for kind in KINDS if kind != "line"]
CASES += [("llama", "plain", kind) for kind in KINDS if kind != "line"]
CASES += [
    (family, "budget", kind) for family in ("llama", "qwen3next") for kind in ("layer", "eval", "clock")
]
CASES += [("llama", "pipelined", "line"), ("mamba2", "plain", "line"), ("gemma3", "budget", "line")]
CASES += [("llama", "packed", kind) for kind in KINDS] + [
    ("llama", "packed-budget", kind) for kind in ("layer", "eval")
]
CASES += [("llama", "packed-cache", kind) for kind in KINDS]
CASES += [("llama", "packed-samples", kind) for kind in ("on_token", "sampler", "layer", "eval", "clock")]
CASES += [(family, "samples", kind) for family in ("llama", "qwen3next") for kind in KINDS if kind != "line"]
CASES += [("gemma3", "samples", "line")]
CASES += [("llama", "speculative", kind) for kind in ("on_token", "layer", "eval", "clock", "line")]
CASES += [("llama", "draft", kind) for kind in ("layer", "eval", "line")]
CASES += [("llama", "packed-speculative", kind) for kind in ("on_token", "layer", "eval", "clock", "line")]
CASES += [("llama", "packed-draft", kind) for kind in ("layer", "eval")]


@pytest.mark.parametrize("family, config_name, kind", CASES)
def test_an_interrupt_at_any_point_of_any_call_leaves_the_engine_as_before_the_call(
    family, config_name, kind, request
):
    reference, _ = reference_of(family, config_name)
    # every executed line is a point: every 13th is interrupted (every one with --long)
    stride = 1 if kind != "line" or request.config.getoption("--long") else 13
    outcome, sched = play(family, config_name, kind, reference, stride)
    assert outcome.interrupts >= 10, outcome.per_op
    assert outcome.tokens == reference.tokens
    assert outcome.finish == reference.finish
    assert outcome.facts == reference.facts
    assert_solo(sched)


# -- the smallest cases, literally -------------------------------------------
def interrupting_once():
    """An ``on_token`` callback that raises KeyboardInterrupt on its first call only."""
    armed = [True]

    def callback(uid, token):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    return callback


def test_on_token_raising_keyboard_interrupt_on_its_first_call_changes_nothing():
    model, tok = model_of("llama")
    callback = interrupting_once()
    sched = wb.Scheduler(model, tok)
    a = sched.submit(wb.Request(prompt=[4, 5, 6], max_tokens=1, stop_ids=[], on_token=callback))
    b = sched.submit(wb.Request(prompt=[1, 2, 3], max_tokens=4, stop_ids=[]))
    sched.admit()
    before = engine_state(sched)
    with pytest.raises(KeyboardInterrupt):
        sched.step()
    assert sched.check().ok, str(sched.check())
    assert engine_state(sched) == before
    assert list(sched.snapshot().offset) == [3, 3]  # the prompts; nothing fed twice
    sched.run()
    assert len(sched.tokens(a)) == 1 and sched.finish_reason(a) == "length"
    assert sched.tokens(b) == [465, 348, 459, 465]
    assert_solo(sched)


class RaiseOnCall:
    """``model.layers[i]`` stand-in raising KeyboardInterrupt on its ``k``-th call."""

    def __init__(self, layer, k: int = 1):
        self._layer, self.k, self.calls = layer, k, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.k:
            raise KeyboardInterrupt("on entry to the layer")
        return self._layer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._layer, name)


def test_admit_interrupted_on_entry_to_the_second_decoder_layer_changes_nothing():
    model, tok = model_of("llama")

    def scenario(interrupt: bool):
        sched = wb.Scheduler(model, tok, prefill_step_size=4)
        first = sched.submit(wb.Request(prompt=[1, 2, 3], max_tokens=8, stop_ids=[]))
        sched.admit()
        sched.step()
        second = sched.submit(wb.Request(prompt=prompt_of_length(tok, 10, 5), max_tokens=8, stop_ids=[]))
        if interrupt:
            layers = layer_list(model)
            layers[1] = RaiseOnCall(layers[1])
            before = engine_state(sched)
            try:
                with pytest.raises(KeyboardInterrupt):
                    sched.admit()
            finally:
                layers[1] = layers[1]._layer
            assert sched.check().ok, str(sched.check())
            assert engine_state(sched) == before
        sched.run()
        return [sched.tokens(first), sched.tokens(second)], sched

    interrupted, sched = scenario(True)
    assert interrupted == scenario(False)[0]
    assert all(sched.finish_reason(u) == "length" for u in (0, 1))
    assert_solo(sched)


def _raise_after(original):
    def call(*args, **kwargs):
        original(*args, **kwargs)
        raise KeyboardInterrupt("after the call")

    return call


def _raise_before(original):
    def call(*args, **kwargs):
        raise KeyboardInterrupt("before the call")

    return call


@pytest.mark.parametrize(
    "where, wrap",
    [
        ("start_prefill", _raise_before),  # the joining group being built
        ("start_prefill", _raise_after),  # built, not yet the engine's
        ("join_forward", _raise_after),  # the group's first tokens computed, the group not yet in the batch
    ],
)
def test_an_interrupt_while_a_joining_group_is_built_loses_no_uid(monkeypatch, where, wrap):
    model, tok = model_of("llama")

    def scenario(interrupt: bool):
        sched = wb.Scheduler(model, tok, prefill_step_size=4)
        uids = [sched.submit(wb.Request(prompt=prompt_of_length(tok, 6, 0), max_tokens=5, stop_ids=[]))]
        sched.admit()
        sched.step()
        uids.append(sched.submit(wb.Request(prompt=prompt_of_length(tok, 3, 50), max_tokens=6, stop_ids=[])))
        if interrupt:
            before = engine_state(sched)
            with monkeypatch.context() as patch:
                patch.setattr(ModelRunner, where, wrap(getattr(ModelRunner, where)))
                with pytest.raises(KeyboardInterrupt):
                    sched.admit()
            assert sched.check().ok, str(sched.check())
            assert engine_state(sched) == before
            assert sched.queue == (uids[1],) and not sched.idle
        sched.run()
        return [sched.tokens(u) for u in uids], sched

    interrupted, sched = scenario(True)
    assert interrupted == scenario(False)[0]
    assert_solo(sched)


def test_run_interrupted_between_iterations_keeps_the_work_done():
    model, tok = model_of("llama")
    sched = wb.Scheduler(model, tok, max_batch=2)
    uids = [
        sched.submit(wb.Request(prompt=prompt_of_length(tok, 4 + i, 9 * i), max_tokens=6, stop_ids=[]))
        for i in range(3)
    ]
    calls = [0]
    original = sched.filter

    def filter_interrupted_at_the_fourth_call():
        calls[0] += 1
        if calls[0] == 4:
            raise KeyboardInterrupt
        return original()

    sched.filter = filter_interrupted_at_the_fourth_call  # between step 4 and admit of step 5
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    del sched.filter
    assert sched.step_index == 4 and sched.check().ok
    assert [len(sched.tokens(u)) for u in uids] == [4, 4, 0]
    sched.run()
    assert all(sched.finish_reason(u) == "length" for u in uids)
    assert_solo(sched)


def test_a_second_interrupt_during_the_rollback_is_raised_once_the_rollback_is_done(monkeypatch):
    """Kernel → Interrupt pressed twice: the second SIGINT lands while the first one's
    rollback runs; the rollback still completes, then KeyboardInterrupt propagates."""
    model, tok = model_of("llama")
    callback = interrupting_once()
    sched = wb.Scheduler(model, tok)
    uids = [
        sched.submit(wb.Request(prompt=[4, 5, 6], max_tokens=3, stop_ids=[], on_token=callback)),
        sched.submit(wb.Request(prompt=[1, 2, 3], max_tokens=4, stop_ids=[])),
    ]
    sched.admit()
    before = engine_state(sched)
    rollback = EngineState.rollback

    def rollback_hit_by_a_second_sigint(self, savepoint):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # Python runs the handler here, on the main thread
        rollback(self, savepoint)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        monkeypatch.setattr(EngineState, "rollback", rollback_hit_by_a_second_sigint)
        with pytest.raises(KeyboardInterrupt):
            sched.step()
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    assert sched.check().ok, str(sched.check())
    assert engine_state(sched) == before
    sched.run()
    assert [len(sched.tokens(u)) for u in uids] == [3, 4]
    assert_solo(sched)
