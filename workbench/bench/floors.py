"""Latency floors of a benchmark's arrivals: the TTFT and the inter-token gap no scheduler
can beat on this machine, measured in the same run as the engines they bound.

Knows: :class:`~workbench.bench.engines.Arrival`, the event-log metrics
(:mod:`workbench.observe.metrics`). Must not know: which engines exist or how a run is
driven (the caller passes ``run(name, arrivals) -> events``: a fresh engine of that name
through those arrivals, measured or on a cost clock), how results are reported.

- **TTFT floor** of a request: its prompt alone in an idle engine, from submit to its first
  token: the prompt's prefill and its first forward, no queue, nothing else running. Run
  once per distinct prompt length (a forward's cost depends on its shape, not on the token
  ids), in every engine named, ``repeats`` times; the floor is the lowest of those runs
  (on a shared machine noise only adds time).
- **ITL floor**: the decode step at the run's batch size: ``batch_rows`` of the arrivals'
  prompts submitted at once, ``decode_tokens`` new tokens each; the median gap between
  two tokens of a row after every row has its first token (only ``[B, 1]`` steps, no
  prefill in between); the lowest over engines and repeats. A floor *at that batch size*:
  a schedule that holds fewer rows has shorter steps, and decodes fewer tokens per step.

Why a floor decides whether a goal is reachable: every schedule gives every request at
least its floor, and if ``x_i >= y_i`` for every request, each quantile of the ``x`` is
at least the same quantile of the ``y`` (sorting keeps the order). So an engine's TTFT
p95 is at least the floors' p95: when that is above 0.6 x mlx-lm's TTFT p95 measured in
the same run, no schedule meets issue 17's TTFT goal on these arrivals on this machine::

    floors = measure_floors(run, ["mlx-lm", "workbench"], arrivals, batch_rows=8)
    floors.ttft_s(arrivals)        # [0.071, 0.452, ...]  seconds, one per arrival
    floors.itl_s                   # 0.127                seconds, one [8, 1] step
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from ..observe.metrics import request_metrics
from .engines import Arrival

Run = Callable[[str, Sequence[Arrival]], pd.DataFrame]  # (engine name, arrivals) -> events frame


@dataclass(frozen=True)
class Floors:
    """What :func:`measure_floors` measured.

    Attributes:
        ttft_by_length_s: prompt tokens -> the lowest solo TTFT of a prompt that long
            (seconds).
        itl_s: the lowest median decode step of ``batch_rows`` rows (seconds).
        batch_rows: the batch size ``itl_s`` was measured at (rows).
        runs: solo runs per prompt length behind each floor (engines x repeats).
    """

    ttft_by_length_s: dict[int, float]
    itl_s: float
    batch_rows: int
    runs: int

    def ttft_s(self, arrivals: Sequence[Arrival]) -> list[float]:
        """The TTFT floor of each arrival, in order (seconds).

        Raises:
            KeyError: for an arrival whose prompt length was not measured."""
        return [self.ttft_by_length_s[len(a.prompt)] for a in arrivals]

    def text(self, arrivals: Sequence[Arrival]) -> str:
        """One line: the TTFT floors' p50 / p95 over ``arrivals`` and the ITL floor, in ms."""
        ttft = pd.Series(self.ttft_s(arrivals))
        return (
            f"floors: TTFT p50 {ttft.median() * 1e3:.1f} ms, p95 {ttft.quantile(0.95) * 1e3:.1f} ms "
            f"(each prompt alone, lowest of {self.runs} runs), decode step at B = {self.batch_rows} "
            f"{self.itl_s * 1e3:.1f} ms"
        )


def measure_floors(
    run: Run,
    names: Sequence[str],
    arrivals: Sequence[Arrival],
    batch_rows: int,
    repeats: int = 2,
    decode_tokens: int = 16,
) -> Floors:
    """Measure the TTFT and ITL floors of ``arrivals`` (see the module docstring).

    Args:
        run: ``run(name, arrivals) -> events`` runs a fresh engine ``name`` through
            ``arrivals`` and returns its event-log frame (``submit`` and ``token`` events,
            ``time_s`` in seconds), as :func:`workbench.bench.pacing.frontier_runs` does.
        names: the engines to take the lowest over (at least one).
        arrivals: the benchmark's arrivals; their prompts (token ids) are used, their
            times and ``max_tokens`` are not.
        batch_rows: the run's batch size (rows) for the ITL floor; the arrivals' prompts
            are cycled when there are fewer.
        repeats: runs of each engine (``>= 1``); the floors are the lowest.
        decode_tokens: new tokens per row in the ITL run (``>= 3``).

    Returns:
        A :class:`Floors`. Costs ``repeats x len(names)`` solo runs per distinct prompt
        length and as many ``batch_rows``-row runs.

    Raises:
        ValueError: for no engine, no arrival, ``batch_rows < 1``, ``repeats < 1`` or
            ``decode_tokens < 3``.
    """
    if not names or not arrivals or batch_rows < 1 or repeats < 1 or decode_tokens < 3:
        raise ValueError(
            f"measure_floors needs engines, arrivals, batch_rows >= 1, repeats >= 1 and "
            f"decode_tokens >= 3; got {list(names)}, {len(arrivals)} arrivals, {batch_rows}, "
            f"{repeats}, {decode_tokens}"
        )
    prompts = {len(a.prompt): a.prompt for a in reversed(arrivals)}  # the first prompt of each length
    batch = [Arrival(arrivals[i % len(arrivals)].prompt, decode_tokens) for i in range(batch_rows)]
    ttft_s = {n: float("inf") for n in prompts}
    itl_s = float("inf")
    for _ in range(repeats):
        for name in names:
            for n, prompt in sorted(prompts.items()):
                ttft_s[n] = min(
                    ttft_s[n], float(request_metrics(run(name, [Arrival(prompt, 1)])).ttft_s.iloc[0])
                )
            itl_s = min(itl_s, full_batch_step_s(run(name, batch)))
    return Floors(ttft_s, itl_s, batch_rows, repeats * len(names))


def full_batch_step_s(events: pd.DataFrame) -> float:
    """The median gap between two consecutive tokens of a row, over the gaps that start
    once every submitted request has its first token (seconds; events as
    :func:`workbench.observe.events.events_frame` gives them).

    Raises:
        ValueError: when no row produced two tokens after that moment."""
    tokens = events[events.kind == "token"].sort_values(["uid", "time_s"], kind="stable")
    all_started_s = tokens.groupby("uid").time_s.min().max()
    previous_s = tokens.groupby("uid").time_s.shift()
    gaps = (tokens.time_s - previous_s)[previous_s >= all_started_s]
    if gaps.empty:
        raise ValueError("no decode step after every row had its first token: raise decode_tokens")
    return float(gaps.median())
