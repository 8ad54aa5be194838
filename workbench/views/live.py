"""Live latency and throughput: each row's TTFT split into its parts, the inter-token gaps
(ITL) of each row per decode step, and tokens per second per step, decode and prefill
apart, with the step's wall time. What the panel's "latency" view and the HTML replay draw
as the engine steps.

Knows: the event log frame (:func:`workbench.observe.events.events_frame`) and
:func:`workbench.observe.metrics.token_gaps`. Must not know: the engine. Every function is
a pure function of the events given; :func:`events_before` cuts a log to what a snapshot
had seen (the decode steps it completed), so the same plots follow a history slider back.

Definitions (seconds of the injected clock; per uid, first events)::

    queued       = admit - submit          (waiting for a row of the batch)
    prefill      = join - admit            (prefill chunks until the row joins the batch)
    first token  = first token - join      (the decode step that samples it; ~0 in the packed
                                            layout, where the last prompt chunk gives it)
    TTFT         = queued + prefill + first token = first token - submit
    ITL          = a token's time - the same row's previous token's time (one cell per
                   row and decode step: a step's largest gap, as a speculative step lands
                   several tokens at once)

Per decode step ``s`` (:func:`step_rates`): ``decode_tokens`` = its ``token`` events,
``prefill_tokens`` = the prompt tokens of its ``prefill`` events (chunks run between step
``s - 1``'s tokens and step ``s``'s), ``end_s`` = its last token (a step with no token: its
last prefill), ``wall_s`` = ``end_s`` - the previous step's ``end_s`` (the first step of the
log: from its first ``admit``), and ``decode_tok_per_s`` / ``prefill_tok_per_s`` = those
tokens / ``wall_s``: both over the same wall time, so a step with a long prefill shows its
decode rate falling. ``wall_s`` is the time a client saw between tokens: in a session
driven by hand it includes the pause between two clicks (Run N steps times the engine).

Text form (:func:`live_latency_text`, deterministic under a fake clock)::

    uid   TTFT ms = queued + prefill + 1st tok | ITL ms p50     max gaps
      0    2000.0 = 1500.0 +   300.0 +   200.0 |     1000.0  1000.0    2
      1    1000.0 =  500.0 +   300.0 +   200.0 |     1000.0  1000.0    1
    waiting: uid 2
    step 2: 1 decode + 0 prefill tokens in 1000.0 ms: 1.0 + 0.0 tok/s
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from ..observe.metrics import token_gaps
from . import style
from .follow import seen_by

TTFT_COLUMNS = ["uid", "queued_s", "prefill_s", "first_token_s", "ttft_s", "first_token_step"]
TTFT_PARTS = (
    ("queued", "queued_s", style.QUEUED),
    ("prefill", "prefill_s", style.PREFILL),
    ("first token", "first_token_s", style.ATTENDED),
)
ITL_COLUMNS = ["uid", "step", "gap_s"]
RATE_COLUMNS = [
    "step",
    "end_s",
    "wall_s",
    "decode_tokens",
    "prefill_tokens",
    "decode_tok_per_s",
    "prefill_tok_per_s",
]
ITL_COLOURMAP = "magma_r"  # light: a short gap; dark: a long one (a row stalled)


def events_before(events: pd.DataFrame, step: int) -> pd.DataFrame:
    """The events of decode steps before ``step`` (``events.step < step``): what a snapshot
    taken after ``step`` decode steps had seen of its completed steps (the panel's slider
    passes the shown snapshot's ``step``)."""
    return events[events.step < step]


SEEN_ARRIVALS = ("submit", "admit", "join")  # a request's events before its first token


def events_seen(events: pd.DataFrame, snap) -> pd.DataFrame:
    """What the latency views of snapshot ``snap`` read: the events of the decode steps it
    completed (:func:`events_before`) and, of step ``snap.step`` itself, the submit, admit
    and join events it had seen (:func:`~workbench.views.follow.seen_by`). A request the
    snapshot shows queued or in the batch before its first token is then named as waiting
    (never "no request yet" beside a batch that holds it); TTFT, ITL and the per-step rates
    still read completed steps only. ``events``: a log frame in log order."""
    arrivals = ((events.step == snap.step) & events.kind.isin(SEEN_ARRIVALS)).to_numpy()
    return events[(events.step < snap.step).to_numpy() | (arrivals & seen_by(events, snap))]


def _first(events: pd.DataFrame, kind: str, col: str = "time_s") -> pd.Series:
    return events[events.kind == kind].groupby("uid")[col].min()


def ttft_parts(events: pd.DataFrame) -> pd.DataFrame:
    """One row per request whose first token is in ``events``, in first-token order, with
    ``TTFT_COLUMNS``: its queued, prefill and first-token seconds (module docstring),
    their sum ``ttft_s`` (= first token time - submit time, as
    :func:`~workbench.observe.metrics.request_metrics`) and the decode step of the first
    token. A request whose submit is not in ``events`` is left out."""
    submit, admit, join = (_first(events, k) for k in ("submit", "admit", "join"))
    first, first_step = _first(events, "token"), _first(events, "token", "step")
    uids = [u for u in first.sort_values(kind="stable").index if u in submit.index]
    rows = []
    for uid in uids:
        t_admit = admit.get(uid, submit[uid])
        t_join = join.get(uid, t_admit)
        rows.append(
            (
                int(uid),
                t_admit - submit[uid],
                t_join - t_admit,
                first[uid] - t_join,
                first[uid] - submit[uid],
                int(first_step[uid]),
            )
        )
    return pd.DataFrame(rows, columns=TTFT_COLUMNS)


def waiting_uids(events: pd.DataFrame) -> list[int]:
    """Requests submitted in ``events`` with no token there yet and not finished (queued,
    prefilling, or joined before their first token), in submit order."""
    sub = events[events.kind == "submit"].uid.tolist()
    done = set(events[events.kind.isin(["token", "finish"])].uid)
    return [int(u) for u in sub if u not in done]


def itl_cells(events: pd.DataFrame) -> pd.DataFrame:
    """The inter-token gaps as cells of a row x step grid, with ``ITL_COLUMNS``: per uid and
    decode step of a token that had a previous token, the step's largest gap (seconds;
    :func:`~workbench.observe.metrics.token_gaps` joined to the steps of the tokens)."""
    tok = events[events.kind == "token"].sort_values(["uid", "time_s"], kind="stable")
    gaps = token_gaps(events)
    steps = tok.groupby("uid").step.apply(lambda s: s.to_numpy()[1:])
    gaps["step"] = np.concatenate([steps[u] for u in gaps.uid.unique()]) if len(gaps) else []
    cells = gaps.groupby(["uid", "step"], sort=True).gap_s.max().reset_index()
    return cells.astype({"uid": int, "step": int})[ITL_COLUMNS]


def step_rates(events: pd.DataFrame) -> pd.DataFrame:
    """One row per decode step with a token or a prefill chunk, in step order, with
    ``RATE_COLUMNS`` (module docstring: decode and prefill tokens, the step's wall time and
    both rates over it, NaN where the wall time is not > 0)."""
    tok = events[events.kind == "token"]
    pre = events[events.kind == "prefill"]
    steps = sorted(set(tok.step) | set(pre.step))
    if not steps:
        return pd.DataFrame(columns=RATE_COLUMNS)
    tok_end, pre_end = tok.groupby("step").time_s.max(), pre.groupby("step").time_s.max()
    out = pd.DataFrame({"step": [int(s) for s in steps]})
    out["end_s"] = [tok_end.get(s, pre_end.get(s)) for s in steps]
    first = events[(events.step == steps[0]) & (events.kind == "admit")].time_s
    start = first.min() if len(first) else events[events.step == steps[0]].time_s.min()
    out["wall_s"] = out.end_s.diff().fillna(out.end_s.iloc[0] - start)
    out["decode_tokens"] = [int((tok.step == s).sum()) for s in steps]
    out["prefill_tokens"] = [int(pre.n_tokens[pre.step == s].sum()) for s in steps]
    wall = out.wall_s.where(out.wall_s > 0)
    out["decode_tok_per_s"] = out.decode_tokens / wall
    out["prefill_tok_per_s"] = out.prefill_tokens / wall
    return out[RATE_COLUMNS]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def live_latency_text(events: pd.DataFrame) -> str:
    """The three views as text (module docstring): per row that has its first token, its
    TTFT and parts and its ITL p50 and max over its gaps; the requests still waiting; the
    latest step's tokens, wall time and rates."""
    parts = ttft_parts(events)
    gaps = token_gaps(events).groupby("uid").gap_s
    p50, top, n = gaps.median(), gaps.max(), gaps.size()
    lines = [
        f"{'uid':>3} {'TTFT ms':>9} = {'queued':>6} + {'prefill':>7} + {'1st tok':>7} | ITL ms p50     max gaps"
    ]
    for r in parts.itertuples():
        itl = f"{_ms(p50[r.uid]):>7} {_ms(top[r.uid]):>7} {n[r.uid]:>4}" if r.uid in n.index else "      -"
        lines.append(
            f"{r.uid:>3} {_ms(r.ttft_s):>9} = {_ms(r.queued_s):>6} + {_ms(r.prefill_s):>7} + "
            f"{_ms(r.first_token_s):>7} |    {itl}"
        )
    waiting = waiting_uids(events)
    if waiting:
        lines.append("waiting: uid " + ", ".join(map(str, waiting)))
    if parts.empty and not waiting:
        lines.append("(no request yet)")
    rates = step_rates(events)
    if len(rates):
        r = rates.iloc[-1]
        tok_s = f"{r.decode_tok_per_s:.1f} + {r.prefill_tok_per_s:.1f} tok/s" if r.wall_s > 0 else "n/a"
        lines.append(
            f"step {int(r.step)}: {int(r.decode_tokens)} decode + {int(r.prefill_tokens)} prefill tokens "
            f"in {_ms(r.wall_s)} ms: {tok_s}"
        )
    return "\n".join(lines)


def render_ttft(events: pd.DataFrame, width_in: float = 4.7, title: str = "TTFT per row") -> Figure:
    """Each row's TTFT as its first token lands: a horizontal bar per uid (first on top,
    x in ms) stacked from its queued, prefill and first-token parts (:func:`ttft_parts`;
    the timeline's colours: queued grey, prefill yellow, decode blue), its TTFT written at
    its end; requests still waiting are named under the title."""
    n = len(ttft_parts(events))
    fig = Figure(figsize=(width_in, 1.5 + 0.16 * max(n, 4)), layout="constrained")
    _draw_ttft(fig, events, title)
    return fig


def _draw_ttft(fig, events: pd.DataFrame, title: str) -> None:
    """:func:`render_ttft` into ``fig`` (a Figure or a SubFigure)."""
    parts, waiting = ttft_parts(events), waiting_uids(events)
    ax = fig.add_subplot()
    note = (
        ("waiting: " + ", ".join(map(str, waiting[:8])) + (" ..." if len(waiting) > 8 else ""))
        if waiting
        else ""
    )
    fig.suptitle(f"{title} (ms)" + (f" · {note}" if note else ""), fontsize="medium")
    if parts.empty:
        style.empty(ax, "no first token yet: a row's first decode step gives it")
        return
    y = np.arange(len(parts))
    left = np.zeros(len(parts))
    for name, col, colour in TTFT_PARTS:
        ms = parts[col].to_numpy(float) * 1e3
        ax.barh(y, ms, left=left, color=colour, edgecolor=style.EDGE, linewidth=0.4, label=name)
        left += ms
    for yy, total in zip(y, left):
        ax.text(total, yy, f" {total:.0f}", va="center", ha="left", fontsize="small")
    ax.set_xlim(0, left.max() * 1.22 if left.max() > 0 else 1)
    labels = [f"uid {u}" for u in parts.uid]
    every = -(-len(parts) // 10)  # at most 10 labels, so they never overlap
    ax.set_yticks(y[::every], labels[::every])
    ax.set_ylim(len(parts) - 0.5, -0.5)
    ax.set_xlabel("ms since submit")
    ax.grid(axis="x", alpha=0.3)
    style.legend(fig, [(n, c) for n, _, c in TTFT_PARTS])


def _step_axis(ax, first: int, last: int) -> None:
    """Decode steps ``first .. last`` on ``ax``'s x axis: step ``s`` fills ``[s, s + 1)``,
    as in the timeline over steps (:func:`~workbench.views.timeline.render_timeline`)."""
    ax.set_xlim(first, last + 1)
    style.integer_ticks(ax.xaxis, first, last + 1, max_labels=8)
    ax.set_xlabel("decode step")


def render_itl(
    events: pd.DataFrame, width_in: float = 4.7, steps: tuple[int, int] | None = None, title: str = ""
) -> Figure:
    """The ITL of each row per decode step (:func:`itl_cells`): a row x step grid on the
    timeline's step axis (a token of step ``s`` fills ``[s, s + 1)``), coloured by the gap
    in ms (log scale: light short, dark long, so a step stalled by another request's
    prefill shows as a dark column across the rows it held). ``steps``: the ``(first,
    last)`` steps shown (default: those of the events)."""
    n = itl_cells(events).uid.nunique()
    fig = Figure(figsize=(width_in, 1.5 + 0.16 * max(n, 4)), layout="constrained")
    _draw_itl(fig, events, steps, title)
    return fig


def _draw_itl(fig, events: pd.DataFrame, steps: tuple[int, int] | None, title: str) -> None:
    """:func:`render_itl` into ``fig`` (a Figure or a SubFigure)."""
    cells = itl_cells(events)
    ax = fig.add_subplot()
    fig.suptitle(title or "ITL per row and step (ms)", fontsize="medium")
    if cells.empty:
        style.empty(ax, "no row has two tokens yet")
        return
    uids = list(dict.fromkeys(events[events.kind == "submit"].uid.tolist() + cells.uid.tolist()))
    uids = [u for u in uids if u in set(cells.uid)]
    first, last = steps or (int(events.step.min()), int(cells.step.max()))
    grid = np.full((len(uids), last - first + 1), np.nan)
    keep = cells[(cells.step >= first) & (cells.step <= last)]
    grid[[uids.index(u) for u in keep.uid], keep.step.to_numpy() - first] = keep.gap_s.to_numpy() * 1e3
    ms = cells.gap_s.to_numpy() * 1e3
    low, high = max(ms.min(), 1e-3), max(ms.max(), ms.min() * 1.01, 1e-3 * 1.01)
    image = ax.imshow(
        grid,
        aspect="auto",
        interpolation="nearest",
        cmap=ITL_COLOURMAP,
        norm=LogNorm(low, high),
        extent=(first, last + 1, len(uids) - 0.5, -0.5),
    )
    every = -(-len(uids) // 10)
    ax.set_yticks(range(0, len(uids), every), [f"uid {u}" for u in uids[::every]])
    _step_axis(ax, first, last)
    bar = fig.colorbar(image, ax=ax, pad=0.01, fraction=0.05)
    style.plain_log_axis(bar.ax.yaxis, [ms])
    bar.ax.tick_params(labelsize="small")
    bar.set_label("ms", fontsize="small")


def render_step_rates(
    events: pd.DataFrame, width_in: float = 4.7, steps: tuple[int, int] | None = None, title: str = ""
) -> Figure:
    """Tokens per second per decode step (:func:`step_rates`), decode (blue dots) and
    prefill (yellow squares) apart, over the step's wall time (log y), above the wall
    time itself (bars, ms), both on the timeline's step axis. ``steps``: the ``(first,
    last)`` steps shown (default: those of the events)."""
    fig = Figure(figsize=(width_in, 2.6), layout="constrained")
    _draw_step_rates(fig, events, steps, title)
    return fig


def _draw_step_rates(fig, events: pd.DataFrame, steps: tuple[int, int] | None, title: str) -> None:
    """:func:`render_step_rates` into ``fig`` (a Figure or a SubFigure)."""
    rates = step_rates(events)
    fig.suptitle(title or "tokens per second per step (log), and the step's wall time", fontsize="medium")
    if rates.empty:
        style.empty(fig.add_subplot(), "no decode step yet")
        return
    rate_ax, wall_ax = fig.subplots(2, 1, sharex=True, height_ratios=[1.4, 1])
    x = rates.step.to_numpy() + 0.5
    for col, name, colour, marker in (
        ("decode_tok_per_s", "decode", style.ATTENDED, "o"),
        ("prefill_tok_per_s", "prefill", style.PREFILL, "s"),
    ):
        v = rates[col].to_numpy(float)
        shown = np.isfinite(v) & (v > 0)
        rate_ax.plot(
            x[shown], v[shown], marker, color=colour, markersize=3.5, markeredgecolor=style.EDGE,
            markeredgewidth=0.3, label=name, linestyle="none",
        )  # fmt: skip
    if rate_ax.has_data():
        rate_ax.set_yscale("log")
        style.plain_log_axis(rate_ax.yaxis, [rates.decode_tok_per_s, rates.prefill_tok_per_s])
    rate_ax.set_ylabel("tok/s")
    fig.legend(
        *rate_ax.get_legend_handles_labels(),
        loc="outside lower center",
        ncol=2,
        fontsize="small",
        frameon=False,
    )
    rate_ax.grid(alpha=0.3)
    wall_ax.bar(x, rates.wall_s * 1e3, width=0.8, color=style.SERIES[0])
    wall_ax.set_ylabel("wall ms")
    wall_ax.grid(axis="y", alpha=0.3)
    first, last = steps or (int(events.step.min()), int(rates.step.max()))
    _step_axis(wall_ax, first, last)


def render_live_latency(events: pd.DataFrame, title: str = "latency and throughput") -> Figure:
    """The three live views side by side in one figure, 9.4 inches wide (a JupyterLab
    output area, unscaled): TTFT per row with its parts (:func:`render_ttft`), ITL per row
    and step (:func:`render_itl`), tokens per second per step with the wall time
    (:func:`render_step_rates`), from ``events`` (cut to a snapshot with
    :func:`events_before`)."""
    fig = Figure(figsize=(9.4, 3.4), layout="constrained")
    fig.suptitle(title)
    ttft, itl, rates = fig.subfigures(1, 3, width_ratios=[1, 1.1, 1])
    _draw_ttft(ttft, events, "TTFT per row")
    _draw_itl(itl, events, None, "ITL per row and step (ms)")
    _draw_step_rates(rates, events, None, "tok/s per step, wall time")
    return fig
