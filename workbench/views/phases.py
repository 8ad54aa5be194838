"""What a step costs, drawn: the row timeline with each step split into its prefill phase
and its decode phase, on a step axis where a phase is as wide as the tokens it fed and on a
wall-clock axis where it is as wide as the seconds it took; a decoding row that waits
through another request's prefill is drawn **stalled**, not as solid decode.

Knows: the event log frame (:func:`workbench.observe.events.events_frame`: kinds, ``step``,
``time_s``, ``n_tokens``, ``join_mode``). Must not know: the engine. Pure functions of the
events given.

Phases of decode step ``s`` (events logged with step index ``s``: ``admit()`` before step
``s``'s forward, then its tokens)::

    prefill phase   the prompt tokens fed before step s's tokens: its prefill chunks' real
                    tokens (``prefill`` events) + one per join forward (each joiner's last
                    prompt token; the packed layout's join has none of its own)
    decode phase    the decode forward: one token per row that got a token (``token`` events)

Wall time of step ``s``: it starts where step ``s - 1``'s last token landed (the log's first
step: at its first event) and ends at its own last token; its prefill phase ends at its last
``prefill`` / ``join`` event, its decode phase is the rest. On a hand-driven engine the pause
between two calls lands in the next phase.

A row's kind in a phase (``KINDS``): ``prefill`` in a prefill phase it takes part in, and
in the decode phases between its admission and its join (waiting mid-prefill); ``decode`` in
a decode phase where it got a token; ``stalled`` in a prefill phase of other requests while
it is decoding (in the batch, unfinished: its next token waits for their prefill);
``queued`` from submit (or a preemption) to admission; ``finished, not filtered`` from its
finish to its eviction. The text form (:func:`stalls_text`, deterministic)::

    step 0 prefill: 1 token of uid 0
    steps 0-2 decode: 3 tokens
    step 3 prefill: 200 tokens of uid 1, stalling uid 0
    step 3 decode: 2 tokens
    prefill: 201 tokens in 2 phases; decode: 5 tokens in 4 steps; stalled: 1 row-phase
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from . import style

KINDS = ("queued", "prefill", "decode", "stalled", "finished, not filtered")
COLOURS = {
    "queued": style.QUEUED,
    "prefill": style.PREFILL,
    "decode": style.ATTENDED,
    "stalled": style.LATER,  # white, hatched in the decode blue: in the batch, waiting
    "finished, not filtered": style.WAITING,
}
STALL_HATCH = "////"
PHASE_COLUMNS = [
    "step",
    "phase",
    "prefill_tokens",
    "decode_tokens",
    "step_left",
    "step_width",
    "time_left",
    "time_width",
]
SEGMENT_COLUMNS = ["uid", "y", "step", "phase", "kind", "step_left", "step_width", "time_left", "time_width"]
AXES = {
    "step": "decode steps in order, each phase as wide as the tokens it fed",
    "time": "time since the first submit (s)",
}
PREFILL_KINDS = ("prefill", "join")


def step_phases(events: pd.DataFrame) -> pd.DataFrame:
    """One row per phase of every decode step with a token, a prefill chunk or a join, in
    order (module docstring), with ``PHASE_COLUMNS``: ``phase`` (``prefill`` or ``decode``),
    the tokens it fed (``prefill_tokens`` or ``decode_tokens``, the other 0), and on the step
    axis (``step_left``, ``step_width`` = its tokens, phases laid end to end) and the wall
    axis (``time_left``: seconds since the first submit, ``time_width``: its seconds).

    >>> ev = pd.DataFrame({"kind": ["submit", "admit", "join", "token"], "uid": 0, "step": 0,
    ...     "time_s": [0.0, 0.0, 0.25, 0.5], "n_tokens": [1, 1, 1, 0], "join_mode": ""})
    >>> step_phases(ev)[["phase", "step_width", "time_width"]].values.tolist()
    [['prefill', 1, 0.25], ['decode', 1, 0.25]]
    """
    if events.empty:
        return pd.DataFrame(columns=PHASE_COLUMNS)
    t0 = events[events.kind == "submit"].time_s.min() if (events.kind == "submit").any() else 0.0
    # one pass over the events (a boolean mask per step costs the frame's length, every step)
    decoded, decode_end, prefilled, prefill_end = {}, {}, {}, {}
    for kind, s, t, n, mode in zip(
        events.kind, events.step, events.time_s, events.n_tokens, events.join_mode
    ):
        if kind == "token":
            decoded[s] = decoded.get(s, 0) + 1
            decode_end[s] = t if s not in decode_end else max(decode_end[s], t)
        elif kind in PREFILL_KINDS:  # a prefill chunk's tokens; a join feeds the prompt's last one
            fed = (0 if pd.isna(n) else int(n)) if kind == "prefill" else int(mode != "packed")
            prefilled[s] = prefilled.get(s, 0) + fed
            prefill_end[s] = t if s not in prefill_end else max(prefill_end[s], t)
    rows, step_at, prev_end = [], 0, None
    for s in sorted(set(decoded) | set(prefilled)):
        start = prev_end if prev_end is not None else events[events.step == s].time_s.min()
        mid = prefill_end.get(s, start)
        end = decode_end.get(s, mid)
        if s in prefilled:
            rows.append((s, "prefill", prefilled[s], 0, step_at, prefilled[s], start - t0, mid - start))
            step_at += prefilled[s]
        if s in decoded:
            rows.append((s, "decode", 0, decoded[s], step_at, decoded[s], mid - t0, end - mid))
            step_at += decoded[s]
        prev_end = end
    out = pd.DataFrame(rows, columns=PHASE_COLUMNS)
    return out.astype(
        {"step": int, "prefill_tokens": int, "decode_tokens": int, "step_left": int, "step_width": int}
    )


def _apply(status: dict[int, str], kind: str, uid) -> None:
    """Advance ``status`` (uid -> kind while it is in the engine) by one event."""
    after = {
        "submit": "queued",
        "preempt": "queued",
        "admit": "prefill",
        "join": "decode",
        "token": "decode",
        "finish": "finished, not filtered",
    }
    if kind == "evict":
        status.pop(uid, None)
    elif kind in after:
        status[uid] = after[kind]


def row_segments(events: pd.DataFrame) -> pd.DataFrame:
    """Per uid (``y`` = its submit order) and phase of :func:`step_phases`, the kind of that
    row in that phase (``KINDS``, module docstring), with the phase's position on both axes:
    ``SEGMENT_COLUMNS``. A row's ``prefill`` segment in a prefill phase is as wide as the
    phase's prompt tokens (``step_width``) and its wall seconds (``time_width``); a phase
    where a request is not in the engine (not yet submitted, evicted) has no segment.
    """
    phases = step_phases(events)
    if phases.empty:
        return pd.DataFrame(columns=SEGMENT_COLUMNS)
    order = {u: y for y, u in enumerate(events[events.kind == "submit"].uid.drop_duplicates())}
    by_step: dict = {}  # step -> its phases' (phase, position), in order
    for ph in phases.itertuples():
        by_step.setdefault(ph.step, []).append((ph.phase, _position(ph)))
    at_step: dict = {}  # step -> its events' (kind, uid), in the log's order
    for kind, uid, s in zip(events.kind, events.uid, events.step):
        if not pd.isna(s):
            at_step.setdefault(s, []).append((kind, uid))
    status: dict[int, str] = {}
    rows = []
    for s in sorted(at_step):
        here = at_step[s]
        for kind, uid in here:  # evictions, submits, admits, prefills, joins
            if kind not in LATE_KINDS:
                _apply(status, kind, uid)
        taking = {uid for kind, uid in here if kind in PREFILL_KINDS}
        got = {uid for kind, uid in here if kind == "token"}
        for phase, position in by_step.get(s, ()):
            if phase == "prefill":
                kinds = {u: "prefill" if u in taking else STALLED.get(k, k) for u, k in status.items()}
            else:
                kinds = {u: "decode" if u in got else k for u, k in status.items()}
            rows += [(u, order.get(u, len(order)), s, phase, k, *position) for u, k in kinds.items()]
        for kind, uid in here:  # tokens, finishes
            if kind in LATE_KINDS:
                _apply(status, kind, uid)
    out = pd.DataFrame(rows, columns=SEGMENT_COLUMNS)
    return out.sort_values(["y", "step_left"], kind="stable").reset_index(drop=True)


LATE_KINDS = ("token", "finish", "draft")  # logged by step(), after the step's prefill phase
STALLED = {"decode": "stalled"}  # a decoding row's kind in another request's prefill phase


def _position(ph) -> tuple:
    return ph.step_left, ph.step_width, ph.time_left, ph.time_width


def phase_totals(events: pd.DataFrame) -> dict[str, float]:
    """What a run's steps fed and took: ``decode_steps`` (steps with a token),
    ``decode_tokens``, ``prefill_phases``, ``prefill_tokens``, ``stalled`` (row-phases a
    decoding row spent waiting in another request's prefill), ``stalled_s`` (their wall
    seconds, summed over rows), ``decode_s`` and ``prefill_s`` (wall seconds of the decode
    and prefill phases; sum ``wall_s``)."""
    return _totals(step_phases(events), row_segments(events))


def _totals(ph: pd.DataFrame, seg: pd.DataFrame) -> dict[str, float]:
    """:func:`phase_totals` from a run's :func:`step_phases` and :func:`row_segments`."""
    dec, pre = ph[ph.phase == "decode"], ph[ph.phase == "prefill"]
    stalled = seg[seg.kind == "stalled"] if len(seg) else seg
    return {
        "decode_steps": len(dec),
        "decode_tokens": int(dec.decode_tokens.sum()),
        "prefill_phases": len(pre),
        "prefill_tokens": int(pre.prefill_tokens.sum()),
        "stalled": len(stalled),
        "stalled_s": float(stalled.time_width.sum()) if len(stalled) else 0.0,
        "decode_s": float(dec.time_width.sum()),
        "prefill_s": float(pre.time_width.sum()),
        "wall_s": float(ph.time_width.sum()),
    }


