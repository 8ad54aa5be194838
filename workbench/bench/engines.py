"""The engines under benchmark behind one small interface, and the driver that feeds them
the same arrivals.

Knows: the Scheduler's ``submit / admit / step / filter``, mlx-lm's ``BatchGenerator``
(``insert / next_generated / close``), the event records. Must not know: what is measured
or reported (:mod:`workbench.bench.run` does that).

An *engine* here has ``submit(prompt_ids, max_tokens) -> uid``, ``iterate() -> tokens``,
``idle``, ``events`` and ``close()``. One iteration is what the engine's own loop does
once:

- ``WorkbenchEngine``: ``admit(); step(); filter()`` (the body of ``Scheduler.run``): at
  most one prefill chunk (``interleave_prefill``), one ``[B, 1]`` decode step, evictions.
- ``MlxLmEngine``: one ``next_generated()``: one decode step and at most one prompt chunk
  (mlx-lm's ``BatchGenerator._next``), evictions inside; with ``max_in_flight``, the
  requests it has room for are inserted first (the rest wait in the adapter's queue).

Both decode greedily with no stop ids (every request runs to ``max_tokens``). The
workbench's ``events`` are its own log; mlx-lm has none, so its adapter records the same
kinds (``submit``, ``token``, ``finish``) stamped with the time ``next_generated()``
returned, and :mod:`workbench.observe.metrics` reads both logs alike.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from mlx_lm.generate import BatchGenerator

from ..engine.request import Request
from ..engine.scheduler import Scheduler
from ..observe.events import Event


class WorkbenchEngine:
    """The workbench :class:`~workbench.engine.scheduler.Scheduler` as a benchmark engine.

    Args:
        model, tokenizer: the model under test and any tokenizer (prompts are token ids).
        max_batch, prefill_step_size: the Scheduler's.
        **scheduler_kwargs: any other Scheduler keyword (``clock``, ``history_size``,
            ``interleave_prefill``, ``pipeline``, ...).
    """

    name = "workbench"

    def __init__(
        self, model: Any, tokenizer: Any, max_batch: int, prefill_step_size: int, **scheduler_kwargs: Any
    ):
        self.sched = Scheduler(
            model, tokenizer, max_batch=max_batch, prefill_step_size=prefill_step_size, **scheduler_kwargs
        )

    def submit(self, prompt_ids: Sequence[int], max_tokens: int) -> int:
        """Queue one request (prompt ids, max_tokens); returns its id."""
        return self.sched.submit(Request(prompt=list(prompt_ids), max_tokens=max_tokens, stop_ids=[]))

    def iterate(self) -> int:
        """One engine iteration (``admit(); step(); filter()``); returns the tokens produced."""
        self.sched.admit()
        tokens = sum(e.kind == "token" for e in self.sched.step())
        self.sched.filter()
        return tokens

    @property
    def idle(self) -> bool:
        """True when nothing is queued, prefilling or running."""
        return self.sched.idle

    @property
    def events(self) -> list[Event]:
        """The scheduler's event log as a DataFrame (time_s in seconds)."""
        return self.sched.events

    def read_history(self) -> tuple[int, float]:
        """Convert every recorded snapshot to numpy (the engine records them lazily, see
        :class:`workbench.observe.recorder.History`); returns ``(snapshots, seconds)``."""
        start = time.perf_counter()
        n = len(list(self.sched.history))
        return n, time.perf_counter() - start

    def close(self) -> None:
        """Release the engine (nothing to free for the workbench)."""
        pass


