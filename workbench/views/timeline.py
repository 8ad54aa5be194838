"""Row timeline (Gantt): per uid, queued, prefilling, decoding and finished spans, from a
report's events frame (:func:`workbench.observe.events.events_frame`).

Knows: the event kinds and their ``step`` / ``time_s`` columns. Must not know: the engine.

Text form (one column per decode step ``s``, one line per uid; deterministic)::

    uid 0 | ####x
    uid 1 | qq###ffx

    q  queued at step s (submitted, not admitted yet)
    #  a token generated at step s (a row joins at the step of its first token)
    f  finished, still in the batch (fed, output discarded) until filter() evicts it
    x  evicted before step s (filter after step s-1)
    p  preempted before step s (its cache dropped, back in the queue: q until re-admitted)

A run longer than ``max_columns`` steps (default 100, so a line fits a notebook's output
area at 100% zoom without wrapping) is drawn ``k = ceil(steps / max_columns)`` steps per
column, under a header line saying so; a column shows the strongest of its steps' marks,
``x`` > ``p`` > ``#`` > ``f`` > ``q`` > blank::

    (one column = 2 decode steps)
    uid 0 | ##x
    uid 1 | qq###x

Rich form: a matplotlib Figure over wall-clock time (``x="time"``) or over decode steps
(``x="step"``), with join (▶), evict (◀) and preempt (▼) marks; a preempted row is queued
again from its preemption to its re-admission. Over steps an event logged with step
index ``s`` sits at ``s`` (before step ``s``'s forward) and a token of step ``s`` fills
``[s, s + 1)``, so prefill (admit → first token) has no width; over time it has.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from . import style

SPANS = (
    ("queued", style.QUEUED),
    ("prefill", style.PREFILL),
    ("decode", style.ATTENDED),
    ("finished, not filtered", style.WAITING),
)
MARKS = {"join": ">", "evict": "<", "preempt": "v"}  # event kind -> its marker on a row
MIN_VISIBLE_SHARE = 0.002  # a span narrower than this share of the axis is under a pixel wide
AXES = {"time": ("time_s", "time since first submit (s)"), "step": ("step", "decode step")}


def _per_uid(events: pd.DataFrame, kind: str, col: str, how: str = "min") -> pd.Series:
    return getattr(events[events.kind == kind].groupby("uid")[col], how)()


TEXT_COLUMNS = 100  # step columns of the text form: "uid NN | " + 100 < a JupyterLab output line at 100% zoom
MARK_RANK = {
    " ": 0,
    "q": 1,
    "f": 2,
    "#": 3,
    "p": 4,
    "x": 5,
}  # the mark a merged column shows: the highest rank


def timeline_text(events: pd.DataFrame, max_columns: int = TEXT_COLUMNS) -> str:
    """ASCII Gantt over decode steps of a report's ``events`` frame (deterministic; see
    the module docstring). At most ``max_columns`` step columns per line: a longer run
    merges ``ceil(steps / max_columns)`` steps per column and says so in a header line.

    Raises:
        ValueError: for ``max_columns < 1``.
    """
    if max_columns < 1:
        raise ValueError(f"max_columns must be >= 1, got {max_columns!r}")
    if events.empty:
        return "(no events)"
    n_steps = int(events.step.max()) + 1
    sub = _per_uid(events, "submit", "step")
    adm = _per_uid(events, "admit", "step")
    fin = _per_uid(events, "finish", "step")
    evi = _per_uid(events, "evict", "step")
    tok_steps = events[events.kind == "token"].groupby("uid").step.apply(set)
    again = preemptions(events, "step")
    width = max(len(str(u)) for u in sub.index)
    per_column = -(-n_steps // max_columns)
    lines = [f"(one column = {per_column} decode steps)"] if per_column > 1 else []
    for uid in sub.index:
        cells = []
        for s in range(n_steps):
            if s in tok_steps.get(uid, ()):
                cells.append("#")
            elif uid in evi.index and s >= evi[uid]:
                cells.append("x" if s == evi[uid] else " ")
            elif uid in fin.index and s > fin[uid]:
                cells.append("f")
            elif ((again.uid == uid) & (again.preempt == s)).any():
                cells.append("p")
            elif (sub[uid] <= s and (uid not in adm.index or adm[uid] > s)) or _requeued(again, uid, s):
                cells.append("q")
            else:
                cells.append(" ")
        merged = [
            max(cells[i : i + per_column], key=MARK_RANK.__getitem__) for i in range(0, n_steps, per_column)
        ]
        lines.append(f"uid {uid:>{width}} | " + "".join(merged).rstrip())
    return "\n".join(lines)


def _axis(events: pd.DataFrame, x: str) -> tuple[str, float]:
    """The events' column for axis ``x`` and its origin (the first submit's time, or step 0).

    Raises:
        ValueError: for an ``x`` other than ``time`` or ``step``.
    """
    if x not in AXES:
        raise ValueError(f"x must be one of {sorted(AXES)}, got {x!r}")
    col = AXES[x][0]
    return col, events[events.kind == "submit"][col].min() if x == "time" else 0


def span_bounds(events: pd.DataFrame, x: str = "time") -> pd.DataFrame:
    """Per uid (index, submit order) the span boundaries on axis ``x`` (``time`` in seconds
    since the first submit, or ``step``): columns ``submit``, ``admit``, ``join``,
    ``first_token``, ``finish``, ``evict`` (NaN where the event has not happened).
    ``finish`` is the end of decoding: the finish time, or over steps ``finish step + 1``.
    ``now`` (the same on every row) is the latest position the events reach: the last
    event time, or over steps the last step index (``+ 1`` after a token).

    Raises:
        ValueError: for an ``x`` other than ``time`` or ``step``.
    """
    col, t0 = _axis(events, x)
    out = pd.DataFrame({"submit": _per_uid(events, "submit", col)})
    for name, kind in (
        ("admit", "admit"),
        ("join", "join"),
        ("first_token", "token"),
        ("finish", "finish"),
        ("evict", "evict"),
    ):
        out[name] = _per_uid(events, kind, col)
    tok = events.kind == "token"
    if x == "step":
        out["finish"] += 1
        out["now"] = max(events.step[~tok].max(), events.step[tok].max() + 1 if tok.any() else 0)
    else:
        out["now"] = events.time_s.max()
    return out - t0


def preemptions(events: pd.DataFrame, x: str = "time") -> pd.DataFrame:
    """One row per ``preempt`` event, in log order: ``uid``, and on axis ``x`` (as
    :func:`span_bounds`: seconds since the first submit, or step) the ``preempt``, the
    request's next ``admit`` after it and its next ``token`` after that admit
    (``first_token``); NaN where that has not happened yet.

    Raises:
        ValueError: for an ``x`` other than ``time`` or ``step``.
    """
    col, t0 = _axis(events, x)
    rows = []
    for i, e in events[events.kind == "preempt"].iterrows():
        later = events[(events.index > i) & (events.uid == e.uid)]
        admit = later[later.kind == "admit"]
        token = later[(later.kind == "token") & (later.index > admit.index[0])] if len(admit) else admit
        at = [float(f[col].iloc[0]) - t0 if len(f) else float("nan") for f in (admit, token)]
        rows.append((e.uid, float(e[col]) - t0, *at))
    return pd.DataFrame(rows, columns=["uid", "preempt", "admit", "first_token"])


def _requeued(again: pd.DataFrame, uid: int, s: int) -> bool:
    """Whether ``uid`` waits in the queue again at step ``s`` (after a preemption in
    ``again``, :func:`preemptions` over steps, and before its re-admission)."""
    mine = again[again.uid == uid]
    return bool(((mine.preempt < s) & ~(mine.admit <= s)).any())


def render_timeline(
    events: pd.DataFrame, title: str = "row timeline", x: str = "time", width_in: float = 9.0
) -> Figure:
    """Gantt chart of a report's ``events`` over ``x`` = ``time`` (seconds since the first
    submit) or ``step`` (decode steps).

    Per uid: queued (submit → admit), prefill (admit → first token, which includes the
    joiner's first decode step), decode (first token → finish) and finished-not-filtered
    (finish → evict) spans; joins (▶) and evictions (◀) marked. The legend lists only
    the kinds drawn at least about a pixel wide (:func:`visible_spans`): over time, a
    row evicted microseconds after it finished shows no finished-not-filtered span.

    ``width_in``: the figure's width (inches); under 6 inches the legend goes below the
    axes. With no events, the axes say so (no bare 0..1 axes).

    Raises:
        ValueError: for an unknown ``x``.
    """
    if x not in AXES:
        raise ValueError(f"x must be one of {sorted(AXES)}, got {x!r}")
    fig = Figure(figsize=(width_in, 0.35 * max(4, events.uid.nunique()) + 1.2), layout="constrained")
    ax = fig.add_subplot()
    if events.empty:
        ax.set_title(title)
        style.empty(ax, "no requests yet: submit a prompt")
        return fig
    shown = _draw(ax, events, title, x)
    if width_in < 6:
        ax.title.set_fontsize("medium")
    if width_in >= 6:
        _legend(ax, shown)
    elif shown:
        style.legend(fig, [(n, c) for n, c in SPANS if n in shown], ncol=2)
    return fig


# runs side by side fit a JupyterLab output area (968 px at a 1400 px window) at the inline 100 dpi:
# two panels at 5.5 in each were 1111 px, shown shrunk to 87%
TIMELINES_WIDTH_IN = 9.4


def render_timelines(runs: dict[str, pd.DataFrame], x: str = "step") -> Figure:
    """Timelines of several runs side by side, one panel per run on shared axes (e.g. two
    forks of one scheduler that made different admission choices).

    Args:
        runs: panel title -> that run's events (a report's ``events``).
        x: ``step`` or ``time``, as :func:`render_timeline`.

    Raises:
        ValueError: for an unknown ``x`` or no runs.
    """
    if not runs:
        raise ValueError("render_timelines needs at least one run (title -> events)")
    rows = max(ev.uid.nunique() for ev in runs.values())
    width_in = min(TIMELINES_WIDTH_IN, 5.5 * len(runs))  # 5.5 in a panel, at most an output area's width
    fig = Figure(figsize=(width_in, 0.35 * max(4, rows) + 1.4), layout="constrained")
    axes = fig.subplots(1, len(runs), sharex=True, sharey=True, squeeze=False)[0]
    shown = set().union(*(_draw(ax, events, title, x) for ax, (title, events) in zip(axes, runs.items())))
    _legend(axes[-1], shown)
    return fig


def visible_spans(
    b: pd.DataFrame, min_share: float = MIN_VISIBLE_SHARE, preempted: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The spans :func:`render_timeline` draws, from :func:`span_bounds` ``b``: one row per
    (uid, kind) with ``y`` (row position), ``kind`` (a name of ``SPANS``), ``left`` and
    ``width`` (axis units). A span still open runs to ``now``; zero-width spans are left
    out. ``visible`` is True when the width is at least ``min_share`` of the axis (about
    a pixel), so a legend lists only kinds one can see. ``preempted`` (:func:`preemptions`
    on the same axis) cuts a row's span at each preemption: queued up to its re-admission,
    prefill up to its next token, then decode again up to where the cut span ended.

    >>> b = pd.DataFrame({"submit": [0.0], "admit": [0.0], "first_token": [1.0], "finish": [9.0],
    ...                   "evict": [9.0078125], "now": [10.0]})
    >>> spans = visible_spans(b)
    >>> spans.kind.tolist(), spans.width.tolist()
    (['prefill', 'decode', 'finished, not filtered'], [1.0, 8.0, 0.0078125])
    >>> spans.visible.tolist()
    [True, True, False]
    """
    rows = []
    for y, (_uid, r) in enumerate(b.iterrows()):
        bounds = [r.submit, r.admit, r.first_token, r.finish, r.evict]
        for (name, _color), lo, hi in zip(SPANS, bounds, bounds[1:]):
            if pd.notna(lo) and pd.isna(hi):  # the span still open: draw it up to now
                hi = r.now
            if pd.notna(lo) and hi > lo:
                rows.append((y, name, lo, hi - lo))
    for cut in preempted.itertuples() if preempted is not None else ():
        rows = _cut_at_preemption(rows, b.index.get_loc(cut.uid), cut, float(b.now.max()))
    out = pd.DataFrame(rows, columns=["y", "kind", "left", "width"])
    extent = float(b.now.max()) if len(b) else 0.0
    out["visible"] = out.width >= min_share * extent
    return out


