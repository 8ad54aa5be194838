"""Stateful fuzzing of the engine: random submit / admit / step / filter / abort / preempt
sequences with random prompt lengths (1..300), max_tokens, chunk sizes, max_batch, KV budgets,
prompt caches and sampled rows, for every bundled model family, and for the packed layout on
the llama family (page sizes 1, 4, 16; the chunk size as its token budget; prefix caching on or
off, prompts cut at four starts so that they share whole pages of a prefix). After every
operation the invariants hold and ``sched.check()`` is ok; every finished greedy row equals its
solo mlx-lm reference; at random points a checkpoint is taken, a random continuation run, the
checkpoint restored and the same continuation run again: tokens and events (times aside) must
be the same; and an admit / step / filter / abort / preempt is interrupted by a
KeyboardInterrupt at a random point (the k-th decoder-layer call, ``mx.eval``, ``on_token``
callback or clock read), which must leave the engine as it was. Rows asking top-k log-probs and
``submit_n`` groups (greedy or sampled, sharing one prefill) join among plain rows; each
finished one equals the same request run alone through the engine (sample ``i`` as
``Request(seed=seed + i)``; tokens, finish reason; log-probs and top-k within 1e-4, ids equal
but for near ties). Hostile rows join among the good ones: a custom sampler or logits processor
whose return value breaks its contract (``tests/engine/hostile.py``: an id of -1, past the
vocabulary, 3.7, NaN, a wrong shape; logits of a wrong shape or dtype), bad at once or after
some tokens; every hostile row ends ``error`` (or ``abort`` when the fuzzer aborted it) with
its message, and every good row still equals its solo reference. Constrained rows join too
(``Request(json_schema= / regex= / choices=)``, greedy or sampled): every finished one's tokens
are accepted by a fresh grammar, one finished ``stop`` satisfies its constraint (parses and
validates, matches, is a choice), and a greedy one equals its constrained solo run (mlx-lm's
``generate_step`` with the same mask), while every free row still equals its unconstrained solo
run: no mask reaches another row. Three families speculate on the bundled model (``code-lookup``:
``speculative="prompt-lookup"``; ``code-draft``: a draft model, the bundled model with its last
MLP zeroed; ``code-packed-draft``: that draft model in the packed layout, the drafts verified as
more tokens of each row in its ``[1, T]`` forward), 1, 3 or 5 draft tokens: every greedy row
still equals its solo run without speculation, every sampled row (drafting too: it accepts a draft where its own seeded
draw equals it) equals its seeded run alone without speculation, and over the examples drafts
were both accepted and rejected.

CI runs a bounded number of examples; ``pytest tests/verify/test_fuzz.py --long`` runs at least
10,000 operations and prints the count of operations and divergences."""

import contextlib
import re
import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import workbench as wb
from tests.engine.alone import run_alone
from tests.engine.drafting import noisy_draft
from tests.engine.hostile import HOSTILE, hostile_fields
from tests.engine.interrupts import Injector, engine_state, facts_of, patched_eval, wrapped_layers
from tests.families import CACHE_FAMILIES
from workbench.engine.kv.ledger import alone_bytes
from workbench.engine.levers.constrained import GrammarError, constraint_of, row_grammar
from workbench.observe.metrics import step_metrics
from workbench.runtime.loading import DATA_DIR
from workbench.verify import oracle
from workbench.verify.constrained import constrained_reference, satisfies
from workbench.workloads.workload import prompt_of_length

pytestmark = pytest.mark.model