def _tokens(n: int) -> str:
    return f"{n} token" + ("" if n == 1 else "s")


def _uids(uids) -> str:
    return "uid " + ", ".join(str(int(u)) for u in sorted(uids))


def stalls_text(events: pd.DataFrame) -> str:
    """The steps as text (deterministic: tokens, no times): runs of decode-only steps as one
    line, each step with a prefill phase on its own line with its prompt tokens, the uids
    that prefilled and the decoding uids it stalled; then the totals (:func:`phase_totals`'
    token counts)."""
    ph, seg = step_phases(events), row_segments(events)
    if ph.empty:
        return "(no steps)"
    lines, run = [], []

    def flush():
        if run:
            span = f"step {run[0][0]}" if len(run) == 1 else f"steps {run[0][0]}-{run[-1][0]}"
            lines.append(f"{span} decode: {_tokens(sum(n for _, n in run))}")
            run.clear()

    for s, g in ph.groupby("step", sort=True):
        pre = g[g.phase == "prefill"]
        if pre.empty:
            run.append((s, int(g.decode_tokens.sum())))
            continue
        flush()
        here = seg[(seg.step == s) & (seg.phase == "prefill")]
        stalled = here[here.kind == "stalled"].uid
        took = _uids(here[here.kind == "prefill"].uid)
        line = f"step {s} prefill: {_tokens(int(pre.prefill_tokens.sum()))} of {took}"
        lines.append(line + (f", stalling {_uids(stalled)}" if len(stalled) else ""))
        if (g.phase == "decode").any():
            run.append((s, int(g.decode_tokens.sum())))
    flush()
    t = _totals(ph, seg)
    lines.append(
        f"prefill: {_tokens(t['prefill_tokens'])} in {t['prefill_phases']} phases; "
        f"decode: {_tokens(t['decode_tokens'])} in {t['decode_steps']} steps; "
        f"stalled: {t['stalled']} row-phase{'s' if t['stalled'] != 1 else ''}"
    )
    return "\n".join(lines)


