"""Metrics from events only: per-request latencies and aggregate throughput.

Knows: the event log as a DataFrame (:func:`workbench.observe.events.events_frame`). Must not
know: the scheduler, MLX, caches. Pure functions, tested on synthetic events.

Definitions (seconds; all differences of the injected clock):

- ``queue_s``  = admit time − submit time
- ``ttft_s``   = first token time − submit time (time to first token, queue included)
- ``tpot_s``   = (last token time − first token time) / (generated tokens − 1), NaN for
  one token (time per output token after the first; the mean inter-token latency, ITL)
- ``e2e_s``    = finish time − submit time
- ``throughput_tok_per_s`` = generated tokens / (last token time − first submit time)
- ``cached_tokens`` = prompt tokens found in the prompt cache at (first) admission

Per decode step (:func:`step_metrics`): ``batch_size`` = rows in the batch during the step
(joined at or before it, not yet evicted), ``tokens`` = token events of the step,
``step_s`` = its last token time − the previous step's last token time (so admission and
prefill between two steps count), ``tok_per_s`` = tokens / step_s.

Service levels (:class:`SLO`): a request *meets* the SLO when it finished, its
``ttft_s <= SLO.ttft_s`` and its ``tpot_s <= SLO.tpot_s`` (a one-token request, whose
TPOT is NaN, meets the TPOT bound). ``goodput_req_per_s`` = requests meeting the SLO /
the run's span (first submit to last token), as in DistServe (Zhong et al., OSDI 2024).

Occupancy over time (:func:`occupancy`), counted from events: ``queued`` = submitted −
admitted, ``prefilling`` = admitted − joined, ``running`` = joined − evicted.

Inter-token gaps (:func:`token_gaps`): every gap between two consecutive tokens of a
request; their distribution is the ITL (its per-request mean is ``tpot_s``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

REQUEST_COLUMNS = [
    "uid",
    "prompt_tokens",
    "generated_tokens",
    "queue_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "finish_reason",
    "text",
    "error",
    "cached_tokens",
]


def _first_time(ev: pd.DataFrame, kind: str) -> pd.Series:
    return ev[ev.kind == kind].groupby("uid").time_s.min()


def request_metrics(
    events: pd.DataFrame, decode: Callable[[list[int], int], str] | None = None
) -> pd.DataFrame:
    """One row per submitted request with ``REQUEST_COLUMNS``.

    Args:
        events: the event log frame (``events_frame``).
        decode: ``decode(tokens, uid) -> text`` for the ``text`` column (the caller strips
            a final stop token); ``None`` leaves ``text`` empty.

    Returns:
        DataFrame indexed 0..N-1 in submit order; times in seconds, NaN where the event
        has not happened yet (e.g. a queued request has no ``ttft_s``).
    """
    sub = events[events.kind == "submit"].set_index("uid")
    tok = events[events.kind == "token"]
    fin = events[events.kind == "finish"].set_index("uid")
    first_tok = tok.groupby("uid").time_s.min()
    last_tok = tok.groupby("uid").time_s.max()
    n_tok = tok.groupby("uid").size()
    admit = _first_time(events, "admit")
    adm = events[events.kind == "admit"]
    cached = adm.groupby("uid").n_cached.first() if "n_cached" in adm else {}
    tokens_of = tok.groupby("uid").token.agg(lambda s: s.astype(int).tolist())
    rows = []
    for uid, s in sub.iterrows():
        n = int(n_tok.get(uid, 0))
        tpot = (last_tok[uid] - first_tok[uid]) / (n - 1) if n > 1 else math.nan
        tokens = tokens_of.get(uid, [])
        rows.append(
            {
                "uid": int(uid),
                "prompt_tokens": int(s.n_tokens),
                "generated_tokens": n,
                "queue_s": admit.get(uid, math.nan) - s.time_s,
                "ttft_s": first_tok.get(uid, math.nan) - s.time_s,
                "tpot_s": tpot,
                "e2e_s": (fin.time_s[uid] - s.time_s) if uid in fin.index else math.nan,
                "finish_reason": fin.finish_reason[uid] if uid in fin.index else "",
                "text": decode(tokens, int(uid)) if decode else "",
                "error": fin.message[uid] if uid in fin.index and "message" in fin else "",
                "cached_tokens": int(cached.get(uid, 0)) if len(cached) else 0,
            }
        )
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def span_s(events: pd.DataFrame) -> float:
    """Seconds from the first submit to the last token; NaN without both."""
    tok = events[events.kind == "token"]
    sub = events[events.kind == "submit"]
    if tok.empty or sub.empty:
        return math.nan
    return float(tok.time_s.max() - sub.time_s.min())


def throughput_tok_per_s(events: pd.DataFrame) -> float:
    """Generated tokens per second over :func:`span_s`; NaN if no tokens."""
    span = span_s(events)
    return int((events.kind == "token").sum()) / span if span > 0 else math.nan


STEP_COLUMNS = ["step", "time_s", "batch_size", "tokens", "step_s", "prefill_s", "tok_per_s"]
PREFILL_COLUMNS = ["step", "time_s", "rows", "tokens", "chunk_s", "tok_per_s"]


def prefill_chunks(events: pd.DataFrame) -> pd.DataFrame:
    """One row per prefill chunk, with ``PREFILL_COLUMNS``: ``rows`` joining rows it ran
    for, ``tokens`` their real (non-pad) prompt tokens, ``chunk_s`` its seconds (from the
    event before its first ``prefill`` event to that event: the engine logs a chunk's
    events right after running it), ``tok_per_s`` = tokens / chunk_s (prefill throughput).

    A chunk's events are consecutive ``prefill`` events of distinct uids (a batched chunk
    logs one per row; per-row chunks one each).
    """
    kinds, uids, times, steps, n = (events[c].tolist() for c in ("kind", "uid", "time_s", "step", "n_tokens"))
    rows, current = [], None
    for i, kind in enumerate(kinds):
        if kind != "prefill":
            current = None
            continue
        if current is None or uids[i] in current["uids"]:
            start = times[i - 1] if i else times[i]
            current = {
                "step": steps[i],
                "time_s": times[i],
                "uids": set(),
                "tokens": 0,
                "chunk_s": times[i] - start,
            }
            rows.append(current)
        current["uids"].add(uids[i])
        current["tokens"] += n[i]
    out = pd.DataFrame(
        [(r["step"], r["time_s"], len(r["uids"]), r["tokens"], r["chunk_s"]) for r in rows],
        columns=PREFILL_COLUMNS[:-1],
    )
    out["tok_per_s"] = out.tokens / out.chunk_s.where(out.chunk_s > 0)
    return out[PREFILL_COLUMNS]


def prefill_tok_per_s(events: pd.DataFrame) -> float:
    """Prefill throughput over the run: prompt tokens prefilled / seconds spent in prefill
    chunks (:func:`prefill_chunks`); NaN without chunks."""
    chunks = prefill_chunks(events)
    seconds = chunks.chunk_s.sum()
    return float(chunks.tokens.sum() / seconds) if seconds > 0 else math.nan


def step_metrics(events: pd.DataFrame) -> pd.DataFrame:
    """One row per decode step that produced tokens, with ``STEP_COLUMNS``.

    ``time_s`` is the step's last token time; ``step_s`` the time since the previous
    step's; ``prefill_s`` the prefill chunks run in between (:func:`prefill_chunks`), so
    ``tok_per_s`` = tokens / (``step_s`` − ``prefill_s``) is the decode rate alone.
    ``step_s`` and ``tok_per_s`` are NaN for the first step (no previous step to measure
    from). Empty when there are no tokens.
    """
    tok = events[events.kind == "token"]
    if tok.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    per_step = tok.groupby("step").agg(time_s=("time_s", "max"), tokens=("uid", "size")).reset_index()
    occ = occupancy(events, by="step")
    idx = np.searchsorted(occ.step.to_numpy(), per_step.step.to_numpy(), side="right") - 1
    per_step["batch_size"] = np.where(idx >= 0, occ.running.to_numpy()[np.maximum(idx, 0)], 0)
    per_step["step_s"] = per_step.time_s.diff()
    chunk_s = prefill_chunks(events).groupby("step").chunk_s.sum()
    per_step["prefill_s"] = per_step.step.map(chunk_s).fillna(0.0).astype(float)
    per_step["tok_per_s"] = per_step.tokens / (per_step.step_s - per_step.prefill_s)
    return per_step[STEP_COLUMNS]


def percentiles(values: pd.Series, qs=(50, 95)) -> dict[str, float]:
    """``{"p50": ..., "p95": ...}`` of the finite values (NaN when there are none)."""
    v = values.to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    return {f"p{q}": (float(np.percentile(v, q)) if v.size else math.nan) for q in qs}


@dataclass(frozen=True)
class SLO:
    """Latency bounds a request must meet to count toward goodput (seconds; ``inf``: no
    bound)."""

    ttft_s: float = math.inf
    tpot_s: float = math.inf

    def text(self) -> str:
        """One line naming the SLO's limits in milliseconds."""
        fmt = lambda s: "none" if math.isinf(s) else f"{s * 1e3:g} ms"
        return f"SLO: TTFT <= {fmt(self.ttft_s)}, TPOT <= {fmt(self.tpot_s)}"