FAMILIES = {
    **CACHE_FAMILIES,
    "llama-kv4": ("tiny-llama", None),
    "llama-packed": ("tiny-llama", None),
    "code-packed": ("tiny-code", None),
    "code-lookup": ("tiny-code", None),
    "code-draft": ("tiny-code", None),
    "code-packed-draft": ("tiny-code", None),
}
KV_BITS = {"llama-kv4": 4}  # Scheduler(kv_bits=4, kv_group_size=32): a quantized KV cache (no prompt cache)
PACKED = {
    "llama-packed",
    "code-packed",
    "code-packed-draft",
}  # Scheduler(layout="packed"): pages of 1, 4 or 16, prefix caching on or off
PACKED_CACHE_PAGES = (
    64  # the packed prompt cache (prompt_cache=4 drawn): at most 64 unreferenced pages cached
)
PACKED_STARTS = 40  # packed rows cut their prompts at 0, 40, 80 or 120: many share whole pages of a prefix
# Scheduler(speculative=...): prompt lookup, or a draft model (the bundled model with its last MLP zeroed)
SPECULATIVE = {
    "code-lookup": "prompt-lookup",
    "code-draft": "draft model",
    "code-packed-draft": "draft model",
}
_MODELS: dict = {}
_REFS: dict = {}
STATS = {
    "operations": 0,
    "divergences": 0,
    "rows_checked": 0,
    "restores": 0,
    "interrupts": 0,
    "hostile_errors": 0,
    "constrained_checked": 0,
    "drafted_tokens": 0,
    "accepted_tokens": 0,
    "cached_admissions": 0,  # packed rows admitted onto cached or shared pages (admit events with n_cached)
}
# the constrained rows' constraints: two schemas, two regexes, choices (a prefix of another among them)
CONSTRAINTS = (
    dict(
        json_schema={
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 22, 333]}},
            "required": ["ok", "n"],
            "additionalProperties": False,
        }
    ),
    dict(json_schema='{"type": "array", "items": {"enum": ["x", "yy"]}, "minItems": 1, "maxItems": 3}'),
    dict(regex=r"[a-f]{1,5}-[0-9]{2}"),
    dict(regex=r"(ab|cd)+!"),
    dict(choices=["no", "none", "yes please"]),
)


def continuation(sched, tok, ops, since):
    """Apply ``ops`` (deterministic targets: abort the latest uid, preempt the first
    running row, submit a greedy 7-token request) and return every request's tokens and
    finish reason and the events from ``since`` on without their times."""
    for op in ops:
        if op == "submit":
            sched.submit(wb.Request(prompt=prompt_of_length(tok, 7, 33), max_tokens=5, stop_ids=[]))
        elif op == "abort" and sched.requests:
            sched.abort(max(sched.requests))
        elif op == "preempt":
            live = [r.uid for r in sched.batch.rows if not r.finished]
            if live:
                sched.preempt(live[0])
        elif op in ("admit", "step", "filter"):
            getattr(sched, op)()
    facts = facts_of(sched.events[since:])
    return {u: (sched.tokens(u), sched.finish_reason(u)) for u in sched.requests}, facts


def model_of(folder):
    if folder not in _MODELS:
        _MODELS[folder] = wb.load(DATA_DIR / "models" / folder)
    return _MODELS[folder]


def speculation_of(family: str, folder: str, k: int) -> dict:
    """The scheduler settings of a speculating family (none for the others): prompt lookup, or
    the folder's model with its last MLP zeroed as the draft model; ``k`` draft tokens."""
    if family not in SPECULATIVE:
        return {}
    if SPECULATIVE[family] == "prompt-lookup":
        return dict(speculative="prompt-lookup", num_draft_tokens=k)
    key = f"{folder} noisy draft"
    if key not in _MODELS:
        _MODELS[key] = noisy_draft(DATA_DIR / "models" / folder)
    return dict(speculative=_MODELS[key], num_draft_tokens=k)


def request_strategies(longest: int, max_tokens: int = 12) -> dict:
    """The strategies of a rule's request: ``n`` prompt tokens (1 to ``longest``), cut at
    ``start`` of the prompt set, up to ``max_tokens`` new tokens."""
    return dict(n=st.integers(1, longest), start=st.integers(0, 900), max_tokens=st.integers(1, max_tokens))


