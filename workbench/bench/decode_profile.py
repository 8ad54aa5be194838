"""Where a full-batch decode step's time goes, per engine, and issue 40's decode goals read
from it (``workbench bench --packed``): the packed layout's step at least as fast as the
padded layout's and mlx-lm's at ``B = 1, 8, 32``, and for a missed one its floor and profile.

Knows: a benchmark engine's ``submit`` / ``iterate`` / ``idle`` (:mod:`workbench.bench.engines`),
:func:`workbench.bench.host_time.step_anatomy` (the step's wall time split into MLX's
``mx.async_eval`` / ``mx.eval`` and the Python around them) and
:func:`workbench.bench.step_nodes.step_nodes` (the step's graph nodes). Must not know: any
engine's internals.

- **profile** (:func:`decode_profiles`): per engine, ``repeats`` runs of ``B`` equal prompts
  decoding ``decode_tokens`` tokens, the engines alternating; the medians over the runs of the
  full-batch steps' ``step_ms``, ``python_ms`` (the engine's Python and graph building: the
  step outside MLX's two evaluation calls) and ``mlx_ms`` (inside them: on the CPU MLX runs
  the graph there), and one step's graph nodes by primitive.
- **floor** of a missed goal (:func:`decode_goal_lines`): the packed step's MLX work alone
  (``mlx_ms``: its graph with no Python around it) against the reference's whole step. Where
  it is above, no cut of the packed layout's host work reaches the goal: the graph itself is
  dearer (on the CPU the pages' gathers, which the padded cache reads as a slice; MLX has no
  paged-read kernel for the CPU). mlx-lm reads its tokens with ``tolist``, so its device
  wait counts as Python there (:func:`~workbench.bench.host_time.step_anatomy`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from .engines import Arrival
from .host_time import step_anatomy
from .step_nodes import step_nodes

DECODE_GOAL = 1.0  # issue 40: packed decode tok/s >= 1.0x the padded layout's and mlx-lm's
PROFILE_COLUMNS = (
    "engine",
    "B",
    "runs",
    "step_ms",
    "python_ms",
    "mlx_ms",
    "nodes",
    "top_nodes",
    "node_kinds",
)


def decode_profiles(
    factories: Mapping[str, Callable[[], Any]],
    prompts: Sequence[Sequence[int]],
    decode_tokens: int,
    repeats: int = 3,
) -> pd.DataFrame:
    """Profile each engine's full-batch decode step (see the module docstring).

    Args:
        factories: engine name -> a function making a fresh engine with room for every prompt.
        prompts: ``[B]`` prompts (token ids), submitted at once.
        decode_tokens: tokens each request decodes (``>= 4``, so full-batch steps follow one
            another).
        repeats: runs per engine (``>= 1``), the engines alternating.

    Returns:
        one row per engine: :data:`PROFILE_COLUMNS` (milliseconds; ``nodes`` the graph nodes of
        one step, ``top_nodes`` ``"Primitive:count"`` of its five most frequent kinds,
        ``node_kinds`` the same for every kind).

    Raises:
        ValueError: no factories or prompts, ``decode_tokens < 4`` or ``repeats < 1``.

    No mlx-lm counterpart (mlx-lm's ``BatchGenerator`` is one of the engines profiled).
    """
    if not factories or not prompts or decode_tokens < 4 or repeats < 1:
        raise ValueError(
            f"decode_profiles needs engines and prompts, decode_tokens >= 4 and repeats >= 1, got "
            f"{len(factories)} engines, {len(prompts)} prompts, decode_tokens={decode_tokens}, repeats={repeats}"
        )
    arrivals = [Arrival(tuple(p), decode_tokens) for p in prompts]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in factories}
    for _ in range(repeats):
        for name, make in factories.items():
            split = _on_fresh(make, lambda engine: step_anatomy(engine, arrivals))
            if split.get("steps"):
                runs[name].append(split)
    rows = []
    for name, make in factories.items():
        nodes = _on_fresh(make, lambda engine: step_nodes(engine, arrivals))
        med = _medians(runs[name])
        rows.append(
            {
                "engine": name,
                "B": len(prompts),
                "runs": len(runs[name]),
                "step_ms": med("step_ms"),
                "python_ms": med("python_ms"),
                "mlx_ms": med("launch_ms") + med("wait_ms"),
                "nodes": sum(nodes.values()),
                "top_nodes": " ".join(f"{k}:{v}" for k, v in nodes.most_common(5)),
                "node_kinds": " ".join(f"{k}:{v}" for k, v in nodes.most_common()),
            }
        )
    return pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))


def _on_fresh(make: Callable[[], Any], measure: Callable[[Any], Any]) -> Any:
    """``measure`` of a fresh engine from ``make``, the engine closed after (also on an error)."""
    engine = make()
    try:
        return measure(engine)
    finally:
        engine.close()


def _medians(runs: Sequence[Mapping[str, float]]) -> Callable[[str], float]:
    """``key -> median of runs[i][key]`` (NaN where no run counted a step)."""
    return lambda key: statistics.median(r[key] for r in runs) if runs else float("nan")


def decode_goal_lines(
    decode: pd.DataFrame, profile: pd.DataFrame, packed: str, references: Mapping[str, tuple[str, str]]
) -> list[str]:
    """Issue 40's decode goals, one line per ``B`` and reference: met or missed with the ratio,
    and for a missed one the floor and where the step's time went at that ``B``.

    Args:
        decode: per ``B`` the packed layout's decode tok/s over each reference's (medians of
            per-pair ratios), in the columns ``references`` names.
        profile: :func:`decode_profiles` rows (any ``B``; a ``B`` without rows gets no profile).
        packed: the packed engine's name in ``profile``.
        references: reference engine name -> (its ratio column in ``decode``, its name in the
            lines, e.g. ``"the padded layout"``).

    Returns:
        lines (Markdown list items). Raises nothing. No mlx-lm counterpart."""
    out = []
    for _, row in decode.iterrows():
        B = int(row.B)
        here = profile[profile.B == B].set_index("engine") if len(profile) else profile
        for ref, (column, label) in references.items():
            ratio = float(row[column])
            line = f"- decode B={B}: packed {ratio:.2f}x {label}'s tok/s (goal >= {DECODE_GOAL:g}): "
            if ratio >= DECODE_GOAL:
                out.append(line + "met")
                continue
            out.append(line + "missed" + _floor_and_profile(here, packed, ref, label))
    return out


def _floor_and_profile(here: pd.DataFrame, packed: str, ref: str, label: str) -> str:
    if packed not in here.index or ref not in here.index:
        return "; no profile at this B"
    p, r = here.loc[packed], here.loc[ref]
    reach = (
        "out of reach of any cut of the packed layout's host work (its graph alone is dearer)"
        if p.mlx_ms >= r.step_ms
        else "not ruled out (cutting the packed layout's Python would reach it)"
    )
    return (
        f"; floor: the packed step's MLX work alone {p.mlx_ms:.2f} ms against {label}'s whole step "
        f"{r.step_ms:.2f} ms: {reach}; where the time goes (median full-batch step, ms): packed "
        f"{p.step_ms:.2f} = Python {p.python_ms:.2f} + MLX {p.mlx_ms:.2f}, {p.nodes:.0f} graph nodes "
        f"({p.top_nodes}); {label} {r.step_ms:.2f} = Python {r.python_ms:.2f} + MLX {r.mlx_ms:.2f}, "
        f"{r.nodes:.0f} nodes ({r.top_nodes})" + _kinds_apart(p, r, label)
    )


def _kinds(text: Any) -> dict[str, int]:
    """``"Kind:count ..."`` as a dict (empty for a missing or NaN cell)."""
    if not isinstance(text, str):
        return {}
    return {k: int(v) for k, v in (item.rsplit(":", 1) for item in text.split())}


def _kinds_apart(p: pd.Series, r: pd.Series, label: str) -> str:
    """``"; node kinds the packed step has beyond <label>'s: Gather +8, ..."`` (most apart first;
    empty where the profile has no ``node_kinds``)."""
    mine, theirs = _kinds(p.get("node_kinds")), _kinds(r.get("node_kinds"))
    apart = {k: mine.get(k, 0) - theirs.get(k, 0) for k in mine.keys() | theirs.keys()}
    apart = {k: d for k, d in apart.items() if d}
    if not (mine and theirs) or not apart:
        return ""
    items = sorted(apart.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
    return f"; node kinds the packed step has beyond {label}'s: " + ", ".join(f"{k} {d:+d}" for k, d in items)