def meets_slo(requests: pd.DataFrame, slo: SLO) -> pd.Series:
    """Bool per request row (``REQUEST_COLUMNS`` frame): finished within the SLO."""
    finished = requests.finish_reason.isin(["stop", "length"])
    tpot_ok = requests.tpot_s.isna() | (requests.tpot_s <= slo.tpot_s)
    return finished & (requests.ttft_s <= slo.ttft_s) & tpot_ok


def goodput_req_per_s(requests: pd.DataFrame, span_s: float, slo: SLO) -> float:
    """Requests meeting ``slo`` per second of ``span_s``; NaN for a span that is not > 0."""
    return int(meets_slo(requests, slo).sum()) / span_s if span_s > 0 else math.nan


OCCUPANCY_COLUMNS = ["time_s", "queued", "prefilling", "running"]
_STATE_AFTER = {
    "submit": "queued",
    "admit": "prefilling",
    "join": "running",
    "evict": None,
    "preempt": "queued",
}


def occupancy(events: pd.DataFrame, by: str = "time_s") -> pd.DataFrame:
    """Requests queued, prefilling and running (in the batch) over time, or over decode
    steps with ``by="step"`` (the counts after every event logged at step ``s`` are the
    rows of decode step ``s``: joins before its forward count, rows evicted or preempted
    before it do not). Every per-step quantity (``step_metrics``' batch size) comes from
    here.

    Each request moves between states by its events (in time order): ``submit`` and
    ``preempt`` -> queued, ``admit`` -> prefilling, ``join`` -> running, ``evict`` ->
    gone; a ``finish`` with reason ``abort`` while queued -> gone (an aborted prefilling
    request still joins and is evicted).

    Returns:
        One row per distinct event time (sorted) with ``OCCUPANCY_COLUMNS``: the counts
        after every event at that time. Example: submits at 0 and 1 s, the first admitted
        at 1 s and joined at 2 s gives rows ``(0, 1, 0, 0)``, ``(1, 1, 1, 0)``,
        ``(2, 1, 0, 1)``. With ``by="step"`` the first column is ``step`` instead.

    Raises:
        ValueError: for ``by`` other than ``time_s`` or ``step``.
    """
    if by not in ("time_s", "step"):
        raise ValueError(f"by must be 'time_s' or 'step', got {by!r}")
    ev = events[events.kind.isin([*_STATE_AFTER, "finish"])]
    ev = ev.sort_values(by, kind="stable") if by == "time_s" else ev  # the log is in step order already
    state: dict[int, str | None] = {}
    counts = {"queued": 0, "prefilling": 0, "running": 0}
    rows = []
    for kind, uid, t, reason in zip(ev.kind, ev.uid, ev[by], ev.finish_reason):
        if kind == "finish":
            if reason != "abort" or state.get(uid) != "queued":
                continue
            new = None
        else:
            new = _STATE_AFTER[kind]
        old = state.get(uid)
        if old:
            counts[old] -= 1
        if new:
            counts[new] += 1
        state[uid] = new
        rows.append((t, counts["queued"], counts["prefilling"], counts["running"]))
    columns = [by, *OCCUPANCY_COLUMNS[1:]]
    out = pd.DataFrame(rows, columns=columns)
    if by == "time_s":
        out["time_s"] = out.time_s.astype(float)
    return out.groupby(by, sort=True).last().reset_index()[columns]