def make_machine(family: str):
    folder, max_kv_size = FAMILIES[family]
    kv_bits = KV_BITS.get(family)
    # the solo reference of a quantized row quantizes as generate_step(kv_bits=4, quantized_kv_start=0)
    # after its first prefill chunk, so it runs with the scheduler's chunk size
    ref_kv = (
        (lambda chunk: {"kv_bits": kv_bits, "kv_group_size": 32, "prefill_step_size": chunk})
        if kv_bits
        else (lambda chunk: {})
    )

    class EngineMachine(RuleBasedStateMachine):
        @initialize(
            max_batch=st.integers(1, 4),
            chunk=st.sampled_from([3, 16, 64, 2048]),
            budget_requests=st.sampled_from([None, 2, 3]),
            pipeline=st.booleans(),
            prompt_cache=st.sampled_from([None, 4]),
            page_size=st.sampled_from([1, 4, 16]),
        )
        def setup(self, max_batch, chunk, budget_requests, pipeline, prompt_cache, page_size):
            self.model, self.tok = model_of(folder)
            self.injector = Injector()  # raises only while armed (the interrupted-operation rule)
            layout = (
                {}
                if family not in PACKED
                else dict(
                    layout="packed",
                    page_size=page_size,
                    prefill_step_size=max(chunk, max_batch),  # = the token budget (one setting, said twice)
                    max_num_batched_tokens=max(chunk, max_batch),
                )
            )
            if layout and max_batch % 2 == 0:  # paced packed forwards (from a draw already made: the
                layout["pacing"] = True  # examples stay those of the unpaced runs), the clock interrupted
            # what the longest request (300 + 12 tokens) may hold alone: as mlx-lm allocates it, or in pages
            self.unit = (
                wb.Scheduler(self.model, self.tok, max_batch=max_batch, **layout).ledger.alone_bytes(300, 12)
                if layout
                else alone_bytes(self.model, 300, 12, chunk, max_kv_size, exact_chunks=False)
            )
            budget = None if budget_requests is None else budget_requests * self.unit
            # the settings a row's run alone shares with the batch
            self.settings = dict(
                prefill_step_size=chunk,
                max_kv_size=max_kv_size,
                kv_bits=kv_bits,
                kv_group_size=32 if kv_bits else 64,  # a float cache takes no group size
                history_size=0,
            )
            self.sched = wb.Scheduler(
                self.model,
                self.tok,
                max_batch=max_batch,
                kv_budget_bytes=budget,
                pipeline=pipeline,
                prompt_cache=None
                if kv_bits or prompt_cache is None
                else (PACKED_CACHE_PAGES if layout else prompt_cache),
                seed=max_batch,
                clock=self.clock,
                **{**self.settings, **layout},
                # page_size is drawn for every family: the speculating ones read it as num_draft_tokens
                **speculation_of(family, folder, {1: 1, 4: 3, 16: 5}[page_size]),
            )
            self.ref_kv = ref_kv(chunk)
            self.submitted = []
            self.hostile = {}  # uid -> the regex its error must match
            self.constrained = set()  # uids of constrained rows
            self.checked = set()
            self.rows_at = {}
            self.alone = {}  # uid -> the request its run alone must equal (top-k rows, submit_n samples)

        def op(self):
            STATS["operations"] += 1

        def _request(self, n, start, max_tokens, **fields):
            """A request of ``n`` prompt tokens cut at ``start``, no stop ids. A packed row's
            ``start`` is one of four (:data:`PACKED_STARTS`), so that prompts share prefixes."""
            if family in PACKED:
                start = start // 300 * PACKED_STARTS
            return wb.Request(
                prompt=prompt_of_length(self.tok, n, start), max_tokens=max_tokens, stop_ids=[], **fields
            )

        def _submit(self, n, start, max_tokens, **fields):
            """Submit :meth:`_request` and record its uid; returns ``(uid, request)``."""
            req = self._request(n, start, max_tokens, **fields)
            uid = self.sched.submit(req)
            self.submitted.append(uid)
            return uid, req

        def clock(self):
            self.injector.point()
            return time.perf_counter()

        def on_token(self, uid, token):
            self.injector.point()

        @rule(
            **request_strategies(300),
            priority=st.integers(0, 2),
            temperature=st.sampled_from([0.0, 0.0, 0.8]),
        )
        def submit(self, n, start, max_tokens, priority, temperature):
            self.op()
            uid, req = self._submit(  # sampled: drawn seed
                n, start, max_tokens, priority=priority, temperature=temperature, on_token=self.on_token
            )
            if family in SPECULATIVE and temperature:  # a sampled row beside drafting rows: as alone
                self.alone[uid] = replace(req, seed=self.sched.requests[uid].seed)

        @rule(
            **request_strategies(120),
            k=st.sampled_from([1, 5, 20]),
            temperature=st.sampled_from([0.0, 0.9]),
        )
        def submit_top_logprobs(self, n, start, max_tokens, k, temperature):
            """A row asking its top-k log-probs: equal to the same request alone."""
            self.op()
            uid, req = self._submit(n, start, max_tokens, temperature=temperature, top_logprobs=k)
            self.alone[uid] = replace(req, seed=self.sched.requests[uid].seed)  # a sampled row's drawn seed

        @rule(
            **request_strategies(120),
            samples=st.integers(2, 4),
            temperature=st.sampled_from([0.0, 0.8]),
            seed=st.integers(0, 99),
            k=st.sampled_from([0, 3]),
        )
        def submit_samples(self, n, start, max_tokens, samples, temperature, seed, k):
            """A submit_n group (one shared prefill): sample i equal to Request(seed=seed + i) alone."""
            self.op()
            req = self._request(
                n,
                start,
                max_tokens,
                temperature=temperature,
                seed=seed,
                top_logprobs=k,
            )
            uids = self.sched.submit_n(req, samples)
            self.submitted += uids
            self.alone.update({u: replace(req, seed=seed + i) for i, u in enumerate(uids)})

        @rule(
            **request_strategies(40),
            name=st.sampled_from(sorted(HOSTILE)),
            bad_at=st.integers(0, 11),
        )
        def submit_hostile(self, n, start, max_tokens, name, bad_at):
            """A row whose sampler or processor returns garbage (a processor from its
            ``bad_at``-th token on, within ``max_tokens``): it must end alone."""
            self.op()
            fields, message = hostile_fields(
                name, self.sched.vocab_size, after=n + min(bad_at, max_tokens - 1)
            )
            uid, _ = self._submit(n, start, max_tokens, **fields)
            self.hostile[uid] = message

        @rule(
            **request_strategies(60, max_tokens=24),
            which=st.integers(0, len(CONSTRAINTS) - 1),
            temperature=st.sampled_from([0.0, 0.0, 0.8]),
        )
        def submit_constrained(self, n, start, max_tokens, which, temperature):
            """A row under a grammar mask (its EOS ids as stop ids)."""
            self.op()
            req = wb.Request(
                prompt=prompt_of_length(self.tok, n, start),
                max_tokens=max_tokens,
                temperature=temperature,
                on_token=self.on_token,
                **CONSTRAINTS[which],
            )
            uid = self.sched.submit(req)
            self.submitted.append(uid)
            self.constrained.add(uid)

        @rule(
            ops=st.lists(
                st.sampled_from(["admit", "step", "filter", "submit", "abort", "preempt"]),
                min_size=1,
                max_size=8,
            )
        )
        def checkpoint_then_restore_repeats_the_continuation(self, ops):
            self.op()
            cp = self.sched.checkpoint()
            first = continuation(self.sched, self.tok, ops, len(self.sched.events))
            self.sched.restore(cp)
            self.rows_at = {s: n for s, n in self.rows_at.items() if s < self.sched.step_index}
            again = continuation(self.sched, self.tok, ops, len(self.sched.events))
            STATS["restores"] += 1
            assert again == first, f"restored continuation {ops} differs"
            self.submitted += [u for u in self.sched.requests if u not in self.submitted]

        @rule()
        def admit(self):
            self.op()
            self.sched.admit()

        @rule()
        def step(self):
            self.op()
            rows, at = len(self.sched.batch.rows), self.sched.step_index
            self.sched.step()
            if self.sched.step_index > at:
                self.rows_at[at] = rows  # the batch size this step ran with, for step_metrics

        @rule()
        def filter(self):
            self.op()
            self.sched.filter()

        @precondition(lambda self: self.submitted)
        @rule(data=st.data())
        def abort(self, data):
            self.op()
            self.sched.abort(data.draw(st.sampled_from(self.submitted)))

        @precondition(lambda self: self.sched.snapshot().batch_size)
        @rule(data=st.data())
        def preempt(self, data):
            self.op()
            snap = self.sched.snapshot()
            live = [u for u, done in zip(snap.uids, snap.finished) if not done]
            if live:
                self.sched.preempt(data.draw(st.sampled_from(live)))

        @rule(data=st.data())
        def interrupted_operation_changes_nothing(self, data):
            self.op()
            st_, rows = self.sched.state, self.sched.batch.rows
            unfinished = [u for u in self.submitted if not self.sched.requests[u].finished]
            running = [r.uid for r in rows if not r.finished]
            ops = (
                ([("admit", ())] if st_.queue or st_.prefilling else [])
                + ([("step", ())] if rows else [])
                + ([("filter", ())] if any(r.finished for r in rows) else [])
                + ([("abort", (u,)) for u in unfinished] + [("preempt", (u,)) for u in running])
            )
            if not ops:
                return
            op, args = data.draw(st.sampled_from(ops))
            points = ["clock"] if op in ("abort", "preempt") else ["layer", "eval", "on_token", "clock"]
            point = data.draw(st.sampled_from(points))
            with (
                wrapped_layers(self.model, self.injector)
                if point == "layer"
                else patched_eval(self.injector)
                if point == "eval"
                else contextlib.nullcontext()
            ):
                cp = (
                    self.sched.checkpoint()
                )  # count the call's points, undo it, then interrupt at one of them
                self.injector.arm(10**9)
                try:
                    getattr(self.sched, op)(*args)
                finally:
                    n_points = self.injector.count
                    self.injector.disarm()
                    self.sched.restore(cp)
                if not n_points:
                    return
                k = data.draw(st.integers(1, n_points))
                before = engine_state(self.sched)
                self.injector.arm(k)
                try:
                    getattr(self.sched, op)(*args)
                except KeyboardInterrupt:
                    STATS["interrupts"] += 1
                    assert engine_state(self.sched) == before, (
                        f"{op} interrupted at {point} point {k} changed the engine"
                    )
                finally:
                    self.injector.disarm()
                assert self.injector.fired, f"{op} did not reach {point} point {k} of {n_points}"
                self.injector.fired = 0

        @invariant()
        def integrity_check_is_ok(self):
            if hasattr(self, "sched"):
                report = self.sched.check()
                assert report.ok, str(report)

        @invariant()
        def rows_are_conserved_and_geometry_is_consistent(self):
            if not hasattr(self, "sched"):
                return
            snap = self.sched.snapshot()
            prefilling = [u for u, _, _ in snap.prefilling]
            places = list(snap.queue) + prefilling + list(snap.uids)
            assert len(places) == len(set(places)), f"a uid is in two places: {places}"
            # the engine's event log itself (what report().events tabulates), read after every
            # operation without building a DataFrame of the whole log each time
            finishes = [e.uid for e in self.sched.events if e.kind == "finish"]
            finished = set(finishes)
            for uid in self.submitted:
                assert uid in places or uid in finished, f"uid {uid} was lost"
            for g in snap.groups:
                if g.name == "full":
                    assert (g.offset + g.left_padding == g.kv_width_tokens).all()
                    assert g.mask.shape == (snap.batch_size, g.kv_width_tokens + 1)
            for r, uid in enumerate(snap.uids):
                assert snap.context_tokens[r] >= len(self.sched.request_of(uid).prompt_ids)
            if self.sched.idle:
                assert snap.kv_bytes == 0
            assert len(finishes) == len(finished), "a uid finished twice"

        @invariant()
        def held_kv_bytes_never_exceed_the_budget(self):
            """The bytes the caches really hold (batch, prefilling group, prompt cache:
            the arrays' nbytes) stay within kv_budget_bytes after every operation."""
            if not hasattr(self, "sched") or self.sched.config.kv_budget_bytes is None:
                return
            snap = self.sched.snapshot()
            assert snap.held_bytes <= snap.kv_budget_bytes, (
                f"held {snap.held_bytes:,} (batch {snap.kv_bytes:,} + prefill {snap.prefill_kv_bytes:,} + prompt cache "
                f"{snap.prompt_cache_bytes:,}) > budget {snap.kv_budget_bytes:,}; projected {snap.kv_projected_bytes:,}"
            )

        @invariant()
        def the_projection_bounds_the_bytes_held(self):
            """Under a budget, what admission projects for the batch and the prefilling group
            is never below what their caches hold now. (Without one, step() keeps feeding
            finished rows until filter(), which the projection does not count.)"""
            if hasattr(self, "sched") and self.sched.config.kv_budget_bytes is not None:
                snap = self.sched.snapshot()
                assert snap.kv_bytes + snap.prefill_kv_bytes <= snap.kv_projected_bytes, (
                    f"held {snap.kv_bytes + snap.prefill_kv_bytes:,} > projected {snap.kv_projected_bytes:,}"
                )

        @invariant()
        def finished_greedy_rows_equal_solo(self):
            if not hasattr(self, "sched"):
                return
            for uid in oracle.checkable_uids(self.sched):
                if uid in self.checked:
                    continue
                valid = self.sched.request_of(uid)
                key = (folder, valid.prompt_ids, valid.request.max_tokens, tuple(sorted(self.ref_kv.items())))
                if key not in _REFS:
                    _REFS[key] = oracle.solo_reference(
                        self.model, oracle.ref_request(valid), max_kv_size=max_kv_size, **self.ref_kv
                    )
                result = oracle.compare_row(
                    uid, oracle.scheduler_trace(self.sched, uid), _REFS[key], atol=1e-4
                )
                STATS["rows_checked"] += 1
                if not result.match:
                    STATS["divergences"] += 1
                assert result.match, result.describe()
                self.checked.add(uid)

        @invariant()
        def finished_top_k_rows_and_samples_equal_their_run_alone(self):
            if not hasattr(self, "sched"):
                return
            for uid, req in self.alone.items():
                if uid in self.checked or self.sched.finish_reason(uid) not in ("stop", "length"):
                    continue
                key = (folder, repr(req), tuple(sorted(self.settings.items())))
                if key not in _REFS:
                    _REFS[key] = run_alone(self.model, self.tok, req, **self.settings)
                tokens, logprobs, top, reason = _REFS[key]
                STATS["rows_checked"] += 1
                mine = self.sched.request(uid)
                same = (
                    mine.tokens == tokens
                    and mine.finish_reason == reason
                    and all(top_k_close(a, b, 1e-4) for a, b in zip(mine.top_logprobs, top))
                    and len(mine.top_logprobs) == len(top)
                )
                if not same:
                    STATS["divergences"] += 1
                assert same, f"uid {uid} differs from its run alone: {mine.tokens} vs {tokens}"
                assert max((abs(a - b) for a, b in zip(mine.logprobs, logprobs)), default=0.0) <= 1e-4
                self.checked.add(uid)

        @invariant()
        def finished_constrained_rows_keep_their_grammar_and_equal_their_constrained_solo_run(self):
            if not hasattr(self, "sched"):
                return
            for uid in sorted(self.constrained - self.checked):
                reason, valid = self.sched.finish_reason(uid), self.sched.request_of(uid)
                if reason not in ("stop", "length"):
                    continue
                V, tokens = self.sched.vocab_size, self.sched.tokens(uid)
                fresh = row_grammar(
                    constraint_of(valid.request, self.tok, V), self.tok, V, len(valid.prompt_ids)
                )
                try:
                    fresh.sync([t for t in tokens if t not in valid.stop_ids])
                except GrammarError as exc:
                    raise AssertionError(f"uid {uid}: its tokens break its own grammar: {exc}") from None
                if reason == "stop":
                    assert satisfies(valid.request, self.sched.text(uid)), (
                        uid,
                        valid.request,
                        self.sched.text(uid),
                    )
                if valid.request.temperature == 0:
                    key = (
                        folder,
                        valid.prompt_ids,
                        valid.request.max_tokens,
                        repr(
                            CONSTRAINTS.index(
                                {
                                    f: getattr(valid.request, f)
                                    for f in ("json_schema", "regex", "choices")
                                    if getattr(valid.request, f) is not None
                                }
                            )
                        ),
                        tuple(sorted(self.ref_kv.items())),
                    )
                    if key not in _REFS:
                        _REFS[key] = constrained_reference(
                            self.model, self.tok, valid, V, max_kv_size=max_kv_size, **self.ref_kv
                        )
                    result = oracle.compare_row(
                        uid, oracle.scheduler_trace(self.sched, uid), _REFS[key], atol=1e-4
                    )
                    assert result.match, result.describe()
                STATS["constrained_checked"] += 1
                self.checked.add(uid)

        def teardown(self):  # drain: every request must end, once
            if not hasattr(self, "sched"):
                return
            self.sched.run()
            self.finished_greedy_rows_equal_solo()
            self.finished_top_k_rows_and_samples_equal_their_run_alone()
            self.finished_constrained_rows_keep_their_grammar_and_equal_their_constrained_solo_run()
            ev = self.sched.report().events
            finishes = ev[ev.kind == "finish"].uid.tolist()
            assert sorted(finishes) == sorted(self.submitted), "every uid ends in exactly one terminal state"
            drafts = ev[ev.kind == "draft"]
            STATS["drafted_tokens"] += int(drafts.n_tokens.sum()) if len(drafts) else 0
            STATS["accepted_tokens"] += int(drafts.n_accepted.sum()) if len(drafts) else 0
            for uid, message in self.hostile.items():
                reason = self.sched.finish_reason(uid)
                assert reason in ("error", "abort"), f"hostile uid {uid} ended {reason}"
                if reason == "error":
                    assert re.match(message, self.sched.error(uid)), (uid, self.sched.error(uid), message)
                    STATS["hostile_errors"] += 1
            assert self.sched.idle and self.sched.snapshot().kv_bytes == 0
            if family in PACKED:  # its batch holds joining rows too; occupancy counts joined rows only
                STATS["cached_admissions"] += int((ev[ev.kind == "admit"].n_cached > 0).sum())
                return
            steps = step_metrics(ev).set_index("step").batch_size
            wrong = {
                s: (int(steps[s]), n) for s, n in self.rows_at.items() if s in steps.index and steps[s] != n
            }
            assert not wrong, f"step_metrics batch size != rows that ran (step: (metric, true)): {wrong}"

    return EngineMachine