def _cut_at_preemption(rows: list[tuple], y: int, cut, now: float) -> list[tuple]:
    """``rows`` (``(y, kind, left, width)``) with row ``y``'s span over ``cut.preempt``
    split there: queued to ``cut.admit``, prefill to ``cut.first_token``, decode to the
    span's old end (each up to ``now`` while still open; zero widths left out)."""
    out = []
    for r in rows:
        ry, kind, left, width = r
        if ry != y or not left <= cut.preempt < left + width:
            out.append(r)
            continue
        end = left + width
        admit, first = (v if pd.notna(v) else now for v in (cut.admit, cut.first_token))
        pieces = [(kind, left, cut.preempt), ("queued", cut.preempt, admit), ("prefill", admit, first)]
        for name, lo, hi in [*pieces, ("decode", first, end)]:
            out.append((y, name, lo, min(hi, end) - lo))
    return [r for r in out if r[3] > 0]


MARGIN = 0.015  # share of the x range left of 0, so a join mark at 0 is not cut by the axis


def _draw(ax, events: pd.DataFrame, title: str, x: str) -> set[str]:
    """One timeline on ``ax`` (see :func:`render_timeline`); returns the span kinds drawn
    with a visible width (:func:`visible_spans`), the ones a legend lists."""
    if events.empty:
        return set()
    b = span_bounds(events, x)
    again = preemptions(events, x)
    spans = visible_spans(b, preempted=again)
    colors = dict(SPANS)
    for span in spans.itertuples():
        ax.barh(span.y, span.width, left=span.left, color=colors[span.kind])
    col, t0 = _axis(events, x)
    for kind, marker in MARKS.items():
        for e in events[events.kind == kind].itertuples():
            y = b.index.get_loc(e.uid)
            size = 7 if kind == "preempt" else 4  # the rare mark, drawn larger
            ax.plot(
                getattr(e, col) - t0,
                y,
                marker=marker,
                color="black",
                markersize=size,
                clip_on=False,
                zorder=3,
            )
    right = max(b.now.max() * 1.02, 1.0 if x == "step" else 1e-3)  # room for the last evict mark
    if x == "step" and (b["join"].notna() & b["first_token"].isna()).any():
        right = b.now.max() + 1  # a row joined, its first token next step: keep that step in view
    ax.set_xlim(-MARGIN * right, right)  # and for a join mark at 0, clear of the axis
    if x == "step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # decode steps are whole numbers
    ax.set_yticks(range(len(b)), [f"uid {u}" for u in b.index])
    if not ax.yaxis_inverted():  # once: panels of render_timelines share one y axis
        ax.invert_yaxis()
    ax.set_xlabel(AXES[x][1])
    marks = "▶ join, ◀ evict" + (", ▼ preempt" if len(again) else "")
    ax.set_title(f"{title}  ({marks})")
    return set(spans.kind[spans.visible])


def _legend(ax, shown: set[str]) -> None:
    """The span legend right of ``ax``: the kinds in ``shown``, in ``SPANS`` order."""
    if shown:
        ax.legend(
            handles=[Patch(facecolor=c, label=n) for n, c in SPANS if n in shown],
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
            fontsize="small",
        )
