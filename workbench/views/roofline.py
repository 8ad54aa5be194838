"""The full roofline of a decode step: the memory roof (bytes a step reads, weights and the
KV term), the compute roof (its flops at the measured matmul rate), and the measured points
with their gap to the roof explained, from the benchmark's stored frames.

Knows: ``roofline.csv`` (``case``, ``B``, ``context_tokens``, ``bytes_per_step``,
``compute_tok_per_s``, ``workbench_tok_per_s``) and ``meta.csv`` (``copy_bandwidth_bytes_per_s``,
``matmul_flops_per_s``), as :mod:`workbench.bench.roofline` writes them. Must not know: the
engines (nothing here runs a model).

The model fitted from the frames (exact for the rows :mod:`workbench.bench.roofline` wrote)::

    bytes per step   = W + B * C * k          (W weight bytes, k KV bytes per token per row)
    flops per row    = f0 + C * a             (f0 = 2 x weight params, a attention flops per token)
    memory roof      = B * bandwidth / bytes per step       (tok/s; tends to bandwidth / (C k))
    compute roof     = flops_per_s / flops per row          (tok/s; the same for every B)
    attainable       = min(memory roof, compute roof)

A step's time on the roofs: ``memory_ms`` = bytes / bandwidth, ``compute_ms`` = B x flops per
row / flops_per_s; the roof assumes they overlap (the step takes the larger), a step that
does one and then the other takes their sum; ``rest_ms`` = measured - that sum is work
neither roof counts. KV reads equal the weights at ``B * C = W / k`` tokens.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from . import style

MIB = 2**20
COMPUTE = style.SERIES[3]  # the compute roof (a series colour: no cache meaning)
CONTEXTS = (28, 1024, 4096)  # context tokens per row drawn: the benchmark's decode rows, then long ones
CONTEXT_STYLES = ("-", "--", ":")
BATCHES = 2 ** np.arange(0, 10)  # B = 1 .. 512 on the figure's x axis
ROOF_COLUMNS = [
    "B",
    "context_tokens",
    "measured_tok_per_s",
    "memory_tok_per_s",
    "compute_tok_per_s",
    "attainable_tok_per_s",
    "share_of_roof",
    "measured_ms",
    "memory_ms",
    "compute_ms",
    "rest_ms",
    "weights_mib",
    "kv_mib",
]


class RooflineModel:
    """The fitted roofline of one model on one machine (module docstring): ``weight_bytes``
    (W), ``kv_bytes_per_token`` (k, per row), ``flops_per_row`` (f0), ``attention_flops``
    (a, per context token per row), ``bandwidth`` (bytes/s), ``flops_per_s``.

    Raises:
        ValueError: fewer than two decode rows in ``roofline``, or ``meta`` without the
            bandwidth or the matmul rate.
    """

    def __init__(self, roofline: pd.DataFrame, meta: pd.DataFrame):
        values = dict(zip(meta.key, meta.value))
        missing = [k for k in ("copy_bandwidth_bytes_per_s", "matmul_flops_per_s") if k not in values]
        decode = roofline[roofline.case.str.startswith("decode")]
        if missing or len(decode) < 2:
            raise ValueError(
                f"need two roofline decode rows and meta's {missing or 'rates'}; got {len(decode)} rows"
            )
        self.bandwidth = float(values["copy_bandwidth_bytes_per_s"])
        self.flops_per_s = float(values["matmul_flops_per_s"])
        rows = roofline.B.to_numpy(float) * roofline.context_tokens.to_numpy(float)
        kv, weights = np.polyfit(rows, roofline.bytes_per_step.to_numpy(float), 1)
        self.weight_bytes, self.kv_bytes_per_token = float(weights), float(kv)
        per_row = self.flops_per_s / roofline.compute_tok_per_s.to_numpy(float)
        contexts = roofline.context_tokens.to_numpy(float)
        if np.ptp(contexts) > 0:
            a, f0 = np.polyfit(contexts, per_row, 1)
        else:  # one context: no attention term to separate
            a, f0 = 0.0, float(per_row.mean())
        self.attention_flops, self.flops_per_row = float(a), float(f0)
        self.measured = decode[["B", "context_tokens", "workbench_tok_per_s"]].sort_values("B")

    def bytes_per_step(self, B, C):
        """Bytes one decode step of ``B`` rows at ``C`` context tokens reads (array-like ``B``)."""
        return self.weight_bytes + np.asarray(B, float) * C * self.kv_bytes_per_token

    def memory_tok_per_s(self, B, C):
        """The memory roof (tok/s): ``B`` tokens per read of :meth:`bytes_per_step` at the bandwidth."""
        return np.asarray(B, float) * self.bandwidth / self.bytes_per_step(B, C)

    def compute_tok_per_s(self, B, C):
        """The compute roof (tok/s), the same for every ``B`` (shaped like ``B``)."""
        return np.broadcast_to(
            self.flops_per_s / (self.flops_per_row + C * self.attention_flops), np.shape(B)
        )

    def kv_equals_weights_tokens(self) -> float:
        """``B * C`` (rows x context tokens) where a step's KV reads equal its weight reads."""
        return self.weight_bytes / self.kv_bytes_per_token

    def ridge_batch(self, C: float) -> float:
        """The ``B`` where the memory roof meets the compute roof at context ``C``; ``inf``
        where the memory roof stays below it for every ``B`` (the KV term caps it at
        ``bandwidth / (C k)`` tok/s)."""
        per_row = self.flops_per_row + C * self.attention_flops
        denominator = self.bandwidth * per_row - self.flops_per_s * C * self.kv_bytes_per_token
        return self.flops_per_s * self.weight_bytes / denominator if denominator > 0 else float("inf")

    def table(self) -> pd.DataFrame:
        """The measured points against both roofs, with ``ROOF_COLUMNS`` (module docstring;
        ``share_of_roof`` = measured / attainable)."""
        m = self.measured
        B, C = m.B.to_numpy(float), m.context_tokens.to_numpy(float)
        out = pd.DataFrame({"B": m.B.astype(int).to_numpy(), "context_tokens": C})
        out["measured_tok_per_s"] = m.workbench_tok_per_s.to_numpy(float)
        out["memory_tok_per_s"] = self.memory_tok_per_s(B, C)
        out["compute_tok_per_s"] = self.flops_per_s / (self.flops_per_row + C * self.attention_flops)
        out["attainable_tok_per_s"] = np.minimum(out.memory_tok_per_s, out.compute_tok_per_s)
        out["share_of_roof"] = out.measured_tok_per_s / out.attainable_tok_per_s
        out["measured_ms"] = 1e3 * B / out.measured_tok_per_s
        out["memory_ms"] = 1e3 * self.bytes_per_step(B, C) / self.bandwidth
        out["compute_ms"] = 1e3 * B / out.compute_tok_per_s
        out["rest_ms"] = out.measured_ms - out.memory_ms - out.compute_ms
        out["weights_mib"] = self.weight_bytes / MIB
        out["kv_mib"] = B * C * self.kv_bytes_per_token / MIB
        return out[ROOF_COLUMNS]


