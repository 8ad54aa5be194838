"""One iteration's chunks under the token budget: which tokens of which requests the next
packed forward carries.

Schedules (``schedule=``):

- ``"hybrid"`` (default; Sarathi-Serve's stall-free batches, vLLM's chunked prefill):
  every decoding row's next token first, then prefill chunks of the joining rows in row
  order until the budget is spent;
- ``"prefill-first"`` (vLLM v0 without chunked prefill's mixing): while any row has
  prefill left, the forward carries prefill chunks only (decodes stall);
- ``"decode-first"``: decode tokens only while any row decodes; a prefill runs only when
  no row decodes (a joiner waits for the batch to drain).

Example (budget 8; uid 0 decodes, uid 1 has 10 prompt tokens left)::

    plan_chunks([Want(0, 5, 6, True), Want(1, 0, 10, False)], 8)
      -> (Chunk(0, 5, 1, "decode"), Chunk(1, 0, 7, "prefill", samples=False))

Whole first chunks: ``docs/lab/engine-notes.md``, "packed/plan.py".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...observe.packed import DECODE, PREFILL, Chunk

SCHEDULES = ("hybrid", "prefill-first", "decode-first")


@dataclass(frozen=True)
class Want:
    """A request's work before a step: ``held`` tokens in pages of ``known`` known;
    ``decoding`` for a running row; ``first``: with nothing held, the exact tokens of its first
    chunk, run whole or not at all (quantized pages; ``0``: any chunk)."""

    uid: int
    held: int
    known: int
    decoding: bool
    first: int = 0


def plan_chunks(wants: Sequence[Want], budget: int, schedule: str = "hybrid") -> tuple[Chunk, ...]:
    """The chunks of the next packed forward (row order kept within decode and prefill).

    Args:
        wants: per unfinished request in the batch, its :class:`Want`.
        budget: most tokens the forward carries (``>=`` the decoding rows).
        schedule: one of :data:`SCHEDULES`.

    Raises:
        ValueError: an unknown schedule, or more decoding rows than ``budget``.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    decoding = [w for w in wants if w.decoding and w.known > w.held]
    joining = [w for w in wants if not w.decoding and w.known > w.held]
    if len(decoding) > budget:
        raise ValueError(f"{len(decoding)} decoding rows but a token budget of {budget}")
    if schedule == "prefill-first" and joining:
        decoding = []
    if schedule == "decode-first" and decoding:
        joining = []
    chunks = [Chunk(w.uid, w.held, 1, DECODE) for w in decoding]
    left = budget - len(chunks)
    for w in joining:
        if left <= 0:
            break
        n = min(w.known - w.held, left)
        if w.first and not w.held:  # its first forward whole, or it waits
            if w.first > left:
                continue
            n = w.first
        chunks.append(Chunk(w.uid, w.held, n, PREFILL, samples=w.held + n == w.known))
        left -= n
    if decoding and joining and len(chunks) == len(decoding):  # no prefill moved: a first chunk
        if any(w.first and not w.held and w.first <= budget for w in joining):  # fits without them
            return plan_chunks([w for w in wants if not w.decoding], budget, schedule)  # decodes wait once
    return tuple(chunks)
