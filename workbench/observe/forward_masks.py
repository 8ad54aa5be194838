"""2-D attention masks of the forwards the engine ran: query positions x key positions, per row.

Knows: the event log (:mod:`workbench.observe.events`), snapshots, mlx-lm's causal mask
formula. Must not know: MLX, the scheduler.

Axis letters: ``B`` rows of one forward, ``N`` query positions it feeds, ``S`` key
positions its queries see (the tokens cached before it plus its own ``N``).

A prefill forward of ``N`` tokens after ``c`` cached ones gets mlx-lm's
``create_causal_mask(N, offset=c)`` (what ``BatchKVCache.make_mask(N)`` gives a fresh,
right-padded group, and a single ``KVCache``'s ``"causal"``): query ``i`` (position
``c + i``) attends keys ``0 .. c + i``. A right-padded group runs its rows padded to the
longest; the pads come *after* each row's real tokens, so no real query reaches them.
Worked example, one row, a chunk of 3 after 2 cached tokens (``S = 5``)::

    q 2 | c c @ . .      c = cached key (an earlier forward), @ = the query's own key,
    q 3 | c c # @ .      # = a key of this forward, . = masked (a later position)
    q 4 | c c # # @

A decode step is ``N = 1`` per row over the KV width plus the fed token, with the left
padding masked (:func:`decode_forward`, from the snapshot's ``full`` group).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .events import Event
from .snapshot import Snapshot, frozen


def causal_mask(n_queries: int, n_cached: int = 0, left_padding: Sequence[int] | None = None) -> np.ndarray:
    """mlx-lm's ``create_causal_mask(N, offset=n_cached, left_padding=lp)`` in numpy.

    Args:
        n_queries: ``N``, tokens fed by the forward (>= 1).
        n_cached: tokens already in the cache before it.
        left_padding: ``[B]`` pad positions at the start of each row (``None``: none).

    Returns:
        ``[B, N, S]`` bool with ``S = n_cached + N`` (``B = 1`` without ``left_padding``).

    Raises:
        ValueError: for ``n_queries < 1`` or ``n_cached < 0``.

    >>> causal_mask(2, 1).astype(int).tolist()
    [[[1, 1, 0], [1, 1, 1]]]
    """
    if n_queries < 1 or n_cached < 0:
        raise ValueError(f"need n_queries >= 1 and n_cached >= 0, got {n_queries} and {n_cached}")
    keys = np.arange(n_cached + n_queries)
    queries = np.arange(n_cached, n_cached + n_queries)
    mask = queries[:, None] >= keys[None, :]
    lp = np.zeros(1, np.int64) if left_padding is None else np.asarray(left_padding, np.int64).reshape(-1)
    return mask[None] & (keys[None, None, :] >= lp[:, None, None])


@dataclass(frozen=True)
class ForwardMask:
    """The attention mask of one forward, with what its cells hold.

    Attributes:
        label: what the forward was (``prefill uids 0,1,2: tokens 0-4``, ``decode step 3``).
        uids: ``[B]`` uid of each row.
        mask: ``[B, N, S]`` bool, True where a query attends a key (what the layers get).
        n_cached: keys ``0 .. n_cached - 1`` were cached by earlier forwards.
        query_padding: ``[B, N]`` True for pad queries (computed, their output unused).
        key_padding: ``[B, S]`` True for key positions holding padding.
        first_event: index in the event log of the forward's first event (``-1``: from a
            snapshot).
    """

    label: str
    uids: tuple[int, ...]
    mask: np.ndarray
    n_cached: int
    query_padding: np.ndarray
    key_padding: np.ndarray
    first_event: int = -1

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(B, N, S)``."""
        return tuple(self.mask.shape)


def prefill_forwards(events: Sequence[Event]) -> list[ForwardMask]:
    """Every prefill forward of a log (full-attention layers), in order.

    One forward is a run of ``prefill`` events with distinct uids whose rows start at the
    same column (they advance together, right-padded to the longest row's chunk); a row's
    start is its prompt-cache hit (``admit``'s ``n_cached``) plus its earlier ``prefill``
    chunks. A row with no real token in a batched chunk (``n_tokens=0``: its prompt ended in
    an earlier chunk) rides in the forward all padding, its earlier chunks' padding columns
    in its keys.

    Returns:
        One :class:`ForwardMask` per forward: ``mask = causal_mask(N, n_cached)`` for
        every row, ``N`` the longest row's real tokens; a row's positions past its real
        tokens are padding.
    """
    cached: dict[int, int] = {}
    runs: list[list[tuple[int, Event, int]]] = []  # (event index, event, real tokens cached before it)
    column: list[int | None] = []  # each run's first column (None while it holds only padding rows)
    prev_kind = ""
    for i, e in enumerate(events):
        if e.kind == "admit":
            cached[e.uid] = e.n_cached
        if e.kind == "prefill":
            start = cached.get(e.uid, 0)
            run = runs[-1] if runs and prev_kind == "prefill" else None
            if (
                run is None
                or e.uid in {x.uid for _, x, _ in run}
                or (e.n_tokens and column[-1] is not None and column[-1] != start)
            ):
                runs.append([])
                column.append(None)
            runs[-1].append((i, e, start))
            if e.n_tokens and column[-1] is None:
                column[-1] = start
            cached[e.uid] = start + e.n_tokens
        prev_kind = e.kind
    return [
        _prefill_forward(run, max(x for _, _, x in run) if col is None else col)
        for run, col in zip(runs, column)
    ]


def _prefill_forward(run: list[tuple[int, Event, int]], n_cached: int) -> ForwardMask:
    first_index = run[0][0]
    real = np.array([e.n_tokens for _, e, _ in run])  # [B] real tokens per row
    n = max(int(real.max()), 1)
    B, S = len(run), n_cached + n
    query_padding = np.arange(n)[None, :] >= real[:, None]  # [B, N]
    key_padding = np.zeros((B, S), bool)
    for b, (_, _, row_cached) in enumerate(run):
        key_padding[b, row_cached:n_cached] = True  # padding columns of the row's earlier chunks
    key_padding[:, n_cached:] = query_padding
    uids = tuple(e.uid for _, e, _ in run)
    label = (
        f"prefill uid{'s' if B > 1 else ''} {','.join(map(str, uids))}: positions "
        f"{n_cached}-{n_cached + n - 1}" + (f", {n_cached} cached" if n_cached else "")
    )
    return ForwardMask(
        label,
        uids,
        frozen(np.repeat(causal_mask(n, n_cached), B, axis=0)),
        n_cached,
        frozen(query_padding),
        frozen(key_padding),
        first_index,
    )


def decode_forward(snap: Snapshot, group: str = "full") -> ForwardMask:
    """The next decode step's mask as a forward: one query per row (the fed token) over
    the group's KV width plus its own slot; the left padding is padding.

    Raises:
        KeyError: when the snapshot has no ``group`` (naming the groups it has).
    """
    g = snap.group(group)
    mask = np.asarray(g.mask, bool)  # [B, S]
    B, S = mask.shape
    key_padding = np.arange(S)[None, :] < np.asarray(g.left_padding)[:, None]
    return ForwardMask(
        f"decode step {snap.step}",
        tuple(snap.uids),
        frozen(mask[:, None, :]),
        S - 1,
        frozen(np.zeros((B, 1), bool)),
        frozen(key_padding),
    )
