"""What the batch-invariant mode costs against the default path, in one run, alternating
(issue 39; ``workbench invariance --cost``; ``docs/batch-invariance.md``).

Knows: :class:`workbench.Scheduler` (``batch_invariant=``), the bench's random llama shapes
(:mod:`workbench.bench.model`). Must not know: the mode's internals.

Two measurements, each pairing the two engines so that a shared machine's load falls on
both alike:

- **decode step** at each ``B``: a default and an invariant scheduler hold the same ``B``
  prompts (64-68 tokens), both prefilled; then ``pairs`` rounds of one default step and one
  invariant step (the order swapped every round), each ended by ``mx.synchronize()``; the
  median of the per-round ratios.
- **prefill**: the time from submit to every row's first token for ``P`` prompts of
  160-512 tokens, one engine after the other, ``rounds`` times (the order swapped every
  round); the median ratio.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class StepCost:
    """One ``B``'s decode step, the mode against the default path.

    Attributes:
        B: rows. default_ms, invariant_ms: median milliseconds per step.
        ratio: median of the per-pair ``invariant / default`` ratios.
        quartiles: the pair ratios' quartiles. pairs: pairs timed.
        load: the 1-minute load average after the pairs.
        cpu_ratio: the mode's process CPU seconds (all threads) over the default path's,
            summed over the pairs: the work, less moved by other processes than the wall.
    """

    B: int
    default_ms: float
    invariant_ms: float
    ratio: float
    quartiles: tuple[float, ...] = ()
    pairs: int = 0
    load: float = 0.0
    cpu_ratio: float = 1.0


@dataclass(frozen=True)
class PrefillCost:
    """Submit to first token of ``len(lengths)`` prompts, the mode against the default path.

    Attributes:
        lengths: the prompts' tokens. default_s, invariant_s: median seconds.
        ratio: median of the per-round ratios. rounds: the per-round ratios.
        load: the 1-minute load average after the rounds.
        cpu_ratio: the mode's process CPU seconds over the default path's, summed over rounds.
    """

    lengths: tuple[int, ...]
    default_s: float
    invariant_s: float
    ratio: float
    rounds: tuple[float, ...]
    load: float
    cpu_ratio: float


@dataclass(frozen=True)
class CostReport:
    """:func:`measure`'s result: ``steps`` per ``B`` and ``prefill`` (``None``: not timed)."""

    steps: tuple[StepCost, ...]
    prefill: PrefillCost | None

    def text(self) -> str:
        """Two lines per ``B`` (the steps, then how the rounds spread) and two for the prefill."""
        lines = []
        for s in self.steps:
            q = s.quartiles or (s.ratio,)
            lines += [
                f"B = {s.B:3d}: decode step {s.invariant_ms:.2f} ms in the mode, {s.default_ms:.2f} ms by "
                f"default: {s.ratio:.2f}x",
                f"        (median of {s.pairs} alternating rounds, middle half {q[0]:.2f}..{q[-1]:.2f}; "
                f"CPU time {s.cpu_ratio:.2f}x; 1-min load average {s.load:.1f})",
            ]
        if self.prefill is not None:
            p = self.prefill
            lines += [
                f"prefill of {len(p.lengths)} prompts of {min(p.lengths)}-{max(p.lengths)} tokens: "
                f"{p.invariant_s:.2f} s in the mode, {p.default_s:.2f} s by default: {p.ratio:.2f}x",
                f"        (rounds {', '.join(f'{r:.2f}' for r in p.rounds)}; CPU time {p.cpu_ratio:.2f}x; "
                f"1-min load average {p.load:.1f})",
            ]
        return "\n".join(lines)

    def records(self) -> list[dict]:
        """The report as JSON-ready dicts, one per line of :meth:`text`."""
        return [asdict(s) for s in self.steps] + ([asdict(self.prefill)] if self.prefill else [])


def _scheduler(model: Any, tok: Any, B: int, invariant: bool) -> Any:
    import workbench as wb

    return wb.Scheduler(model, tok, max_batch=B, prefill_step_size=2048, batch_invariant=invariant)


def _prefilled(sched: Any, prompts: Sequence[Sequence[int]], max_tokens: int) -> None:
    """Submit ``prompts`` and run until every row has its first token."""
    import mlx.core as mx

    import workbench as wb

    for p in prompts:
        sched.submit(wb.Request(prompt=list(p), max_tokens=max_tokens, stop_ids=[]))
    while sched.queue or sched.state.prefilling is not None:
        sched.admit()
    sched.step()
    mx.synchronize()


