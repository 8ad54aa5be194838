"""Stateful fuzzing of the batch-invariant mode: random schedules (submit at random steps,
prompt lengths 1..120, max_tokens, max_batch 1..6, chunk sizes, greedy and seeded sampled
rows, prompt cache on/off, pacing on/off, a checkpoint restored at a random point, aborts)
on every family the mode accepts. Every finished row is bit-equal — tokens and log-probs,
``==`` — to the same request run alone in the mode (:func:`workbench.verify.invariance.alone`
with the same ``prefill_step_size``), and ``sched.check()`` is ok after every operation.

The suite runs with MLX's reference BLAS, under which the default path is often invariant
too (a broken mode can pass there), so the last test runs this fuzzer again in a process with
OpenBLAS, where the default path is not invariant: with the mode's row-blocked projections
turned off it fails there on its first schedules. CI runs a bounded
number of examples (the settings of ``tests/verify/test_fuzz.py``); ``--long`` runs more."""

import os
import subprocess
import sys

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import workbench as wb
from tests.verify.test_fuzz import _settings, model_of
from workbench.runtime.blas import find_blas
from workbench.verify import invariance
from workbench.workloads.workload import prompt_of_length

pytestmark = pytest.mark.model

FAMILIES = ("tiny-llama", "tiny-qwen3", "tiny-mamba2", "tiny-qwen3-next", "tiny-code")
_ALONE: dict = {}
STATS = {"operations": 0, "rows_checked": 0, "restores": 0}


def make_machine(folder: str):
    class InvariantMachine(RuleBasedStateMachine):
        @initialize(
            max_batch=st.integers(1, 6),
            chunk=st.sampled_from([3, 8, 16, 64]),
            prompt_cache=st.sampled_from([None, 4]),
            pacing=st.booleans(),
        )
        def setup(self, max_batch, chunk, prompt_cache, pacing):
            self.model, self.tok = model_of(folder)
            self.chunk = chunk  # every row's run alone prefills in the same chunks
            mode = wb.SchedulerConfig(
                max_batch=max_batch,
                prefill_step_size=chunk,
                batch_invariant=True,
                pacing=pacing,
                history_size=0,
            )
            self.sched = wb.Scheduler(self.model, self.tok, mode, prompt_cache=prompt_cache)
            self.saved = None
            self.checked: set = set()

        @rule(
            n=st.integers(1, 120),
            start=st.integers(0, 60),
            max_tokens=st.integers(1, 10),
            seed=st.one_of(st.none(), st.integers(0, 3)),
        )
        def submit(self, n, start, max_tokens, seed):
            """A greedy row, or a seeded sampled one; prompts starting at a few offsets
            share prefixes (prompt-cache hits)."""
            STATS["operations"] += 1
            sampled = {} if seed is None else {"temperature": 0.8, "top_p": 0.95, "seed": seed}
            self.sched.submit(
                wb.Request(
                    prompt=prompt_of_length(self.tok, n, start * 7),
                    max_tokens=max_tokens,
                    stop_ids=[],
                    **sampled,
                )
            )

        @rule(op=st.sampled_from(["admit", "step", "filter", "step", "step"]))
        def engine_call(self, op):
            STATS["operations"] += 1
            getattr(self.sched, op)()

        @precondition(lambda self: self.sched.requests)
        @rule(data=st.data())
        def abort(self, data):
            STATS["operations"] += 1
            self.sched.abort(data.draw(st.sampled_from(sorted(self.sched.requests))))

        @rule()
        def take_checkpoint(self):
            STATS["operations"] += 1
            self.saved = self.sched.checkpoint()

        @precondition(lambda self: self.saved is not None)
        @rule()
        def restore_the_checkpoint(self):
            """Back to the saved point: what finished since is undone and runs again."""
            STATS["operations"] += 1
            STATS["restores"] += 1
            self.sched.restore(self.saved)
            self.checked = {
                u for u in self.checked if u in self.sched.requests and self.sched.requests[u].finished
            }

        @invariant()
        def the_engine_is_consistent_and_finished_rows_equal_alone(self):
            if hasattr(self, "sched"):
                assert self.sched.check().ok, str(self.sched.check())
                self.finished_rows_are_bit_equal_to_their_run_alone()

        def finished_rows_are_bit_equal_to_their_run_alone(self):
            for uid, state in self.sched.requests.items():
                if (
                    uid in self.checked
                    or not state.finished
                    or self.sched.finish_reason(uid) in ("abort", "error")
                ):
                    continue
                req = self.sched.request_of(uid).request
                key = (
                    folder,
                    self.chunk,
                    tuple(self.sched.request_of(uid).prompt_ids),
                    req.max_tokens,
                    req.temperature,
                    req.seed,
                )
                if key not in _ALONE:
                    _ALONE[key] = invariance.alone(self.model, self.tok, req, self.chunk)
                got = (self.sched.tokens(uid), self.sched.logprobs(uid))
                d = invariance.first_difference(list(zip(*got)), list(zip(*_ALONE[key])))
                assert d is None, (
                    f"{folder} uid {uid} (chunk {self.chunk}, seed {req.seed}) differs from its run "
                    f"alone from token {d}: {got} vs {_ALONE[key]}"
                )
                STATS["rows_checked"] += 1
                self.checked.add(uid)

        def teardown(self):  # drain: every row that finishes is checked
            if hasattr(self, "sched"):
                self.sched.run()
                self.finished_rows_are_bit_equal_to_their_run_alone()
                assert self.sched.idle

    return InvariantMachine


@pytest.mark.filterwarnings(r"ignore:step\(\). no row is running:UserWarning")
@pytest.mark.parametrize("folder", FAMILIES)
def test_random_schedules_keep_every_finished_row_bit_equal_to_its_run_alone(folder, request):
    machine = make_machine(folder)
    base = _settings(request)  # the engine fuzzer's, with more examples: a mode's step is cheap to check
    machine.TestCase.settings = settings(base, max_examples=base.max_examples * 4)
    before = STATS["rows_checked"]
    machine.TestCase("runTest").runTest()
    assert STATS["rows_checked"] > before
    print(f"{folder}: {STATS['rows_checked'] - before} finished rows bit-equal to alone")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is the Linux CPU's optimized BLAS")
def test_the_fuzzer_holds_with_openblas_where_the_default_path_is_not_invariant(monkeypatch):
    monkeypatch.delenv("WORKBENCH_BLAS", raising=False)
    library = find_blas()
    if library is None:
        pytest.skip("no optimized BLAS installed here (.ci/run installs Debian's libopenblas0-pthread)")
    env = {**os.environ, "WORKBENCH_BLAS": library}  # set: tests/conftest.py keeps it, no restart
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-o",
            "addopts=",
            "-q",
            "-p",
            "no:cacheprovider",
            __file__,
            "-k",
            "not openblas",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "5 passed" in out.stdout, out.stdout[-2000:]
