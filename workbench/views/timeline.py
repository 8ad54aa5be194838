"""Row timeline (Gantt): per uid, queued, prefilling and decoding spans, from events.

Text form (one column per decode step, one line per uid)::

    uid 0 | ####x
    uid 1 | qq###x         q queued, # token at this step, x finished (evicted at filter)

Rich form: a matplotlib Figure over wall-clock time with join (▶) and evict (◀) marks.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

SPANS = (("queued", "#c7c7c7"), ("prefill", "#f2a541"), ("decode", "#3b7dd8"))


def _per_uid(events: pd.DataFrame, kind: str, col: str, how: str = "min") -> pd.Series:
    return getattr(events[events.kind == kind].groupby("uid")[col], how)()


def timeline_text(events: pd.DataFrame) -> str:
    """ASCII Gantt over decode steps of a report's ``events`` frame (deterministic)."""
    if events.empty:
        return "(no events)"
    n_steps = int(events.step.max()) + 1
    sub = _per_uid(events, "submit", "step")
    adm = _per_uid(events, "admit", "step")
    fin = _per_uid(events, "finish", "step")
    tok_steps = events[events.kind == "token"].groupby("uid").step.apply(set)
    width = max(len(str(u)) for u in sub.index)
    lines = []
    for uid in sub.index:
        cells = []
        for s in range(n_steps):
            if s in tok_steps.get(uid, ()):
                cells.append("#")
            elif uid in fin.index and s > fin[uid]:
                cells.append("x" if s == fin[uid] + 1 else " ")
            elif sub[uid] <= s and (uid not in adm.index or adm[uid] > s):
                cells.append("q")
            else:
                cells.append(" ")
        lines.append(f"uid {uid:>{width}} | " + "".join(cells).rstrip())
    return "\n".join(lines)


def render_timeline(events: pd.DataFrame, title: str = "row timeline") -> Figure:
    """Gantt chart over time (seconds since the first submit) of a report's ``events``.

    Per uid: queued (submit → admit), prefill (admit → first token, which includes the
    joiner's first decode step) and decode (first token → finish) spans.
    """
    fig = Figure(figsize=(9, 0.35 * max(4, events.uid.nunique()) + 1.2), layout="constrained")
    ax = fig.add_subplot()
    if events.empty:
        return fig
    t0 = events[events.kind == "submit"].time_s.min()
    sub = _per_uid(events, "submit", "time_s")
    adm = _per_uid(events, "admit", "time_s")
    joi = _per_uid(events, "join", "time_s")
    tok = _per_uid(events, "token", "time_s")
    fin = _per_uid(events, "finish", "time_s")
    evi = _per_uid(events, "evict", "time_s")
    for y, uid in enumerate(sub.index):
        bounds = [sub[uid], adm.get(uid, float("nan")), tok.get(uid, float("nan")), fin.get(uid, float("nan"))]
        for (name, color), a, b in zip(SPANS, bounds, bounds[1:]):
            if pd.notna(a) and pd.notna(b) and b >= a:
                ax.barh(y, b - a, left=a - t0, color=color, label=name if y == 0 else None)
        if uid in joi.index:
            ax.plot(joi[uid] - t0, y, marker=">", color="black", markersize=4)
        if uid in evi.index:
            ax.plot(evi[uid] - t0, y, marker="<", color="crimson", markersize=4)
    ax.set_yticks(range(len(sub)), [f"uid {u}" for u in sub.index])
    ax.invert_yaxis()
    ax.set_xlabel("time since first submit (s)")
    ax.set_title(f"{title}  (▶ join, ◀ evict)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return fig
