"""The schedule fuzzer: random schedules of every engine verb, in both layouts, pipelined
and not, each row checked against its run alone.

Each example is one seed of a seeded generator (``random.Random(seed)``), and ``seed % 3``
picks its regime (:data:`REGIMES`), so that any three consecutive seeds cover all three:

- ``broad``: ``layout`` padded or packed; ``pipeline`` on or off; ``max_batch`` 1..4; prefill
  chunk / token budget 4, 16 or 64; pages of 1, 4 or 16 positions; a KV budget of 1, 1.25,
  1.5, 2 or 3 units, or none (a unit: the largest request's projected bytes, 200 + 16
  tokens, as the scheduler's own ledger projects them, which is what ``submit`` refuses
  against: 1 admits it alone); a prompt cache, or none; in the padded layout prompt-lookup
  speculation with 1 or 3 draft tokens, or none; the ``fcfs``, ``priority`` or
  ``shortest-prompt-first`` admission policy;
- ``packed-pipelined``: the packed layout, pipelined, ``fcfs``, ``max_batch`` 2 or 3, a
  budget of 2 or 3 units or none, no urgent arrivals (a preempted row is admitted again at
  once while another row's forward is in flight: issue 42's finding 1);
- ``held-prompts``: the padded layout without a prompt cache, the ``priority`` policy,
  ``max_batch`` 1..3 and a budget of 1.25 or 1.5 units (a sample's held prompt fits beside
  one row, a second row does not), fewer plain submissions, ``submit_n`` and urgent
  arrivals more often, and an urgent arrival eight times likelier while a prompt is held
  (samples wait, a more urgent long request comes: issue 42's finding 2);

then 40 operations:
``submit`` (greedy, seeded sampled, constrained by a regex or a JSON schema; priority 0 to 2;
prompts of 1 to 48 tokens, one in ten of 49 to 200), ``submit_n`` (2 to 4 samples, greedy
or sampled: held prompts while samples wait), an urgent ``submit`` (49 to 200 prompt tokens,
a priority above every request's so far: admission preempts for it under a budget),
``admit``, ``step``, ``filter``, ``run()``'s own ``admit(); step(); filter()``, ``preempt``
(a running row, or a joining one in the packed layout; refused, naming ``kv_budget_bytes``,
for a row that could never resume), ``abort``, ``checkpoint`` and ``restore`` (in memory,
to any checkpoint kept), ``fork`` (the schedule goes on in the fork; the original is drained
and checked too) and, in the padded layout, a checkpoint file round trip (``save``,
``Checkpoint.load`` into a fresh scheduler, which takes over). Prompts are cut at four
starts of the prompt set, so they share prefixes (prompt-cache and page hits).

What must hold:

- after every operation ``sched.check()`` is ok;
- admission never idles: after an ``admit()`` on an engine with no row running and none
  prefilling, the queue is empty (else the engine is *wedged*: ``run()`` would loop for ever;
  the example fails at that ``admit()``, naming the queue, the held prompts and the budget);
- the drain (at most :meth:`Schedule.drain_bound` iterations of ``admit(); step(); filter()``:
  twice the unfinished requests' prefill chunks and tokens left, one at a time, or
  :data:`DRAIN_ITERATIONS`) ends idle, every request finished once;
- every row that finished ``stop`` or ``length`` equals its run alone: a greedy row its
  mlx-lm solo run (:func:`workbench.verify.oracle.solo_reference`, tokens equal but for
  near ties, log-probs within 1e-4), a constrained greedy row its constrained solo run
  (:func:`workbench.verify.constrained.constrained_reference`), a sampled row (a ``submit_n``
  sample ``i`` as ``Request(seed=seed + i)``) the same request alone through the padded
  engine (``tests/engine/alone.py``: tokens and finish reason equal, log-probs within 1e-4);
  no row ends ``error``.

CI runs :data:`CI_EXAMPLES` seeds (each a test case, ``[seed-N]``; which of them find issue
42's findings 1 and 2 on the code before their fixes: docs/concepts.md, Oracles). The long
mode is a command:
``WORKBENCH_FUZZ_EXAMPLES=200 pytest -n 0 tests/verify/test_fuzz_schedules.py`` (seeds
``WORKBENCH_FUZZ_SEED``, default 0, on); a failure names its seed, its scheduler and the
operations, and ``WORKBENCH_FUZZ_SEED=N WORKBENCH_FUZZ_EXAMPLES=1`` replays it
(docs/concepts.md).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

import workbench as wb
from tests.engine.alone import run_alone
from tests.verify.test_fuzz import CONSTRAINTS, model_of
from workbench.engine.checkpoint import Checkpoint
from workbench.verify import oracle
from workbench.verify.constrained import constrained_reference
from workbench.workloads.workload import prompt_of_length

pytestmark = [pytest.mark.model, pytest.mark.filterwarnings(r"ignore:step\(\). no row is running")]

CI_EXAMPLES = 12  # seeds in CI: four of each regime (those that find issue 42's findings: docs/concepts.md)
EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", CI_EXAMPLES))
FIRST_SEED = int(os.environ.get("WORKBENCH_FUZZ_SEED", 0))
OPERATIONS = 40  # operations per schedule, before the drain
DRAIN_ITERATIONS = 400  # admit(); step(); filter() iterations the drain may take, at least (drain_bound)
LONGEST_PROMPT, MOST_TOKENS = 200, 16  # prompt tokens, max_tokens of the largest request
SHORT_PROMPT, LONG_PROMPTS = 48, 0.1  # most rows' longest prompt; the share of longer ones
STARTS = (0, 40, 80, 120)  # prompts cut at these starts of the prompt set share prefixes
ATOL = 1e-4  # log-prob tolerance against a run alone
MODEL = "tiny-code"  # the bundled, trained llama-family model: both layouts, prompt lookup

# an operation's name and its weight in the draw
WEIGHTS = {
    "submit": 4,
    "submit_sampled": 1,
    "submit_structured": 1,
    "submit_n": 1,
    "submit_urgent": 1,
    "iterate": 8,
    "admit": 1,
    "step": 1,
    "filter": 1,
    "preempt": 3,
    "abort": 1,
    "checkpoint": 1,
    "restore": 1,
    "fork": 0.4,
    "save_load": 0.4,
}
# seed % 3 picks the regime: the settings it draws from (draw_settings) and the weights it changes
REGIMES = ("broad", "packed-pipelined", "held-prompts")
POLICIES = ["fcfs", "priority", "priority", "shortest-prompt-first"]
REGIME_SETTINGS = {  # packed, pipeline: probabilities; the rest (prompt_cache: padded's): lists drawn from
    "broad": dict(
        packed=0.5,
        pipeline=0.7,
        max_batch=[1, 2, 2, 3, 3, 4],
        budget=[None, None, 1, 1.25, 1.5, 2, 3],
        policy=POLICIES,
        prompt_cache=[None, 4],
    ),
    # a preempted row joins again at once (first come, first served; room) while another
    # row's forward is in flight
    "packed-pipelined": dict(
        packed=1.0,
        pipeline=1.0,
        max_batch=[2, 2, 3],
        budget=[None, None, 2, 3],
        policy=["fcfs"],
        prompt_cache=[None],
    ),
    # a sample's held prompt fits beside one row, a second row does not; without a prompt
    # cache, whose prefixes bound every group as a held prompt does
    "held-prompts": dict(
        packed=0.0,
        pipeline=0.7,
        max_batch=[1, 2, 3],
        budget=[1.25, 1.5],
        policy=["priority"],
        prompt_cache=[None],
    ),
}
REGIME_WEIGHTS = {
    "broad": {},
    "packed-pipelined": {"submit_urgent": 0},
    "held-prompts": {  # a short queue: samples wait beside one row, urgent long ones arrive
        "submit": 0.5,
        "submit_sampled": 0.5,
        "submit_structured": 0.5,
        "submit_n": 2,
        "submit_urgent": 1.5,
        "iterate": 14,
        "preempt": 1,
    },
}
URGENT_WHILE_HELD = 8  # held-prompts: an urgent arrival this much likelier while a prompt is held
_REFS: dict = {}  # a reference run per request and settings, shared by the examples of a process


class ScheduleFailure(AssertionError):
    """A schedule broke a rule; the message names the seed, the scheduler and the operations."""


def draw_settings(rng: random.Random, regime: str = "broad") -> dict[str, Any]:
    """A scheduler's settings drawn from ``rng`` within ``regime`` (one of :data:`REGIMES`;
    the module docstring lists the ranges); ``budget`` is the KV budget in units of the
    largest request's projected bytes (``None``: none)."""
    choices = REGIME_SETTINGS[regime]
    packed = rng.random() < choices["packed"]
    chunk = rng.choice([4, 16, 64])
    max_batch = rng.choice(choices["max_batch"])
    settings = dict(
        max_batch=max_batch,
        prefill_step_size=chunk,
        pipeline=rng.random() < choices["pipeline"],
        history_size=0,
        budget=rng.choice(choices["budget"]),
        policy=rng.choice(choices["policy"]),
    )
    if packed:
        settings |= dict(
            layout="packed",
            page_size=rng.choice([1, 4, 16]),
            max_num_batched_tokens=max(chunk, max_batch),
            prompt_cache=rng.choice([None, 16]),
        )
    else:
        settings["prompt_cache"] = rng.choice(choices["prompt_cache"])
        draft = rng.choice([0, 0, 1, 3])
        if draft:
            settings |= dict(speculative="prompt-lookup", num_draft_tokens=draft)
    return settings