def merged_bars(seg: pd.DataFrame, x: str) -> pd.DataFrame:
    """One bar per run of a row's touching segments of one kind on axis ``x`` (``step`` or
    ``time``): columns ``y``, ``kind``, ``left``, ``width``, in ``seg``'s order. A row that
    decodes through a hundred steps is one bar, not a hundred, so a long session draws in
    the time of a short one (the panel redraws its timeline on every slider move).

    >>> seg = pd.DataFrame({"y": [0, 0, 0], "kind": ["decode", "decode", "stalled"],
    ...     "step_left": [0, 1, 2], "step_width": [1, 1, 5]})
    >>> merged_bars(seg, "step").values.tolist()
    [[0, 'decode', 0, 2], [0, 'stalled', 2, 5]]
    """
    left, width = seg[f"{x}_left"].to_numpy(), seg[f"{x}_width"].to_numpy()
    y, kind = seg.y.to_numpy(), seg.kind.to_numpy()
    touching = np.isclose(left[1:], (left + width)[:-1], rtol=0, atol=1e-12)
    starts = np.r_[True, (y[1:] != y[:-1]) | (kind[1:] != kind[:-1]) | ~touching]
    run = np.cumsum(starts) - 1
    ends = pd.Series(left + width).groupby(run).max().to_numpy()
    first = np.flatnonzero(starts)
    return pd.DataFrame(
        {"y": y[first], "kind": kind[first], "left": left[first], "width": ends - left[first]}
    )


