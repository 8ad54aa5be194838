"""Runs of the same requests from one checkpoint, token by token: a continuation and the
same continuation after ``restore`` (or two forks), one line per run and uid, one cell per
generated token with its id written in it.

Knows: token ids per run and uid (``{label: {uid: sched.tokens(uid)}}``), how many tokens
each row had at the checkpoint, matplotlib. Must not know: the scheduler, MLX.

Text form (:func:`continuations_text`): per run after the first and per uid, ``|`` at the
checkpoint, ``=`` a token equal to the first run's at that position, ``x`` one that differs
(or that only one of the two runs has)::

    again uid 0 | 261 14 | = = = = = = = =  8/8 after the checkpoint equal
    again uid 2 | = = = x x x  3/6 after the checkpoint equal

(a uid that had no token at the checkpoint has no ``ids |`` part).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from . import style

Tokens = Mapping[str, Mapping[int, Sequence[int]]]
KEPT = style.UNUSED  # a token the row had generated before the checkpoint: part of its state
FIRST = style.ATTENDED  # the first run's generated tokens (the reference)


def same_tokens(reference: Sequence[int], row: Sequence[int]) -> list[bool]:
    """Per position up to the longer of the two: True where both have a token there and
    it is the same.

    >>> same_tokens([5, 6, 7], [5, 9])
    [True, False, False]
    """
    return [
        t < len(row) and t < len(reference) and row[t] == reference[t]
        for t in range(max(len(reference), len(row)))
    ]


def _later_runs(tokens: Tokens) -> list[tuple[str, int, list[bool]]]:
    """``(run, uid, same_tokens)`` of every run after the first, per uid of the first run.

    Raises:
        KeyError: a run lacks one of the first run's uids.
    """
    first = next(iter(tokens))
    return [
        (name, uid, same_tokens(ref, tokens[name][uid]))
        for name in list(tokens)[1:]
        for uid, ref in tokens[first].items()
    ]


def continuations_text(tokens: Tokens, kept: Mapping[int, int]) -> str:
    """Deterministic text form (see the module docstring): the first run of ``tokens`` is
    the reference; ``kept``: uid -> tokens the row had at the checkpoint.

    Raises:
        KeyError: a run lacks one of the first run's uids.
    """
    first = next(iter(tokens))
    lines = []
    for name, uid, same in _later_runs(tokens):
        k = kept.get(uid, 0)
        ids = " ".join(str(t) for t in tokens[first][uid][:k])
        marks = " ".join("=" if s else "x" for s in same[k:])
        head = f"{name} uid {uid} | " + (f"{ids} | " if k else "")
        lines.append(f"{head}{marks}  {sum(same[k:])}/{len(same) - k} after the checkpoint equal")
    return "\n".join(lines)


def _grid(tokens: Tokens) -> tuple[list[str], list[Sequence[int]], np.ndarray]:
    """Row labels, each row's ids, and ``[runs x uids, T]`` codes: 1 the first run's token,
    2 equal to it, 0 different (or missing where the first run has one), -1 no token."""
    first = next(iter(tokens))
    same = {(name, uid): s for name, uid, s in _later_runs(tokens)}
    labels, ids, codes = [], [], []
    for name, rows in tokens.items():
        for uid, row in rows.items():
            labels.append(f"{name}: uid {uid}")
            ids.append(list(row))
            codes.append([1] * len(row) if name == first else [2 if s else 0 for s in same[name, uid]])
    width = max(map(len, codes), default=1)
    grid = np.full((len(codes), width), -1)
    for i, row in enumerate(codes):
        grid[i, : len(row)] = row
    return labels, ids, grid


def render_continuations(tokens: Tokens, kept: Mapping[int, int], title: str | None = None) -> Figure:
    """Rich form: one line per run and uid, one cell per generated token (its id written
    in it): the first run's tokens blue, a later run's green where equal to the first
    run's token at that position, wine and hatched where not (an empty one: no token where
    the first run has one); the tokens each row had at
    the checkpoint (``kept``) light grey, a black line at the checkpoint; white past a
    row's end. A thick line between runs.

    Raises:
        KeyError: a run lacks one of the first run's uids.
    """
    labels, ids, grid = _grid(tokens)
    colours = {-1: style.LATER, 0: style.BAD, 1: FIRST, 2: style.GOOD}
    rgba = np.array([[to_rgba(colours[int(c)]) for c in row] for row in grid]).reshape(*grid.shape, 4)
    uids = [int(label.rsplit(" ", 1)[1]) for label in labels]
    for i, uid in enumerate(uids):
        rgba[i, : kept.get(uid, 0)] = to_rgba(KEPT)
    fig = Figure(figsize=(9.2, 0.36 * len(labels) + 1.7), layout="constrained")
    if title:
        fig.suptitle(title)
    ax = fig.subplots()
    ax.imshow(rgba, aspect="auto", interpolation="nearest")
    for (i, t), code in np.ndenumerate(grid):
        if code >= 0 and t < len(ids[i]):
            white = code in (0, 1) and t >= kept.get(uids[i], 0)
            ax.text(
                t,
                i,
                str(ids[i][t]),
                ha="center",
                va="center",
                fontsize="small",
                color="white" if white else "black",
            )
        if code == 0:
            ax.add_patch(Rectangle((t - 0.5, i - 0.5), 1, 1, fill=False, hatch=style.BAD_HATCH, linewidth=0))
    style.cell_borders(ax, grid.shape[1], len(labels))
    for i, uid in enumerate(uids):
        ax.vlines(kept.get(uid, 0) - 0.5, i - 0.5, i + 0.5, colors="black", linewidth=2.5)
    for edge in np.cumsum([len(rows) for rows in tokens.values()])[:-1]:
        ax.axhline(edge - 0.5, color=style.EDGE, linewidth=3)
    ax.set_yticks(range(len(labels)), labels)
    style.integer_ticks(ax.xaxis, 0, grid.shape[1] - 1)
    ax.set_xlabel("generated token (the number: its id; black line: the checkpoint)")
    first = next(iter(tokens))
    entries = [
        ("before the checkpoint (in it)", KEPT),
        (f"{first}", FIRST),
        (f"same token as {first}", style.GOOD),
    ]
    if (grid == 0).any():
        entries.append(("another token (or none)", style.BAD, style.BAD_HATCH))
    style.legend(fig, entries)
    return fig
