"""Speculative decoding in the packed layout: a verify forward is more tokens of the same
request in the ``[1, T]`` forward, and a row's rejected drafts leave its pages.

As vLLM runs a verify: a running row whose latest token ``t`` is not in its pages yet and
which drafted ``d_1 .. d_n`` feeds ``[t, d_1, .., d_n]`` at positions ``held .. held + n``,
each as its own one-token decode chunk (:func:`verify_chunks`), so the forward returns logits
at every position; :func:`position_logits` lays them out ``[G, 1 + K, V]`` for
:func:`workbench.engine.levers.speculative.decide`, and :func:`truncate` drops the rejected
drafts' pages. Why this is causal, and copy-on-write: ``docs/lab/engine-notes.md``,
"packed/verify.py".

Example (page_size 4, uid 0 holds 5 tokens in pages ``[0, 1]``, its 6th unheld, 3 drafts)::

    verify_chunks([Chunk(0, 5, 1, "decode")], {0: [7, 8, 9]})
      -> (Chunk(0, 5, 1, "decode"), Chunk(0, 6, 1, "decode"), Chunk(0, 7, 1, "decode"),
          Chunk(0, 8, 1, "decode"))          # pages [0, 1, 2] reserved by the forward
    accepted 1 -> truncate(batch, b, 7): held 7, page 2 back to the free list

Axis letters: ``T`` packed tokens, ``R`` sampled rows (a verify row once per position),
``G`` sampling rows, ``K`` most drafts of any row, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import mlx.core as mx

from ...observe.packed import DECODE, Chunk


def cap_drafts(drafts: Sequence[Sequence[int]], room: int) -> list[list[int]]:
    """Each row's drafts cut, in row order, to at most ``room`` tokens in all (as vLLM counts
    drafts against ``max_num_batched_tokens``).

    >>> cap_drafts([[1, 2, 3], [4, 5], [6]], 4)
    [[1, 2, 3], [4], []]
    """
    out = []
    for d in drafts:
        n = max(0, min(len(d), room))
        out.append(list(d[:n]))
        room -= n
    return out


def verify_chunks(chunks: Sequence[Chunk], drafts: Mapping[int, Sequence[int]]) -> tuple[Chunk, ...]:
    """``chunks`` with a one-token decode chunk per draft after its row's decode chunk, decode
    chunks first."""
    decode, rest = [], []
    for c in chunks:
        if c.kind != DECODE:
            rest.append(c)
            continue
        decode.append(c)
        decode += [Chunk(c.uid, c.start + j, 1, DECODE) for j in range(1, len(drafts.get(c.uid, ())) + 1)]
    return (*decode, *rest)


def observed_chunks(chunks: Sequence[Chunk]) -> tuple[Chunk, ...]:
    """:func:`verify_chunks`' chunks as the snapshot shows them: one ``1 + n``-token chunk per row.

    >>> [(c.uid, c.start, c.n_tokens) for c in observed_chunks(
    ...     [Chunk(0, 5, 1, "decode"), Chunk(0, 6, 1, "decode"), Chunk(1, 2, 1, "decode")])]
    [(0, 5, 2), (1, 2, 1)]
    """
    out: list[Chunk] = []
    for c in chunks:
        if out and out[-1].uid == c.uid and c.kind == DECODE and out[-1].end == c.start:
            out[-1] = Chunk(c.uid, out[-1].start, out[-1].n_tokens + c.n_tokens, DECODE)
        else:
            out.append(c)
    return tuple(out)


def forward_tokens(
    rows: Mapping[int, Any], chunks: Sequence[Chunk], drafts: Mapping[int, Sequence[int]]
) -> mx.array:
    """The tokens ``[T]`` uint32 of :func:`verify_chunks`' chunks (known inputs, then drafts)."""
    out: list[int] = []
    for c in chunks:
        r = rows[c.uid]
        known = r.n_inputs
        out += r.inputs_slice(c.start, min(c.end, known))
        out += list(drafts[c.uid][max(c.start, known) - known : c.end - known]) if c.end > known else []
    return mx.array(out, dtype=mx.uint32)


def sampling_groups(sampled: Sequence[int]) -> list[tuple[int, int]]:
    """``(row, positions)`` per sampling row from the forward's sampled rows ``[R]``.

    >>> sampling_groups([0, 0, 0, 2, 1, 1])
    [(0, 3), (2, 1), (1, 2)]
    """
    out: list[tuple[int, int]] = []
    for b in sampled:
        if out and out[-1][0] == b:
            out[-1] = (b, out[-1][1] + 1)
        else:
            out.append((b, 1))
    return out


def position_logits(logits: mx.array, groups: Sequence[tuple[int, int]]) -> mx.array:
    """The forward's ``logits`` ``[R, V]`` as ``[G, 1 + K, V]`` (``K >= 1``), each row's last
    position repeated past its drafts."""
    width = max([2, *(n for _, n in groups)])
    at, index = 0, []
    for _, n in groups:
        index.append([at + min(j, n - 1) for j in range(width)])
        at += n
    return logits[mx.array(index, dtype=mx.int32)]


def truncate(batch: Any, b: int, keep: int) -> list[int]:
    """Row ``b`` keeps ``keep`` tokens in its pages, the rest going back; returns pages freed."""
    batch.held[b] = min(batch.held[b], keep)
    table = batch.table
    return table.free(batch.rows[b].uid, keep=table.pages_for(batch.held[b]))
