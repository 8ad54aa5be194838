"""Why batch invariance breaks, drawn: one output of ``x @ W.T`` is a sum over ``K``
products, and float32 addition is not associative, so splitting that sum into blocks another
way gives other last bits. A matmul kernel picks its blocking from the shape, the number of
rows ``M`` included: row 0 alone (``M = 1``) and row 0 among 31 others may be summed in
different orders.

Knows: numpy float32 arithmetic, matplotlib. Must not know: the engine, MLX (the caller
passes the vectors as numpy arrays).

:func:`blocked_sum` sums ``x * w`` in a stated order: each block of ``block`` consecutive
products left to right, then the block sums left to right, every addition rounded to
float32. The blockings drawn are examples of orders a kernel may pick; which one a BLAS picks
is its own (``workbench.verify.invariance`` measures whether its results differ).

Text form (:func:`reduction_text`)::

    K = 128 products, summed in float32 in 2 orders:
      one running sum (block 128)  1 block(s)   sum 0.41740647 (bits 3ed5b5b8)
      blocks of 32                 4 block(s)   sum 0.41740650 (bits 3ed5b5b9)  1 ulp from the first

Rich form (:func:`render_reduction`): per order a lane of the ``K`` products, its blocks
shaded in turn, each block's partial sum written on it, the order's sum and its bits at the
right (its bits in hex).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from . import style

__all__ = ["blocked_sum", "reduction_text", "render_reduction", "ulps_apart"]


def blocked_sum(x: np.ndarray, w: np.ndarray, block: int) -> tuple[np.ndarray, np.float32]:
    """The products ``x * w`` (``[K]`` each, float32) summed in blocks of ``block``: each
    block left to right, then the block sums left to right, every addition in float32.

    Returns:
        ``(partials [ceil(K / block)], total)`` float32.

    Raises:
        ValueError: for ``block < 1`` or vectors of different lengths.
    """
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    if block < 1 or x.shape != w.shape or x.ndim != 1:
        raise ValueError(f"need block >= 1 and two [K] vectors, got block={block}, {x.shape} and {w.shape}")
    products = x * w
    partials = np.array(
        [np.cumsum(products[i : i + block], dtype=np.float32)[-1] for i in range(0, len(products), block)],
        np.float32,
    )
    return partials, np.cumsum(partials, dtype=np.float32)[-1]


def ulps_apart(a: np.float32, b: np.float32) -> int:
    """How many float32 values lie between ``a`` and ``b`` (0: the same bits; same sign)."""
    ia, ib = np.array([a, b], np.float32).view(np.int32)
    return abs(int(ia) - int(ib))


def _bits(v: np.float32) -> str:
    """The float32's 32 bits in hex, without ``0x`` (read as a memory address otherwise)."""
    return f"{int(np.array(v, np.float32).view(np.uint32)):08x}"


def _label(block: int, K: int) -> str:
    return f"one running sum (block {K})" if block >= K else f"blocks of {block}"


def reduction_text(x: np.ndarray, w: np.ndarray, blocks: Sequence[int]) -> str:
    """Text form (see the module docstring): per blocking, its blocks, its sum and bits, and
    how many float32 steps (ulps) it lies from the first blocking's sum."""
    K = len(x)
    sums = [blocked_sum(x, w, b) for b in blocks]
    width = max(len(_label(b, K)) for b in blocks)
    lines = [f"K = {K} products, summed in float32 in {len(blocks)} orders:"]
    for i, (b, (partials, total)) in enumerate(zip(blocks, sums)):
        line = f"  {_label(b, K):<{width}}  {len(partials)} block(s)  sum {total:.8f} (bits {_bits(total)})"
        if i:
            line += f"  {ulps_apart(sums[0][1], total)} ulp from the first"
        lines.append(line)
    return "\n".join(lines)


def render_reduction(
    x: np.ndarray, w: np.ndarray, blocks: Sequence[int], title: str | None = None, width_in: float = 9.2
) -> Figure:
    """Per blocking a lane of the ``K`` products (each a thin bar, its value's sign by
    colour), its blocks outlined and shaded in turn, each block's partial sum above it, the
    blocking's sum and bits at the right, and how far (ulps) it lies from the first's."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    K, products = len(x), x * w
    fig = Figure(figsize=(width_in, 1.3 * len(blocks) + 1.3), layout="constrained")
    if title:
        fig.suptitle(title, fontsize="medium")
    axes = fig.subplots(len(blocks), 1, squeeze=False, sharex=True)[:, 0]
    scale = float(np.abs(products).max()) or 1.0
    first = blocked_sum(x, w, blocks[0])[1]
    for ax, b in zip(axes, blocks):
        partials, total = blocked_sum(x, w, b)
        for j, start in enumerate(range(0, K, b)):
            end = min(start + b, K)
            ax.add_patch(
                Rectangle(
                    (start - 0.5, -1.05),
                    end - start,
                    2.1,
                    facecolor=style.UNUSED if j % 2 else style.LATER,
                    edgecolor=style.EDGE,
                )
            )
            if len(partials) > 1:
                ax.text(
                    (start + end - 1) / 2, 1.12, f"{partials[j]:+.4f}", ha="center", va="bottom", fontsize=7
                )
        ax.bar(
            np.arange(K),
            products / scale,
            width=0.8,
            color=np.where(products >= 0, style.ATTENDED, style.FED),
        )
        gap = ulps_apart(first, total)
        ax.set_title(
            f"{_label(b, K)}: sum {total:.8f} (bits {_bits(total)})"
            + (f", {gap} ulp from the first order" if b != blocks[0] else ""),
            fontsize="small",
            loc="left",
            color=style.BAD if gap else "black",
        )
        ax.set_ylim(-1.1, 1.6)
        ax.set_yticks([])
    axes[-1].set_xlim(-0.5, K - 0.5)
    axes[-1].set_xlabel("k (index of the product x[k] * w[k] in the sum over K)")
    style.legend(
        fig,
        [
            ("product >= 0", style.ATTENDED),
            ("product < 0", style.FED),
            ("a block (summed first)", style.UNUSED),
        ],
        ncol=3,
    )
    return fig