@dataclass
class Schedule:
    """One seed's schedule on ``model``: the scheduler it drives and what it did."""

    seed: int
    model: Any
    tok: Any
    folder: Path
    settings: dict = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.rng = random.Random(self.seed)
        self.regime = REGIMES[self.seed % len(REGIMES)]
        self.settings = draw_settings(self.rng, self.regime)
        self.weights = WEIGHTS | REGIME_WEIGHTS[self.regime]
        self.sched = self.build()
        self.saved: list[Checkpoint] = []  # checkpoints of self.sched, for restore
        self.others: list[wb.Scheduler] = []  # schedulers left behind by a fork, drained at the end
        self.files = 0

    def build(self) -> wb.Scheduler:
        """The scheduler of :attr:`settings`, its budget in units of the largest request's
        projected bytes (``LONGEST_PROMPT`` + ``MOST_TOKENS``) as its own ledger projects
        them, which is what ``submit`` refuses against: 1 admits the largest request alone."""
        settings = {k: v for k, v in self.settings.items() if k != "budget"}
        sched = wb.Scheduler(self.model, self.tok, **settings)
        units = self.settings["budget"]
        if units is None:
            return sched
        unit = sched.ledger.alone_bytes(LONGEST_PROMPT, MOST_TOKENS)
        return wb.Scheduler(self.model, self.tok, kv_budget_bytes=int(units * unit), **settings)

    def fail(self, problem: str) -> None:
        """Raise :class:`ScheduleFailure` with what replays it."""
        raise ScheduleFailure(
            f"seed {self.seed} (replay: WORKBENCH_FUZZ_SEED={self.seed} WORKBENCH_FUZZ_EXAMPLES=1 "
            f"pytest -n 0 tests/verify/test_fuzz_schedules.py): {problem}\n"
            f"regime: {self.regime}; settings: {self.settings}\noperations: {'; '.join(self.log)}"
        )

    # -- the operations -------------------------------------------------------------
    def request(self, max_tokens: int | None = None, long: bool | None = None, **fields: Any) -> wb.Request:
        """A request drawn from :attr:`rng`: a prompt of 1 to ``SHORT_PROMPT`` tokens (with
        ``long``, or one time in ten when ``None``, of ``SHORT_PROMPT + 1`` to ``LONGEST_PROMPT``),
        ``max_tokens`` 1 to 12 unless given, priority 0 to 2 unless given."""
        long = self.rng.random() < LONG_PROMPTS if long is None else long
        n = self.rng.randint(SHORT_PROMPT + 1, LONGEST_PROMPT) if long else self.rng.randint(1, SHORT_PROMPT)
        prompt = prompt_of_length(self.tok, n, self.rng.choice(STARTS))
        fields.setdefault("stop_ids", [])
        fields.setdefault("priority", self.rng.choice([0, 0, 1, 2]))
        return wb.Request(prompt=prompt, max_tokens=max_tokens or self.rng.randint(1, 12), **fields)

    def op_submit(self) -> str:
        return f"submit -> {self.sched.submit(self.request())}"

    def op_submit_sampled(self) -> str:
        req = self.request(temperature=0.8, seed=self.rng.randint(0, 99))
        return f"submit sampled -> {self.sched.submit(req)}"

    def op_submit_structured(self) -> str:
        which = self.rng.choice([0, 2, 3])  # a JSON schema, two regexes: EOS ends them
        req = self.request(self.rng.randint(4, MOST_TOKENS), stop_ids=None, **CONSTRAINTS[which])
        return f"submit {list(CONSTRAINTS[which])[0]} -> {self.sched.submit(req)}"

    def op_submit_n(self) -> str:
        sampled = self.rng.random() < 0.5
        req = self.request(temperature=0.8 if sampled else 0.0, seed=self.rng.randint(0, 99))
        uids = self.sched.submit_n(req, self.rng.randint(2, 4))
        return f"submit_n {'sampled' if sampled else 'greedy'} priority {req.priority} -> {uids}"

    def op_submit_urgent(self) -> str:
        """A long prompt more urgent than every request so far: it arrives while others (a
        ``submit_n``'s waiting samples, held prompts) wait or run, and admission preempts for it."""
        top = max((s.valid.request.priority for s in self.sched.requests.values()), default=0)
        req = self.request(self.rng.randint(1, MOST_TOKENS), long=True, priority=top + 1)
        return (
            f"submit urgent ({len(req.prompt)} tokens, priority {req.priority}) -> {self.sched.submit(req)}"
        )

    def op_iterate(self) -> str:  # run()'s iteration
        self.admit()
        if self.sched.batch.rows:
            self.sched.step()
        self.sched.filter()
        return "admit, step, filter"

    def admit(self) -> None:
        """``admit()``, failing at once when it leaves a queue on an engine with nothing
        running or prefilling: admission is wedged (every later iteration repeats it, and
        ``run()`` would never return)."""
        self.sched.admit()
        st = self.sched.state
        if st.queue and not st.batch.rows and st.prefilling is None:
            queued = {s.uid: (len(s.inputs), s.valid.request.priority) for s in st.queue}
            held = {g: len(h.tokens) for g, h in st.shared_prompts.items()}
            self.fail(
                f"admission is wedged (run() would never return): after admit(), nothing runs or "
                f"prefills and uids {{uid: (input tokens, priority)}} {queued} stay queued; prompts held "
                f"for submit_n samples {{group: tokens}} {held}; kv_budget_bytes "
                f"{self.sched.config.kv_budget_bytes}, policy {self.settings['policy']!r}"
            )

    def op_admit(self) -> str:
        self.admit()
        return "admit"

    def op_step(self) -> str:
        self.sched.step()
        return "step"

    def op_filter(self) -> str:
        self.sched.filter()
        return "filter"

    def op_preempt(self) -> str:
        joining = wb.Status.PREFILLING if self.settings.get("layout") == "packed" else wb.Status.RUNNING
        return self.on_one(
            "preempt", [r.uid for r in self.sched.batch.rows if r.status in (wb.Status.RUNNING, joining)]
        )

    def op_abort(self) -> str:
        return self.on_one("abort", [u for u, s in self.sched.requests.items() if not s.finished])

    def on_one(self, verb: str, uids: list[int]) -> str:
        """``sched.<verb>(uid)`` for one of ``uids`` drawn at random (none when empty)."""
        if not uids:
            return f"{verb} (no candidate)"
        uid = self.rng.choice(uids)
        try:
            getattr(self.sched, verb)(uid)
        except ValueError as e:  # a row that could never resume under the budget is not preempted
            if verb != "preempt" or "kv_budget_bytes" not in str(e):
                raise
            return f"{verb} {uid} refused ({e})"
        return f"{verb} {uid}"

    def op_checkpoint(self) -> str:
        self.saved = [*self.saved[-2:], self.sched.checkpoint()]
        return f"checkpoint #{len(self.saved) - 1} at step {self.sched.step_index}"

    def op_restore(self) -> str:
        if not self.saved:
            return "restore (no checkpoint)"
        i = self.rng.randrange(len(self.saved))
        self.sched.restore(self.saved[i])
        return f"restore #{i} (step {self.sched.step_index})"

    def op_fork(self) -> str:
        self.others.append(self.sched)
        self.sched, self.saved = self.sched.fork(), []
        return "fork (the schedule goes on in the fork)"

    def op_save_load(self) -> str:
        if self.settings.get("layout") == "packed":  # the file format holds no pages yet
            return "save/load (packed: not saved)"
        if any(s.valid.request.constrained and not s.finished for s in self.sched.requests.values()):
            return "save/load (a live constrained row: its grammar state is not saved)"
        path = self.folder / f"schedule-{self.seed}-{self.files}.safetensors"
        self.files += 1
        written = self.sched.checkpoint().save(path)
        fresh = self.sched.fresh()
        fresh.restore(Checkpoint.load(written, fresh))
        self.sched, self.saved = fresh, []
        return f"save {path.name}, load into a fresh scheduler"

    # -- the run and the oracle -----------------------------------------------------
    def play(self, operations: int = OPERATIONS) -> None:
        """Draw and apply ``operations`` operations, checking the engine after each, then
        drain every scheduler and check its rows."""
        names = list(self.weights)
        for _ in range(operations):
            weights = dict(self.weights)
            if self.regime == "held-prompts" and self.sched.state.shared_prompts:
                weights["submit_urgent"] *= URGENT_WHILE_HELD  # arrives while samples wait
            name = self.rng.choices(names, [weights[n] for n in names])[0]
            self.log.append(name)
            self.log[-1] = getattr(self, f"op_{name}")()
            self.check_engine(self.log[-1])
        for sched in [*self.others, self.sched]:
            self.sched = sched
            self.drain()
            self.check_rows()

    def check_engine(self, after: str) -> None:
        """``check()`` is ok, and (the scheduler's invariant between calls) every running
        row's tokens but its latest are in its cache: in the packed layout, in its pages
        (``snapshot().packed.held_tokens``), read through the public surface."""
        report = self.sched.check()
        if not report.ok:
            self.fail(f"check() after {after}: {report}")
        packed = self.sched.snapshot().packed
        if packed is None:
            return
        held = dict(packed.held_tokens)
        for uid in self.sched.snapshot().uids:
            view = self.sched.request(uid)
            known = len(view.prompt_ids) + len(view.tokens)
            if view.status is wb.Status.RUNNING and held.get(uid, 0) < known - 1:
                self.fail(
                    f"after {after}: uid {uid} runs with {held.get(uid, 0)} of {known} tokens in its pages"
                )

    def drain_bound(self) -> int:
        """Iterations the drain may take: twice what the unfinished requests need one at a
        time (a prefill iteration per chunk of their inputs, one per token left, two more
        each), at least :data:`DRAIN_ITERATIONS`; admission's preemptions restart prefills."""
        chunk = self.settings.get("max_num_batched_tokens", self.settings["prefill_step_size"])
        need = sum(
            -(-len(s.inputs) // chunk) + s.valid.request.max_tokens - len(s.tokens) + 2
            for s in self.sched.requests.values()
            if not s.finished
        )
        return max(DRAIN_ITERATIONS, 2 * need)

    def drain(self) -> None:
        bound = self.drain_bound()
        for i in range(bound):
            if self.sched.idle:
                break
            self.op_iterate()
            self.check_engine(f"drain iteration {i}")
        else:
            self.fail(f"not idle after {bound} drain iterations: queue {self.sched.queue}")
        unfinished = [u for u, s in self.sched.requests.items() if not s.finished]
        if unfinished:
            self.fail(f"idle with unfinished uids {unfinished}")

    def check_rows(self) -> None:
        """Every row that finished ``stop`` or ``length`` equals its run alone; none ended ``error``."""
        for uid, state in self.sched.requests.items():
            reason, valid = state.finish_reason, state.valid
            if reason == "error":
                self.fail(f"uid {uid} ended error: {state.message}")
            if reason not in ("stop", "length"):
                continue
            mine = oracle.scheduler_trace(self.sched, uid)
            if not valid.request.greedy:
                ref = self.reference(valid, sampled=True)
                same = list(ref.tokens) == mine.tokens and ref.finish_reason == reason
                close = all(abs(a - b) <= ATOL for a, b in zip(mine.logprobs, ref.logprobs))
                if not (same and close):
                    self.fail(
                        f"uid {uid} (sampled) differs from its run alone: {mine.tokens} vs {list(ref.tokens)}"
                    )
                continue
            result = oracle.compare_row(uid, mine, self.reference(valid), atol=ATOL)
            if not result.match:
                self.fail(f"uid {uid} differs from its run alone: {result.describe()}")

    def reference(self, valid: Any, sampled: bool = False) -> Any:
        """The run alone of ``valid`` (memoized): a sampled request's through the padded
        engine, a constrained one's and a greedy one's through mlx-lm."""
        chunk = self.settings["prefill_step_size"]
        structured = any(getattr(valid.request, f) is not None for f in ("regex", "json_schema"))
        plain = not (
            sampled or structured or valid.stop_ids or valid.stop
        )  # its tokens: a prefix of a longer run's
        key = (valid.prompt_ids if plain else repr(valid.request), chunk)
        if key not in _REFS:
            if sampled:
                _REFS[key] = run_alone(self.model, self.tok, valid.request, prefill_step_size=chunk)
            elif structured:
                V = self.sched.vocab_size
                _REFS[key] = constrained_reference(self.model, self.tok, valid, V, prefill_step_size=chunk)
            else:
                ref = oracle.ref_request(valid)
                _REFS[key] = oracle.solo_reference(
                    self.model, replace(ref, max_tokens=MOST_TOKENS) if plain else ref, chunk
                )
        if plain:  # the first max_tokens of the longest run
            ref, n = _REFS[key], valid.request.max_tokens
            return oracle.TokenTrace(ref.tokens[:n], ref.logprobs[:n], ref.margins[:n])
        return _REFS[key]


@pytest.mark.parametrize(
    "seed", [pytest.param(s, id=f"seed-{s}") for s in range(FIRST_SEED, FIRST_SEED + EXAMPLES)]
)
def test_every_row_of_a_random_schedule_equals_its_run_alone_and_admission_never_idles(seed, tmp_path):
    model, tok = model_of(MODEL)
    schedule = Schedule(seed, model, tok, tmp_path)
    schedule.play()
    assert len(schedule.log) == OPERATIONS