def occupancy_at(occ: pd.DataFrame, times_s: Sequence[float]) -> pd.DataFrame:
    """The :func:`occupancy` state at each of ``times_s`` (the last row at or before it;
    zeros before the first event)."""
    idx = np.searchsorted(occ.time_s.to_numpy(), np.asarray(times_s, np.float64), side="right") - 1
    vals = np.where(idx[:, None] >= 0, occ[OCCUPANCY_COLUMNS[1:]].to_numpy()[np.maximum(idx, 0)], 0)
    out = pd.DataFrame(vals, columns=OCCUPANCY_COLUMNS[1:])
    out.insert(0, "time_s", np.asarray(times_s, np.float64))
    return out


def padding_waste_overall(padding_tokens: Sequence[int], kv_slots_tokens: Sequence[int]) -> float:
    """Share of all KV slots (rows x KV width, summed over decode steps) that held left
    padding: ``sum(padding) / sum(slots)``; 0.0 when there were no slots. Example: steps
    with (2 pads of 8 slots) and (0 of 4) give 2 / 12."""
    slots = float(np.sum(kv_slots_tokens))
    return float(np.sum(padding_tokens)) / slots if slots else 0.0


GAP_COLUMNS = ["uid", "from_s", "to_s", "gap_s"]


def token_gaps(events: pd.DataFrame) -> pd.DataFrame:
    """Inter-token latencies: one row per pair of consecutive token events of a request,
    with ``GAP_COLUMNS`` (``gap_s`` = ``to_s`` − ``from_s``, seconds). Their distribution
    is the ITL; ``tpot_s`` is their per-request mean.

    Example: tokens of uid 0 at 1.0, 1.5, 2.5 s give gaps 0.5 and 1.0 s.
    """
    tok = events[events.kind == "token"].sort_values(["uid", "time_s"], kind="stable")
    prev = tok.groupby("uid").time_s.shift()
    keep = prev.notna()
    return pd.DataFrame(
        {
            "uid": tok.uid[keep].astype(int).to_numpy(),
            "from_s": prev[keep].to_numpy(),
            "to_s": tok.time_s[keep].to_numpy(),
            "gap_s": (tok.time_s - prev)[keep].to_numpy(),
        },
        columns=GAP_COLUMNS,
    )