def _draw(ax, seg: pd.DataFrame, x: str, labels: dict[int, int]) -> set[str]:
    """The segments on ``ax`` over ``x`` (``step`` or ``time``), a row's touching segments
    of one kind as one bar (:func:`merged_bars`), one ``barh`` call per kind; returns the
    kinds drawn."""
    bars = merged_bars(seg, x)
    for kind, b in bars[bars.width > 0].groupby("kind", sort=False):
        stalled = kind == "stalled"
        ax.barh(
            b.y.to_numpy(),
            b.width.to_numpy(),
            left=b.left.to_numpy(),
            color=COLOURS[kind],
            edgecolor=style.ATTENDED if stalled else "none",
            hatch=STALL_HATCH if stalled else None,
            linewidth=0,
        )
    ax.set_yticks(list(labels.values()), [f"uid {u}" for u in labels])
    if not ax.yaxis_inverted():
        ax.invert_yaxis()
    ax.set_xlabel(AXES[x], fontsize="small")
    ax.set_xlim(0, max(float((seg[f"{x}_left"] + seg[f"{x}_width"]).max()), 1e-9))
    return set(seg.kind[seg[f"{x}_width"] > 0])


def step_ticks(phases: pd.DataFrame, min_share: float = 0.07) -> pd.Series:
    """Decode step number -> its start on the step axis, for ticks: the first step, then
    each step at least ``min_share`` of the axis right of the last tick (steps of few tokens
    crowd together, so evenly numbered ticks would overlap)."""
    starts = phases.groupby("step").step_left.min()
    extent = float((phases.step_left + phases.step_width).max()) if len(phases) else 0.0
    keep, last = [], None
    for s, left in starts.items():
        if last is None or left - last >= min_share * extent:
            keep.append(s)
            last = left
    return starts[keep]


def _step_ticks(ax, events: pd.DataFrame) -> None:
    """Decode step numbers on the top edge of a step-axis panel, at each step's start."""
    shown = step_ticks(step_phases(events))
    top = ax.secondary_xaxis("top")
    top.set_xticks(shown.to_numpy(), [str(s) for s in shown.index], fontsize="small")
    top.set_xlabel("decode step", fontsize="small")


def render_phases(
    runs: dict[str, pd.DataFrame] | pd.DataFrame,
    axes: tuple[str, ...] = ("step", "time"),
    title: str | None = None,
    width_in: float = 9.4,
) -> Figure:
    """Row timelines with each step's prefill and decode phases (module docstring), one
    panel per (run, axis): ``runs`` one run's events or ``{title: events}``, ``axes`` any of
    ``step`` (a phase as wide as the tokens it fed; decode step numbers on top) and
    ``time`` (as wide as its wall seconds). Stalled rows are hatched. Panels share the y
    axis (uids); a figure of one axis over several runs shares x too.

    Raises:
        ValueError: an axis other than ``step`` / ``time``, or no runs.
    """
    bad = [a for a in axes if a not in AXES]
    if bad or not axes:
        raise ValueError(f"axes must be a non-empty tuple of {sorted(AXES)}, got {axes!r}")
    runs = {"": runs} if isinstance(runs, pd.DataFrame) else runs
    if not runs:
        raise ValueError("render_phases needs at least one run (title -> events)")
    panels = [(name, ev, x) for name, ev in runs.items() for x in axes]
    n_rows = max(max(1, ev[ev.kind == "submit"].uid.nunique()) for ev in runs.values())
    fig = Figure(figsize=(width_in, 0.3 * max(4, n_rows) + 1.9), layout="constrained")
    share_x = len(axes) == 1
    grid = fig.subplots(1, len(panels), sharey=True, sharex=share_x, squeeze=False)[0]
    shown: set[str] = set()
    extents = [1e-9]  # each panel's right end: a shared x axis keeps only the last set_xlim
    for ax, (name, ev, x) in zip(grid, panels):
        seg = row_segments(ev)
        if seg.empty:
            style.empty(ax, "no steps yet")
            continue
        extents.append(float((seg[f"{x}_left"] + seg[f"{x}_width"]).max()))
        labels = {u: y for u, y in seg.groupby("uid").y.first().sort_values().items()}
        shown |= _draw(ax, seg, x, labels)
        if x == "step":
            _step_ticks(ax, ev)
        heading = {"step": "step axis: width = tokens", "time": "wall axis: width = seconds"}[x]
        ax.set_title(f"{name}: {heading}" if name else heading, fontsize="medium", loc="left")
    if share_x:  # one scale for every run: the longest run's extent
        grid[0].set_xlim(0, max(extents))
    if title:
        fig.suptitle(title)
    fig.legend(
        handles=[
            Patch(
                facecolor=COLOURS[k],
                edgecolor=style.ATTENDED if k == "stalled" else style.EDGE,
                hatch=STALL_HATCH if k == "stalled" else None,
                label=k,
            )
            for k in KINDS
            if k in shown
        ],
        loc="outside lower center",
        ncol=len(shown) or 1,
        fontsize="small",
        frameon=False,
    )
    return fig