def roofline_text(model: RooflineModel) -> str:
    """The measured points against the roofs as aligned text, then the sentences that
    explain the gap, every number computed from ``model`` (deterministic for a stored run)."""
    t = model.table()
    head = "   B  measured  memory roof  compute roof  of roof | step ms = memory + compute + rest"
    lines = [head]
    for r in t.itertuples():
        lines.append(
            f"{r.B:4d}  {r.measured_tok_per_s:8.1f}  {r.memory_tok_per_s:11.1f}  {r.compute_tok_per_s:12.1f}"
            f"  {r.share_of_roof:7.0%} | {r.measured_ms:7.1f} = {r.memory_ms:6.1f} + {r.compute_ms:7.1f}"
            f" + {r.rest_ms:4.1f}"
        )
    lo, hi = (t.iloc[i] for i in (0, -1))
    lo_b, hi_b = int(lo.B), int(hi.B)
    cross = model.kv_equals_weights_tokens()
    lines += [
        "",
        f"A step reads {model.weight_bytes / MIB:,.0f} MiB of weights whatever B, and "
        f"{model.kv_bytes_per_token / 1024:,.0f} KiB of KV per context token per row: the KV reads",
        f"overtake the weights once B x context > {cross:,.0f} tokens (B = {hi_b} rows of "
        f"{cross / hi_b:,.0f} tokens).",
        f"The measured points reach {lo.share_of_roof:.0%} of the attainable roof at B = {lo_b} and "
        f"{hi.share_of_roof:.0%} at B = {hi_b}. The roof lets a step",
        "take only the larger of its read and its compute (both at full speed, overlapped);",
        f"at B = {hi_b} the read takes {hi.memory_ms:.1f} ms and the compute {hi.compute_ms:.1f} ms at the "
        "measured matmul rate,",
        f"so even done one after the other they explain {(hi.memory_ms + hi.compute_ms) / hi.measured_ms:.0%} "
        f"of the measured {hi.measured_ms:.1f} ms. The rest,",
        f"{lo.rest_ms:.1f} ms at B = {lo_b} to {hi.rest_ms:.1f} ms at B = {hi_b}, is work neither roof counts: "
        "Python and sampling per step,",
        "the masks and cache writes, and matmuls of few rows running below the square matmul's rate.",
    ]
    return "\n".join(lines)