def rotated_steps(
    scheds: dict[str, Any], pairs: int, before: Callable[[str], None] | None = None
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """``pairs`` rounds of one decode step of each prefilled scheduler in ``scheds``, the
    order rotated by one every round (two schedulers: swapped), each step ended by
    ``mx.synchronize()``, so that a shared machine's load falls on every engine alike.

    Args:
        before: called with an engine's name before its step, untimed (a lab script's
            switch of the code that engine runs); ``None``: nothing.

    Returns:
        per name, the milliseconds of each of its steps; and its process CPU seconds (all
        threads) summed over them.
    """
    import mlx.core as mx

    names = list(scheds)
    ms: dict[str, list[float]] = {name: [] for name in names}
    cpu = dict.fromkeys(names, 0.0)
    for i in range(pairs):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            if before is not None:
                before(name)
            t0, c0 = time.perf_counter(), time.process_time()
            scheds[name].step()
            mx.synchronize()
            ms[name].append((time.perf_counter() - t0) * 1e3)
            cpu[name] += time.process_time() - c0
    return ms, cpu


def summary(ms: dict[str, list[float]], cpu: dict[str, float], base: str = "default") -> dict[str, Any]:
    """:func:`rotated_steps`' result as JSON-ready numbers: per engine ``<name>_ms`` (the
    median step), and for each engine but ``base`` ``<name>_ratio`` (the median of its
    per-round ratios to ``base``'s step), ``<name>_quartiles`` (the ratio itself where one
    round ran, as :class:`StepCost`) and ``<name>_cpu_ratio``."""
    out: dict[str, Any] = {}
    for name, times in ms.items():
        out[f"{name}_ms"] = round(statistics.median(times), 2)
        if name != base:
            ratios = [a / b for a, b in zip(times, ms[base])]
            out[f"{name}_ratio"] = round(statistics.median(ratios), 3)
            quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios  # one round: itself
            out[f"{name}_quartiles"] = [round(q, 3) for q in quartiles]
            out[f"{name}_cpu_ratio"] = round(cpu[name] / max(cpu[base], 1e-9), 3)
    return out


def step_cost(model: Any, tok: Any, prompts: Sequence[Sequence[int]], pairs: int) -> StepCost:
    """The decode step at ``B = len(prompts)``: ``pairs`` alternating default / invariant
    steps after both engines prefilled ``prompts`` (see the module docstring)."""
    B = len(prompts)
    scheds = {"default": _scheduler(model, tok, B, False), "invariant": _scheduler(model, tok, B, True)}
    for sched in scheds.values():
        _prefilled(sched, prompts, pairs + 3)
    ms, cpu = rotated_steps(scheds, pairs)
    return _step_cost(B, ms["default"], ms["invariant"], cpu["default"], cpu["invariant"])


def _step_cost(B: int, default_ms: list[float], ms: list[float], default_cpu: float, cpu: float) -> StepCost:
    """A :class:`StepCost` from per-round milliseconds and CPU seconds of the two engines."""
    ratios = [a / b for a, b in zip(ms, default_ms)]
    return StepCost(
        B,
        statistics.median(default_ms),
        statistics.median(ms),
        statistics.median(ratios),
        tuple(statistics.quantiles(ratios, n=4)) if len(ratios) > 1 else tuple(ratios),
        len(ratios),
        os.getloadavg()[0],
        cpu / max(default_cpu, 1e-9),
    )


def prefill_cost(model: Any, tok: Any, prompts: Sequence[Sequence[int]], rounds: int) -> PrefillCost:
    """Submit to first token of ``prompts``, the engines one after the other, ``rounds``
    times (the order swapped every round)."""
    import mlx.core as mx

    s: dict[str, list[float]] = {"default": [], "invariant": []}
    cpu = {"default": 0.0, "invariant": 0.0}
    for r in range(rounds):
        for name in ("default", "invariant") if r % 2 == 0 else ("invariant", "default"):
            sched = _scheduler(model, tok, len(prompts), name == "invariant")  # built (calibrated) untimed
            mx.synchronize()
            t0, c0 = time.perf_counter(), time.process_time()
            _prefilled(sched, prompts, 2)
            s[name].append(time.perf_counter() - t0)
            cpu[name] += time.process_time() - c0
    ratios = [a / b for a, b in zip(s["invariant"], s["default"])]
    return PrefillCost(
        tuple(len(p) for p in prompts),
        statistics.median(s["default"]),
        statistics.median(s["invariant"]),
        statistics.median(ratios),
        tuple(ratios),
        os.getloadavg()[0],
        cpu["invariant"] / max(cpu["default"], 1e-9),
    )


def prompts_of(vocab: int, count: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    """``count`` token-id prompts of ``lo``-``hi`` tokens (spread by a fixed stride), ids in
    ``1 .. vocab - 1``."""
    return [
        [(7 * b + 13 * i + seed) % (vocab - 1) + 1 for i in range(lo + (97 * b) % (hi - lo + 1))]
        for b in range(count)
    ]


def measure(
    model: Any,
    tok: Any,
    batch_sizes: Sequence[int] = (1, 8, 32),
    pairs: int = 24,
    prefill_batch: int = 4,
    prefill_range: tuple[int, int] = (160, 512),
    rounds: int = 3,
    progress: Any = None,
) -> CostReport:
    """The mode's decode step at each of ``batch_sizes`` (:func:`step_cost`, prompts of
    64-68 tokens) and the prefill of ``prefill_batch`` prompts of ``prefill_range`` tokens
    (:func:`prefill_cost`; ``0``: not timed), against the default path in the same run.

    Args:
        model, tok: an mlx-lm model and its tokenizer (anything with ``eos_token_ids``).
        progress: called with each line's text as it is measured (``None``: quiet).

    Raises:
        ValueError: a batch size, ``pairs``, ``rounds`` below 1, or a bad prefill range.
    """
    if min(batch_sizes, default=1) < 1 or pairs < 1 or rounds < 1 or prefill_batch < 0:
        raise ValueError("batch_sizes, pairs and rounds must be >= 1, prefill_batch >= 0")
    lo, hi = prefill_range
    if not 1 <= lo <= hi:
        raise ValueError(f"prefill_range must be 1 <= LO <= HI tokens, got {prefill_range}")
    vocab = model.args.vocab_size if hasattr(model, "args") else 4096
    steps = []
    for B in batch_sizes:
        steps.append(step_cost(model, tok, prompts_of(vocab, B, 64, 68), pairs))
        if progress:
            progress(CostReport((steps[-1],), None).text())
    prefill = None
    if prefill_batch:
        prefill = prefill_cost(model, tok, prompts_of(vocab, prefill_batch, lo, hi, seed=5), rounds)
        if progress:
            progress(CostReport((), prefill).text())
    return CostReport(tuple(steps), prefill)
