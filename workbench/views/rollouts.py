"""Sampled rollouts and their log-probs: what a policy-gradient trainer reads of each row.

Knows: per rollout its sampled tokens' log-probs and, per token, its top-k
``((id, log-prob), ...)`` best first (what ``Scheduler.request(uid)`` gives as
``logprobs`` and ``top_logprobs``), matplotlib. Must not know: the engine; every form is a
pure function of those numbers.

Text form (:func:`rollouts_text`): one line per rollout, log-probs in nats::

    rollout           tokens  sampled the top-1  mean log-prob  lowest log-prob
    uid 0 (seed 7)        16              9 / 16    -1.23 nats       -4.56 nats

Rich form (:func:`render_rollouts`): one panel per rollout over its generated tokens, the
log-prob of the sampled token as a line, and the band from the k-th best to the best
log-prob of that position, in the palette's colour of generated tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from . import style

SAMPLED = style.ATTENDED  # generated tokens
BAND_ALPHA = 0.2


def _arrays(view: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(logprobs [T], top [T, k])`` of a rollout (``top`` empty ``[T, 0]`` when no
    top-k was asked).

    Raises:
        ValueError: when the top-k lists do not give one list of equal length per token.
    """
    logprobs = np.asarray(view.logprobs, dtype=np.float64)
    tops = [[lp for _, lp in pairs] for pairs in view.top_logprobs] or [[] for _ in logprobs]
    if len(tops) != len(logprobs) or len({len(t) for t in tops}) > 1:
        raise ValueError(
            f"top_logprobs must give one equally long list per token: {len(logprobs)} tokens, "
            f"top-k lengths {sorted({len(t) for t in tops})}"
        )
    k = len(tops[0]) if tops else 0
    return logprobs, np.asarray(tops, dtype=np.float64).reshape(len(logprobs), k)


def rollouts_text(rollouts: Mapping[str, Any]) -> str:
    """One line per rollout (``label -> view`` with ``logprobs`` and ``top_logprobs``,
    e.g. a :class:`~workbench.engine.view.RequestView`): its tokens, how many sampled the
    position's best token (needs top-k), the mean and the lowest log-prob (nats).

    Raises:
        ValueError: as :func:`_arrays`.
    """
    w = max([len(label) for label in rollouts] + [len("rollout")])
    lines = [f"{'rollout':{w}s}  tokens  sampled the top-1  mean log-prob  lowest log-prob"]
    for label, view in rollouts.items():
        logprobs, top = _arrays(view)
        n = len(logprobs)
        top1 = f"{int(np.sum(logprobs >= top[:, 0])) if top.shape[1] else '-'} / {n}"
        mean = f"{logprobs.mean():.2f} nats" if n else "-"
        low = f"{logprobs.min():.2f} nats" if n else "-"
        lines.append(f"{label:{w}s}  {n:6d}  {top1:>17s}  {mean:>13s}  {low:>15s}")
    return "\n".join(lines)


def render_rollouts(rollouts: Mapping[str, Any], title: str | None = None, width_in: float = 9.4) -> Figure:
    """Rich form (see the module docstring): panels side by side on one log-prob axis,
    ``width_in`` inches wide in all (9.4: unscaled in a JupyterLab output area at 100 dpi).

    Raises:
        ValueError: for no rollouts, and as :func:`_arrays`.
    """
    if not rollouts:
        raise ValueError("render_rollouts needs at least one rollout")
    fig = Figure(figsize=(width_in, 3.0), layout="constrained")
    axes = fig.subplots(1, len(rollouts), sharey=True, squeeze=False)[0]
    k = 0
    for ax, (label, view) in zip(axes, rollouts.items()):
        logprobs, top = _arrays(view)
        pos = np.arange(len(logprobs))
        if top.shape[1]:
            k = top.shape[1]
            ax.fill_between(pos, top.min(axis=1), top.max(axis=1), color=SAMPLED, alpha=BAND_ALPHA, lw=0)
        ax.plot(pos, logprobs, color=SAMPLED, marker="o", ms=3, lw=1.2)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("generated token")
        if len(pos):
            style.integer_ticks(ax.xaxis, 0, len(pos) - 1, max_labels=6)
    axes[0].set_ylabel("log-prob (nats)")
    handles = [Line2D([], [], color=SAMPLED, marker="o", ms=3, label="the sampled token")]
    if k:
        handles.append(Patch(facecolor=SAMPLED, alpha=BAND_ALPHA, label=f"top-{k} range of its position"))
    fig.legend(
        handles=handles, loc="outside lower center", ncol=len(handles), fontsize="small", frameon=False
    )
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