def _rate_panel(ax, model: RooflineModel) -> None:
    for C, ls in zip(CONTEXTS, CONTEXT_STYLES):
        ax.plot(BATCHES, model.memory_tok_per_s(BATCHES, C), ls, color="black", label=f"memory roof, C={C}")
        ax.plot(BATCHES, model.compute_tok_per_s(BATCHES, C), ls, color=COMPUTE, label=f"compute roof, C={C}")
    t = model.table()
    ax.plot(
        t.B,
        t.measured_tok_per_s,
        "o",
        color=style.ATTENDED,
        label=f"measured (C={int(t.context_tokens[0])}), % of the roof",
    )
    for r in t.itertuples():
        ax.annotate(
            f"{r.share_of_roof:.0%}", (r.B, r.measured_tok_per_s), (6, -10), textcoords="offset points"
        )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    style.plain_log_axis(ax.yaxis, [line.get_ydata() for line in ax.lines])
    ax.set_xlabel("rows B")
    ax.set_ylabel("tokens / s")
    ax.set_title("tok/s under both roofs (C = context tokens per row)", fontsize="small", loc="left")
    ax.legend(fontsize="x-small", loc="lower right")


def _bytes_panel(ax, model: RooflineModel) -> None:
    ax.plot(
        BATCHES, np.full(len(BATCHES), model.weight_bytes / MIB), color=style.EXPIRED, lw=3, label="weights"
    )
    for C, ls in zip(CONTEXTS, CONTEXT_STYLES):
        ax.plot(
            BATCHES,
            BATCHES * C * model.kv_bytes_per_token / MIB,
            ls,
            color=style.ATTENDED,
            label=f"KV, C={C}",
        )
        cross = model.kv_equals_weights_tokens() / C
        if BATCHES[0] <= cross <= BATCHES[-1]:
            ax.plot(cross, model.weight_bytes / MIB, "o", color=style.ATTENDED, mfc="white")
            ax.annotate(
                f"B={cross:.0f}", (cross, model.weight_bytes / MIB), (4, 6), textcoords="offset points"
            )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.set_yscale("log")
    ax.set_xlabel("rows B")
    ax.set_ylabel("MiB read per decode step")
    ax.set_title("KV reads overtake the weights (o)", fontsize="small", loc="left")
    ax.legend(fontsize="x-small", loc="upper left")


def render_roofline(model: RooflineModel, title: str | None = None) -> Figure:
    """Two panels over ``B`` (log scales): tok/s under the memory roof (black) and the
    compute roof (purple) at each of ``CONTEXTS``, with the measured points (blue, labelled
    with their share of the attainable roof); and the bytes a step reads, the weights (flat)
    against the KV term per context, each crossing marked."""
    fig = Figure(figsize=(9.4, 4.2), layout="constrained")
    if title:
        fig.suptitle(title)
    left, right = fig.subplots(1, 2)
    _rate_panel(left, model)
    _bytes_panel(right, model)
    return fig
