"""Why decode batches well: what one decode step costs as the batch grows, from the
benchmark's stored frames (``runs.csv``: measured step times; ``roofline.csv``: bytes a step
reads). Every row of the batch reuses the same weight read, so the step time grows far more
slowly than the rows it serves.

Knows: the columns of ``runs.csv`` (``engine``, ``B``, ``step_s``, ``tok_per_s``) and
``roofline.csv`` (``case``, ``B``, ``bytes_per_step``, ``context_tokens``), matplotlib.
Must not know: the engines (nothing here runs a model).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .figures import OTHER_COLOUR, WORKBENCH_COLOUR

MIB = 2**20
KV_COLOUR = "#c44e9b"  # not a colour the views use for something else


def step_cost_table(runs: pd.DataFrame, roofline: pd.DataFrame, engine: str = "workbench") -> pd.DataFrame:
    """Per batch size ``B``: the median measured decode step (ms), tok/s, and the bytes one
    step reads (MiB), split into the weights (the same for every ``B``) and the KV cache.

    The weight bytes are the intercept of the roofline's ``bytes_per_step`` over ``B``
    (``bytes = weights + B * context * KV bytes per token``, exact for its decode rows).

    Returns:
        Columns ``B``, ``step_ms``, ``tok_per_s``, ``step_ms_per_row``, ``read_mib``,
        ``weights_mib``, ``kv_mib``, ``step_vs_B1`` (step time / the ``B = 1`` step).

    Raises:
        ValueError: when ``runs`` has no rows of ``engine`` or ``roofline`` fewer than two
            decode rows.
    """
    mine = runs[runs.engine == engine]
    decode = roofline[roofline.case.str.startswith("decode")].sort_values("B")
    if mine.empty or len(decode) < 2:
        raise ValueError(
            f"need runs of {engine!r} and two roofline decode rows; got {len(mine)} and {len(decode)}"
        )
    slope, weights = np.polyfit(decode.B.to_numpy(float), decode.bytes_per_step.to_numpy(float), 1)
    g = mine.groupby("B")
    out = pd.DataFrame({"step_ms": g.step_s.median() * 1e3, "tok_per_s": g.tok_per_s.median()}).reset_index()
    out["step_ms_per_row"] = out.step_ms / out.B
    out["weights_mib"] = weights / MIB
    out["kv_mib"] = slope * out.B / MIB
    out["read_mib"] = out.weights_mib + out.kv_mib
    out["step_vs_B1"] = out.step_ms / out.step_ms[out.B == out.B.min()].iloc[0]
    return out[
        ["B", "step_ms", "tok_per_s", "step_ms_per_row", "read_mib", "weights_mib", "kv_mib", "step_vs_B1"]
    ]


def step_cost_text(table: pd.DataFrame) -> str:
    """The table as aligned text: ms and MiB with one decimal, no e-notation."""
    lines = [
        f"{'B':>3} {'step ms':>8} {'ms per row':>10} {'tok/s':>7} {'read MiB':>9} {'of it KV':>9} {'step / B=1':>10}"
    ]
    lines += [
        f"{int(r.B):>3} {r.step_ms:>8.1f} {r.step_ms_per_row:>10.1f} {r.tok_per_s:>7.1f} {r.read_mib:>9.1f} "
        f"{r.kv_mib:>9.1f} {r.step_vs_B1:>10.2f}"
        for r in table.itertuples()
    ]
    return "\n".join(lines)


def render_step_cost(table: pd.DataFrame, title: str | None = None) -> Figure:
    """Two panels over ``B``: the measured decode step (ms; its time per row as a dashed
    line) and the bytes a step reads (MiB, weights and KV stacked)."""
    fig = Figure(figsize=(9, 3.8), layout="constrained")
    if title:
        fig.suptitle(title)
    left, right = fig.subplots(1, 2)
    x = np.arange(len(table))
    labels = [f"B = {b}" for b in table.B]
    left.bar(x, table.step_ms, 0.6, color=WORKBENCH_COLOUR, label="one decode step (all rows)")
    left.plot(x, table.step_ms_per_row, "k--o", label="the same per row")
    for i, r in enumerate(table.itertuples()):  # inside the bar: the per-row line starts at its top
        left.annotate(
            f"{r.step_ms:.0f} ms",
            (i, r.step_ms / 2),
            ha="center",
            va="center",
            fontsize="small",
            color="white",
            fontweight="bold",
        )
    left.set_xticks(x, labels)
    left.set_ylabel("ms")
    left.set_ylim(0, table.step_ms.max() * 1.2)
    left.set_title("measured decode step", fontsize="small", loc="left")
    left.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    right.bar(x, table.weights_mib, 0.6, color=OTHER_COLOUR, label="weights (read once per step)")
    right.bar(
        x, table.kv_mib, 0.6, bottom=table.weights_mib, color=KV_COLOUR, label="KV cache (grows with B)"
    )
    right.set_xticks(x, labels)
    right.set_ylabel("MiB read per step")
    right.set_ylim(0, table.read_mib.max() * 1.2)
    right.set_title("bytes one decode step reads (roofline)", fontsize="small", loc="left")
    right.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    return fig