class MlxLmEngine:
    """mlx-lm's ``BatchGenerator`` as a benchmark engine (greedy, no stop tokens).

    Args:
        max_batch: ``completion_batch_size`` and ``prefill_batch_size`` (rows decoding,
            rows prefilling at once), as the workbench's ``max_batch``.
        prefill_step_size: mlx-lm's prompt chunk length in tokens.
        clock: stamps the recorded events.
        max_in_flight: ``None`` (mlx-lm as shipped), or the most requests the adapter keeps
            inserted and unfinished in the ``BatchGenerator`` (prefilling or decoding); the
            others wait in the adapter's queue, first come first served, and are inserted
            before the first iteration with room, counting as room the rows that the
            iteration's decode step ends at their ``max_tokens`` (they leave the generation
            batch inside that step, before ``BatchGenerator._next`` takes new prompts, so a
            held prompt starts its prefill in the same iteration as it would with the cap
            inside mlx-lm; no stop tokens here, so no row ends sooner, and the cap holds
            after every iteration). A request's ``submit`` is stamped
            when :meth:`submit` is called, so its TTFT counts that wait, as the
            workbench's counts its queue. ``max_in_flight=max_batch`` is the workbench's
            capacity: at most ``max_batch`` requests admitted (vLLM's ``max_num_seqs``).

    Attributes:
        peak_rows: the most requests in flight after any iteration (its generation batch
            plus its prompt batch). Without ``max_in_flight`` it can pass ``max_batch``:
            ``BatchGenerator._next`` sizes the prompts it takes by the generation batch
            *before* moving the prefilled prompts into it, so after a few rows finish at
            once the generation batch grows past ``completion_batch_size`` (measured:
            ``docs/packed.md``, "Latency goals").

    Raises:
        ValueError: ``max_in_flight`` neither ``None`` nor an int >= 1.
    """

    name = "mlx-lm"

    def __init__(
        self,
        model: Any,
        max_batch: int,
        prefill_step_size: int,
        clock: Callable[[], float] = time.perf_counter,
        max_in_flight: int | None = None,
    ):
        if max_in_flight is not None and (
            not isinstance(max_in_flight, int) or isinstance(max_in_flight, bool) or max_in_flight < 1
        ):
            raise ValueError(
                f"max_in_flight must be an int >= 1 (requests) or None (mlx-lm as shipped), got {max_in_flight!r}"
            )
        self.gen = BatchGenerator(
            model,
            completion_batch_size=max_batch,
            prefill_batch_size=max_batch,
            prefill_step_size=prefill_step_size,
        )
        self.clock = clock
        self.max_in_flight = max_in_flight
        self.events: list[Event] = []
        self._held: deque[tuple[int, list[int], int]] = deque()  # (uid, prompt, max_tokens) not inserted
        self._uid_of: dict[int, int] = {}  # the BatchGenerator's uid -> this adapter's
        self._active: set[int] = set()  # inserted, unfinished (adapter uids)
        self._left: dict[int, int] = {}  # adapter uid -> tokens still to come
        self._next_uid = 0
        self._iterations = 0
        self.peak_rows = 0

    def submit(self, prompt_ids: Sequence[int], max_tokens: int) -> int:
        """Queue one request and insert it into mlx-lm's ``BatchGenerator`` (mirrors
        ``insert``) if ``max_in_flight`` leaves room; returns its uid."""
        uid, self._next_uid = self._next_uid, self._next_uid + 1
        self._held.append((uid, list(prompt_ids), max_tokens))
        self._left[uid] = max_tokens
        self.events.append(Event("submit", uid, self._iterations, self.clock(), n_tokens=len(prompt_ids)))
        self._insert_held()
        return uid

    def _insert_held(self) -> None:
        """Insert held requests, oldest first, while ``max_in_flight`` leaves room in the
        coming iteration (the class docstring)."""
        room = len(self._held)
        if self.max_in_flight is not None:
            ending = sum(self._left[self._uid_of[g]] == 1 for g in self.gen._generation_batch.uids)
            room = self.max_in_flight - (len(self._active) - ending)
        for _ in range(min(room, len(self._held))):
            uid, prompt, max_tokens = self._held.popleft()
            self._uid_of[self.gen.insert([prompt], max_tokens=[max_tokens])[0]] = uid
            self._active.add(uid)

    def iterate(self) -> int:
        """Insert what ``max_in_flight`` has room for, then one
        ``BatchGenerator.next_generated()`` call, its tokens stamped as token/finish events;
        returns the tokens produced."""
        self._insert_held()
        responses = self.gen.next_generated()
        now_s = self.clock()
        in_flight = len(self.gen._generation_batch) + len(self.gen._prompt_batch)  # mlx-lm's own books
        self.peak_rows = max(self.peak_rows, in_flight)
        for r in responses:
            uid = self._uid_of[r.uid]
            self._left[uid] -= 1
            self.events.append(Event("token", uid, self._iterations, now_s, token=int(r.token)))
            if r.finish_reason is not None:
                self.events.append(
                    Event("finish", uid, self._iterations, now_s, finish_reason=r.finish_reason)
                )
                self._active.discard(uid)
        self._iterations += 1
        return len(responses)

    @property
    def idle(self) -> bool:
        """True when every submitted request has finished."""
        return not self._active and not self._held

    def close(self) -> None:
        """Close the ``BatchGenerator`` (mirrors its ``close``)."""
        self.gen.close()


@dataclass(frozen=True)
class Arrival:
    """A request of a benchmark workload: submitted once ``at_s`` seconds have passed
    since the drive started *and* ``at_iteration`` engine iterations have run."""

    prompt: tuple[int, ...]
    max_tokens: int
    at_s: float = 0.0
    at_iteration: int = 0


ITERATION_COLUMNS = ["iteration", "time_s", "tokens"]


def drive(
    engine: Any, arrivals: Sequence[Arrival], clock: Callable[[], float] = time.perf_counter
) -> pd.DataFrame:
    """Run ``engine`` until every arrival was submitted and it is idle again.

    Arrivals are submitted in the given order, each when due; an idle engine does not
    wait for ``at_iteration`` and the driver sleeps until the next ``at_s``. Returns one
    row per iteration with ``ITERATION_COLUMNS``: ``time_s`` is the clock when the
    iteration returned, ``tokens`` how many tokens it produced; ``attrs["start_s"]`` is
    the clock when the drive started (before the first submit).
    """
    start_s, done, rows = clock(), 0, []
    while done < len(arrivals) or not engine.idle:
        while done < len(arrivals):
            due_s = start_s + arrivals[done].at_s
            if not engine.idle and (arrivals[done].at_iteration > len(rows) or clock() < due_s):
                break
            time.sleep(max(0.0, due_s - clock()))
            engine.submit(arrivals[done].prompt, arrivals[done].max_tokens)
            done += 1
        tokens = engine.iterate()
        rows.append((len(rows), clock(), tokens))
    frame = pd.DataFrame(rows, columns=ITERATION_COLUMNS)
    frame.attrs["start_s"] = start_s
    return frame