def top_k_close(a, b, atol: float) -> bool:
    """Two tokens' top-k lists agree: values within ``atol`` rank by rank, ids equal except
    between candidates whose values are within ``atol`` of a neighbour's (a near tie)."""
    if len(a) != len(b) or any(abs(x[1] - y[1]) > atol for x, y in zip(a, b)):
        return False
    values = [v for _, v in a]
    tie = [
        any(abs(values[i] - values[j]) <= atol for j in (i - 1, i + 1) if 0 <= j < len(values))
        or i == len(values) - 1
        for i in range(len(values))
    ]
    return all(x[0] == y[0] or t for x, y, t in zip(a, b, tie))


def _settings(request):
    long = request.config.getoption("--long")
    return settings(
        max_examples=70 if long else 6,
        stateful_step_count=40 if long else 35,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=not long,
    )


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=pytest.mark.quantized_kv) if f in KV_BITS else f for f in FAMILIES]
)
def test_random_operation_sequences_keep_every_invariant(family, request):
    machine = make_machine(family)
    machine.TestCase.settings = _settings(request)
    before = dict(STATS)
    machine.TestCase("runTest").runTest()
    assert STATS["operations"] > before["operations"]
    if family in SPECULATIVE:  # rows drafted, and the target accepted some drafts and rejected others
        drafted = STATS["drafted_tokens"] - before["drafted_tokens"]
        accepted = STATS["accepted_tokens"] - before["accepted_tokens"]
        assert 0 < accepted < drafted, (family, accepted, drafted)
    if family in PACKED:  # prompts cut at four starts share prefixes: some rows start on cached pages
        assert STATS["cached_admissions"] > before["cached_admissions"]
