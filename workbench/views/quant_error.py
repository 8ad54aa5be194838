"""Quantization error on one key vector: the float values a layer computed against what a
quantized KV cache (``Scheduler(kv_bits=...)``) gives back, group by group.

Knows: the affine format of ``mx.quantize`` as numpy arrays (packed ``uint32`` words, one
scale and one bias per group of ``group_size`` values), matplotlib. Must not know: the engine,
MLX (the caller converts the cache's arrays with ``np.array``).

A group of ``group_size`` values is stored as integers ``q`` in ``0 .. 2**bits - 1`` with one
``scale`` and one ``bias``; it reads back as ``scale * q + bias``: one of ``2**bits`` evenly
spaced levels from ``bias`` (``scale`` is negative, the levels counting down, when the
group's largest magnitude is its minimum). MLX puts ``bias`` on the group's edge of largest
magnitude and rounds the number of steps to the other edge, so the levels may stop short of
it: a value reads back off by at most one step, ``|scale|`` (plus float rounding), whatever
the values; a value inside the levels by at most half a step.

Text form (:func:`key_error_text`), one line per group::

    4-bit, groups of 32: 2 groups of key vector values
      head 0 (values 0-31): scale 0.1211 bias -1.795 | max |error| 0.0601 <= |scale| 0.1211, 0 of 32 over half a step

Rich form (:func:`render_key_error`): per group (a column) the float values (dots) on the
group's ``2**bits`` levels (faint lines) with the value read back (a bar from the level to
the dot is the error), and below, the error per value against half a step (shaded) and one step (dashed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from . import style

__all__ = ["dequantize", "group_errors", "key_error_text", "render_key_error", "unpack"]

ORIGINAL, READ_BACK = style.ATTENDED, style.FED


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """The integers of ``mx.quantize``'s packed words: ``[..., W]`` uint32 -> ``[..., W * 32 / bits]``
    int64, the lowest bits of a word first (MLX's order).

    Raises:
        ValueError: for ``bits`` not one of 2, 4, 8.
    """
    if bits not in (2, 4, 8):
        raise ValueError(f"bits must be 2, 4 or 8 (whole values per 32-bit word), got {bits}")
    words = np.asarray(packed, np.uint64)[..., None]
    shifts = np.arange(0, 32, bits, dtype=np.uint64)
    q = (words >> shifts) & np.uint64((1 << bits) - 1)
    return q.reshape(*q.shape[:-2], -1).astype(np.int64)


def dequantize(
    packed: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int, group_size: int
) -> np.ndarray:
    """``mx.dequantize`` (affine mode) in numpy: ``scale * q + bias`` per group.

    Args:
        packed: ``[..., D * bits / 32]`` uint32. scales, biases: ``[..., D / group_size]``.

    Returns:
        ``[..., D]`` float64.

    Raises:
        ValueError: when the groups do not divide the unpacked values.
    """
    q = unpack(packed, bits)
    D, G = q.shape[-1], np.shape(scales)[-1]
    if G * group_size != D:
        raise ValueError(f"{D} values need {D // group_size} groups of {group_size}, got {G} scales")
    s = np.repeat(np.asarray(scales, np.float64), group_size, axis=-1)
    b = np.repeat(np.asarray(biases, np.float64), group_size, axis=-1)
    return s * q + b


def group_errors(
    original: np.ndarray, quantized: Sequence[np.ndarray], bits: int, group_size: int
) -> list[dict]:
    """Per group of the flattened vectors: ``scale``, ``bias``, ``max_error`` (largest
    ``|original - read back|``), ``within_step`` (``max_error <= |scale|``, with a relative
    float tolerance of 1e-5 of the group's range) and ``over_half_step`` (values off by more
    than ``|scale| / 2``: beyond the last level).

    Args:
        original: ``[..., D]`` the float values before quantizing (the same shape unpacked).
        quantized: ``(packed, scales, biases)`` as :func:`dequantize` takes them (a cache's
            ``keys`` or ``mx.quantize``'s result, as numpy arrays).
    """
    packed, scales, biases = quantized
    x = np.asarray(original, np.float64).reshape(-1, group_size)
    back = dequantize(packed, scales, biases, bits, group_size).reshape(-1, group_size)
    s = np.asarray(scales, np.float64).reshape(-1)
    b = np.asarray(biases, np.float64).reshape(-1)
    err = np.abs(x - back)
    tol = 1e-5 * (np.abs(x).max(axis=1) + np.abs(s) * (2**bits - 1))
    return [
        dict(
            scale=float(s[g]),
            bias=float(b[g]),
            max_error=float(err[g].max()),
            within_step=bool(err[g].max() <= abs(s[g]) + tol[g]),
            over_half_step=int((err[g] > abs(s[g]) / 2 + tol[g]).sum()),
        )
        for g in range(len(s))
    ]


def key_error_text(original: np.ndarray, quantized, bits: int, group_size: int, labels=None) -> str:
    """Text form (the module docstring's example); ``quantized`` as :func:`group_errors`
    takes it; ``labels`` name the groups (default ``group 0``, ``group 1``, ...)."""
    rows = group_errors(original, quantized, bits, group_size)
    labels = labels or [f"group {g}" for g in range(len(rows))]
    lines = [f"{bits}-bit, groups of {group_size}: {len(rows)} group(s) of key vector values"]
    for g, (name, r) in enumerate(zip(labels, rows)):
        lines.append(
            f"  {name} (values {g * group_size}-{(g + 1) * group_size - 1}): scale {r['scale']:.4g} "
            f"bias {r['bias']:.4g} | max |error| {r['max_error']:.4g} "
            f"{'<=' if r['within_step'] else '>'} |scale| {abs(r['scale']):.4g}, "
            f"{r['over_half_step']} of {group_size} over half a step"
        )
    return "\n".join(lines)


def render_key_error(
    original: np.ndarray,
    quantized: Sequence[np.ndarray],
    bits: int,
    group_size: int,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    width_in: float = 9.2,
) -> Figure:
    """Per group a column: above, the float values (dots) over the group's ``2**bits`` levels
    (faint lines) and the level each reads back as (a bar from the level to the dot: the
    error); below, the error per value against ``± |scale| / 2`` (shaded) and ``± |scale|`` (dashed)."""
    x = np.asarray(original, np.float64).reshape(-1, group_size)
    back = dequantize(*quantized, bits, group_size).reshape(-1, group_size)
    rows = group_errors(original, quantized, bits, group_size)
    G = len(rows)
    labels = labels or [f"group {g}" for g in range(G)]
    fig = Figure(figsize=(width_in, 5.2), layout="constrained")
    if title:
        fig.suptitle(title, fontsize="medium")
    axes = fig.subplots(2, G, squeeze=False, height_ratios=[2.2, 1], sharex=True)
    dims = np.arange(group_size)
    for g, r in enumerate(rows):
        top, bottom = axes[0, g], axes[1, g]
        levels = r["bias"] + r["scale"] * np.arange(2**bits)
        if bits <= 4:
            top.hlines(levels, -0.5, group_size - 0.5, color=style.BORDER, linewidth=0.5)
        top.vlines(dims, back[g], x[g], color=style.BAD, linewidth=1.5)
        top.scatter(dims, back[g], marker="_", s=60, color=READ_BACK, zorder=3)
        top.scatter(dims, x[g], s=12, color=ORIGINAL, zorder=4)
        top.set_title(
            f"{labels[g]}: scale {r['scale']:.3g}, bias {r['bias']:.3g}"
            + (f", {2**bits} levels" if bits <= 4 else ""),
            fontsize="small",
            loc="left",
        )
        err = x[g] - back[g]
        half = abs(r["scale"]) / 2
        bottom.axhspan(-half, half, color=style.UNUSED)
        bottom.axhline(2 * half, color=style.EDGE, linestyle="--", linewidth=0.8)
        bottom.axhline(-2 * half, color=style.EDGE, linestyle="--", linewidth=0.8)
        bottom.bar(dims, err, color=style.BAD, width=0.7)
        bottom.set_ylim(-2.2 * half, 2.2 * half)
        bottom.set_xlabel("value index in the group")
        style.integer_ticks(bottom.xaxis, 0, group_size - 1, 9)
    axes[0, 0].set_ylabel("key value")
    axes[1, 0].set_ylabel("error (float - read back)")
    style.legend(
        fig,
        [
            ("float value (before quantizing)", ORIGINAL),
            ("read back (its level)", READ_BACK),
            ("error", style.BAD),
            ("± half a step (|scale| / 2); dashed: ± one step", style.UNUSED),
        ],
        ncol=4,
    )
    return fig
