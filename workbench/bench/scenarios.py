"""Benchmark scenarios: the workbench Scheduler and mlx-lm's ``BatchGenerator`` in one
process, on the same model, prompts and settings; how each number is defined.

Knows: the scenarios. Uses :mod:`workbench.bench.engines`
(the two engines, one driver), :mod:`workbench.bench.model` (random-weight llamas),
:mod:`workbench.bench.roofline`, :mod:`workbench.observe.metrics` (everything latency-like is computed
from event logs). Must not know: the run's sizes (:mod:`workbench.bench.run`), how results are
printed or drawn (:mod:`workbench.bench.report`, :mod:`workbench.bench.figures`).

Scenarios, each a function returning DataFrames:

- :func:`decode_runs`: ``B`` equal requests (same prompt length, greedy, no stop ids,
  ``decode_tokens`` each) through each engine variant, alternating (ABC, CBA, ABC, ...,
  after one short warm-up run each). *Decode tok/s* of a run = tokens of the iterations
  after the first one that produced tokens / time from that iteration's return to the
  last one's (the prefill and the first token are outside the window; identical for both
  engines because the same driver stamps both).
- :func:`latency_runs`: a staggered-arrival workload (mixed prompt lengths and
  ``max_tokens``, one arrival every few decode steps, by the clock); TTFT = first token −
  submit, ITL = gaps between consecutive tokens of a request (``metrics.token_gaps``).
- :func:`join_cost`: joining one row into ``rows`` rows of ``context_tokens`` tokens (in
  decode, random K/V) by the engine's two paths, into the free slot of an evicted row
  (:func:`workbench.engine.kv.cache_internals.fill_slots`) and by ``extend`` (``caches.join`` = mlx-lm's
  ``extend``, when no slot is free), versus re-merging the whole batch (``extract`` every
  row, ``merge``), each over one decode step.
- :func:`head_of_line`: running rows decode while a long prompt joins (prefilled in
  chunks); :func:`head_of_line_numbers` gives the largest gap between two tokens of a
  running row while the joiner is prefilled and joins, one step and one chunk, from the
  event logs.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
import pandas as pd
from mlx_lm.models.cache import make_prompt_cache

from ..engine.kv import cache_internals as slots
from ..engine.kv import caches as kv
from ..observe.events import events_frame
from ..observe.metrics import request_metrics, token_gaps
from ..workloads.workload import prompt_of_length
from .engines import Arrival, MlxLmEngine, WorkbenchEngine, drive

WORKBENCH, WORKBENCH_OFF, MLX_LM = "workbench", "workbench, instrumentation off", "mlx-lm"
PREFILL_FIRST = "workbench, prefill-first"
PACED = "workbench, paced"
FAST_OFF = "workbench, fast decode off"


LATENCY_PROMPT_TOKENS = (24, 160, 8, 64, 300, 40, 120, 16)
LATENCY_MAX_TOKENS = (16, 48, 24, 32, 40, 20, 56, 28)

EngineFactory = Callable[[], Any]


def engine_factories(
    model: Any,
    tokenizer: Any,
    max_batch: int,
    prefill_step_size: int,
    names: tuple[str, ...] = (WORKBENCH, WORKBENCH_OFF, MLX_LM),
) -> dict[str, EngineFactory]:
    """Fresh-engine factories by name: the workbench as shipped (events and a snapshot
    after every call, ``history_size=64``), with recording off (``history_size=0``;
    events are always logged), prefill-first (``interleave_prefill=False``), paced
    (``pacing=True``: the default per-iteration time budget), without the decode fast
    paths (``fast_decode=False``: mlx-lm's forward as it is), and mlx-lm."""

    def workbench(**kw: Any) -> EngineFactory:
        return lambda: WorkbenchEngine(model, tokenizer, max_batch, prefill_step_size, **kw)

    every = {
        WORKBENCH: workbench(history_size=64),
        WORKBENCH_OFF: workbench(history_size=0),
        PREFILL_FIRST: workbench(history_size=64, interleave_prefill=False),
        PACED: workbench(history_size=64, pacing=True),
        FAST_OFF: workbench(history_size=64, fast_decode=False),
        MLX_LM: lambda: MlxLmEngine(model, max_batch, prefill_step_size),
    }
    return {name: every[name] for name in names}


def alternating(names: list[str], rounds: int) -> list[tuple[int, str]]:
    """``(round, name)`` in run order: forward, then reversed, and so on (A B C, C B A,
    ...), so a slow drift of the machine touches every engine alike.

    >>> alternating(["a", "b"], 3)
    [(0, 'a'), (0, 'b'), (1, 'b'), (1, 'a'), (2, 'a'), (2, 'b')]
    """
    return [(r, n) for r in range(rounds) for n in (names if r % 2 == 0 else names[::-1])]


def run_once(factory: EngineFactory, arrivals: list[Arrival]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One engine, fresh, through ``arrivals``: ``(iterations, events)`` frames. After the
    run (outside the timed iterations) the workbench's recorded snapshots are converted
    to numpy; ``iterations.attrs`` holds ``snapshots`` and ``history_read_s``."""
    engine = factory()
    try:
        iterations = drive(engine, arrivals)
        read = getattr(engine, "read_history", None)
        iterations.attrs["snapshots"], iterations.attrs["history_read_s"] = read() if read else (0, 0.0)
        return iterations, events_frame(engine.events)
    finally:
        engine.close()


def decode_window(iterations: pd.DataFrame) -> dict[str, float]:
    """Decode-only numbers of one run (see the module docstring): ``tok_per_s`` over the
    window, ``window_s``, ``tokens``, and ``step_s`` (median iteration time in it)."""
    made = iterations[iterations.tokens > 0]
    window_s = float(made.time_s.iloc[-1] - made.time_s.iloc[0])
    tokens = int(made.tokens.iloc[1:].sum())
    return {
        "tok_per_s": tokens / window_s,
        "window_s": window_s,
        "tokens": tokens,
        "step_s": float(np.median(np.diff(made.time_s.to_numpy()))),
    }


def equal_prompts(tokenizer: Any, rows: int, prompt_tokens: int) -> list[tuple[int, ...]]:
    """``rows`` distinct prompts of exactly ``prompt_tokens`` tokens from the prompt set."""
    return [tuple(prompt_of_length(tokenizer, prompt_tokens, start=97 * b)) for b in range(rows)]


def tokens_by_uid(events: pd.DataFrame) -> list[tuple[int, ...]]:
    """Each request's generated tokens, in uid order, from an events frame (``token``
    rows): what two engines given the same requests must agree on."""
    tok = events[events.kind == "token"].sort_values(["uid", "time_s"], kind="stable")
    return tok.groupby("uid").token.apply(tuple).tolist()


def decode_runs(
    factories: dict[str, EngineFactory],
    prompts: list[tuple[int, ...]],
    decode_tokens: int,
    pairs: int,
    echo: Callable[[str], None] = print,
) -> pd.DataFrame:
    """Alternating decode runs of every engine on the same prompts (all submitted at once).

    Returns one row per measured run: ``engine``, ``B``, ``pair``, ``tok_per_s``,
    ``window_s``, ``tokens``, ``step_s``, ``snapshots`` and ``history_read_s`` (recorded
    snapshots, seconds to convert them after the run), ``same_tokens`` (its tokens equal the first
    engine's of that pair: a batch-oracle sanity check; NaN for the first engine)."""
    arrivals = [Arrival(p, decode_tokens) for p in prompts]
    for factory in factories.values():  # warm-up: allocator and first-shape costs, discarded
        run_once(factory, [Arrival(p, 4) for p in prompts])
    rows, tokens = [], {}
    for pair, name in alternating(list(factories), pairs):
        iterations, events = run_once(factories[name], arrivals)
        tokens[pair, name] = tokens_by_uid(events)
        rows.append(
            {
                "engine": name,
                "B": len(prompts),
                "pair": pair,
                **decode_window(iterations),
                "snapshots": iterations.attrs["snapshots"],
                "history_read_s": iterations.attrs["history_read_s"],
            }
        )
        echo(
            f"  B={len(prompts):<3} {name:<32} pair {pair}: {rows[-1]['tok_per_s']:8.2f} tok/s "
            f"(step {rows[-1]['step_s'] * 1e3:.1f} ms)"
        )
    return with_same_tokens(rows, tokens, next(iter(factories)))


def with_same_tokens(
    rows: list[dict[str, Any]], tokens: dict[tuple[int, str], Any], first: str
) -> pd.DataFrame:
    """``rows`` (one per measured run, with ``pair`` and ``engine``) as a frame with a
    ``same_tokens`` column: 1.0 where the run's tokens (``tokens[pair, engine]``) equal engine
    ``first``'s in the same pair, 0.0 where they differ, NaN for ``first`` itself."""
    for row in rows:
        same = tokens[row["pair"], row["engine"]] == tokens[row["pair"], first]
        row["same_tokens"] = np.nan if row["engine"] == first else float(same)
    return pd.DataFrame(rows)


def staggered_arrivals(tokenizer: Any, n_requests: int, interval_s: float) -> list[Arrival]:
    """The latency workload: prompt lengths and ``max_tokens`` cycling through
    ``LATENCY_PROMPT_TOKENS`` and ``LATENCY_MAX_TOKENS``, one arrival every ``interval_s``."""
    return [
        Arrival(tuple(prompt_of_length(tokenizer, n, start=53 * i)), m, at_s=i * interval_s)
        for i, n, m in zip(
            range(n_requests), itertools.cycle(LATENCY_PROMPT_TOKENS), itertools.cycle(LATENCY_MAX_TOKENS)
        )
    ]


def latency_runs(
    factories: dict[str, EngineFactory],
    arrivals: list[Arrival],
    rounds: int,
    echo: Callable[[str], None] = print,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each engine through the staggered ``arrivals``, alternating. Returns
    ``(requests, gaps)``: per request ``engine, round, uid, prompt_tokens, ttft_s,
    tpot_s`` and per token gap ``engine, round, uid, gap_s``, from the event logs."""
    requests, gaps = [], []
    for rnd, name in alternating(list(factories), rounds):
        _, events = run_once(factories[name], arrivals)
        r = request_metrics(events)[["uid", "prompt_tokens", "ttft_s", "tpot_s"]]
        g = token_gaps(events)[["uid", "gap_s"]]
        requests.append(r.assign(engine=name, round=rnd))
        gaps.append(g.assign(engine=name, round=rnd))
        echo(
            f"  {name:<32} round {rnd}: TTFT p50 {r.ttft_s.median() * 1e3:.0f} ms, ITL p50 "
            f"{g.gap_s.median() * 1e3:.0f} ms"
        )
    return pd.concat(requests, ignore_index=True), pd.concat(gaps, ignore_index=True)


def _filled_rows(model: Any, rows: int, context_tokens: int, seed: int = 0) -> list[list[Any]]:
    """``rows`` single-sequence caches (``make_prompt_cache``) holding ``context_tokens``
    random keys and values each (speed depends on shapes only)."""
    template = make_prompt_cache(model)
    mx.random.seed(seed)
    states = []
    for layer in model.layers:
        a = layer.self_attn
        B, H, S, D = 1, a.n_kv_heads, context_tokens, model.args.head_dim  # [B, n_kv_heads, S, head_dim]
        states.append((mx.random.normal((B, H, S, D)), mx.random.normal((B, H, S, D))))
    mx.eval(states)
    out = []
    for _ in range(rows):
        solo = [copy.copy(c) for c in template]
        for c, st in zip(solo, states):
            c.state = (*st, context_tokens)  # KVCache state: keys, values, offset
        out.append(solo)
    return out


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - start


def join_cost(model: Any, rows: int, context_tokens: int, repeats: int, warm_steps: int = 3) -> pd.DataFrame:
    """Seconds of one decode step of ``rows`` rows at ``context_tokens``, of joining one
    more row (same context) by ``extend``, of writing it into the free slot of a
    ``rows + 1``-row batch, and of re-merging all ``rows + 1`` rows.

    The running batch is merged, then decoded ``warm_steps`` steps (so its cache has
    decode slack, as in the engine); each join works on shallow copies of the cache
    objects (``extend`` replaces their arrays, it does not write into them); one join of
    each kind runs untimed first (the process's first touch of that much memory is slow,
    on a virtual machine very slow). ``extend, fresh pages`` runs right after
    ``mx.clear_cache()``, so its buffers page-fault as when a batch grows to a size whose
    buffers MLX has not cached; ``extend`` then reuses them. The free-slot
    join writes into its batch in place, as the engine does, every time into the same
    slot. Returns one row per measurement: ``method`` (``step``, ``free slot``,
    ``extend``, ``extend, fresh pages``, ``re-merge``), ``seconds``.
    """
    running = kv.merge_rows(_filled_rows(model, rows, context_tokens))
    joiner = kv.merge_rows(_filled_rows(model, 1, context_tokens, seed=1))
    mx.eval([c.state for c in running + joiner])
    token = mx.zeros((rows, 1), dtype=mx.uint32)
    step = lambda: mx.argmax(model(token, cache=running)[:, -1, :], axis=-1)  # noqa: E731
    out = []
    for i in range(warm_steps + repeats):
        seconds = _timed(step)
        if i >= warm_steps:
            out.append(("step", seconds))

    def extend() -> list[mx.array]:
        mine, theirs = [copy.copy(c) for c in running], [copy.copy(c) for c in joiner]
        return [c.state[:2] for c in kv.join(mine, theirs)]

    def remerge() -> list[mx.array]:
        solo = [[c.extract(b) for c in running] for b in range(rows)] + [[c.extract(0) for c in joiner]]
        return [c.state[:2] for c in kv.merge_rows(solo)]

    spare = kv.merge_rows(_filled_rows(model, rows + 1, context_tokens, seed=2))  # slot `rows` is free
    mx.eval([c.state for c in spare])

    def free_slot() -> list[mx.array]:
        slots.fill_slots(spare, [rows], joiner, [0], [context_tokens])
        return [c.state[:2] for c in spare]

    (
        _timed(extend),
        _timed(remerge),
        _timed(free_slot),
    )  # warm-up: the process's first touch of this much memory
    for _ in range(repeats):
        mx.clear_cache()  # MLX's buffer cache emptied: this extend's buffers page-fault, as for a new batch size
        out.append(("extend, fresh pages", _timed(extend)))
        out += [("free slot", _timed(free_slot)), ("extend", _timed(extend)), ("re-merge", _timed(remerge))]
    return pd.DataFrame(out, columns=["method", "seconds"])


def head_of_line(
    factories: dict[str, EngineFactory],
    tokenizer: Any,
    rows: int,
    prompt_tokens: int,
    chunk_tokens: int,
    warm_steps: int = 4,
    echo: Callable[[str], None] = print,
) -> pd.DataFrame:
    """Running rows decode while one ``prompt_tokens`` prompt joins, per engine (whose
    prefill chunk is ``chunk_tokens``).

    ``rows`` short requests start; after ``warm_steps`` iterations the long one arrives
    (uid ``rows``); the short ones outlast its join. Returns the event rows that matter (``engine``, ``kind``, ``uid``,
    ``time_s``, ``role``: ``running`` or ``joiner``): submit, prefill and token events."""
    n_chunks = -(-prompt_tokens // chunk_tokens)
    arrivals = [Arrival(p, warm_steps + n_chunks + 8) for p in equal_prompts(tokenizer, rows, 16)]
    long_prompt = tuple(prompt_of_length(tokenizer, prompt_tokens, start=11))
    arrivals.append(Arrival(long_prompt, 2, at_iteration=warm_steps))
    frames = []
    for name, factory in factories.items():
        _, events = run_once(factory, arrivals)
        ev = events[events.kind.isin(["submit", "admit", "prefill", "token"])].copy()
        ev["role"] = np.where(ev.uid == rows, "joiner", "running")
        frames.append(ev[["kind", "uid", "time_s", "role"]].assign(engine=name))
        echo(f"  {name:<32} done")
    return pd.concat(frames, ignore_index=True)


def head_of_line_numbers(hol: pd.DataFrame, engine: str) -> dict[str, float]:
    """From one engine's head-of-line events: ``max_gap_s`` (largest gap between two
    tokens of a running row that overlaps the joiner's submit .. first token), ``step_s``
    (median gap of running rows before the joiner arrived), ``chunk_s`` (longest prefill
    chunk of the joiner: its ``prefill`` event minus the event before it; NaN when the
    engine logs no prefill events)."""
    ev = hol[hol.engine == engine].reset_index(drop=True)
    joiner = ev[ev.role == "joiner"]
    start_s = joiner[joiner.kind == "submit"].time_s.min()
    end_s = joiner[joiner.kind == "token"].time_s.min()
    gaps = token_gaps(ev[ev.role == "running"])
    during = gaps[(gaps.from_s < end_s) & (gaps.to_s > start_s)]
    before = gaps[gaps.to_s <= start_s]
    prefill_idx = joiner.index[joiner.kind == "prefill"]
    chunks = [ev.time_s[i] - ev.time_s[i - 1] for i in prefill_idx]
    return {
        "max_gap_s": float(during.gap_s.max()),
        "step_s": float(before.gap_s.median()),
        "chunk_s": float(max(chunks)) if chunks else float("nan"),
    }
