"""The packed layout's steady state (every planned row decodes) planned and booked without
per-row objects: what :func:`~workbench.engine.packed.plan.plan_chunks` over
:meth:`~workbench.engine.packed.batch.PackedBatch.wants` gives there, in one pass over the rows.

At B = 128 the packed step's Python was 1.15-1.20x the padded step's on CUDA, its decode
step host-bound; the difference was per-row bookkeeping: a ``Want`` and a ``Chunk`` per row,
and maps rebuilt per step (``docs/packed.md``, eighteenth session). Here the decode plan
builds no ``Want`` and its ``Chunk`` s without the frozen dataclass's per-field
``object.__setattr__`` (the same fields, equal and hashed alike), and the rows' lengths are
counted by C-level ``map(len, ...)`` rather than a Python call a row. Each function here is a
leaf (it calls no workbench function), so one decode step still reads in five files
(``docs/architecture.md``, ``tests/architecture/test_step_files.py``).

Example (rows uid 0 running, holding 5 of its 6 known tokens; uid 1 running with an unread
token, holding 3 of its 3 read ones)::

    decode_plan(rows, [5, 3], unread={1: 0}, budget=8)
      -> (Chunk(0, 5, 1, "decode"), Chunk(1, 3, 1, "decode"))
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from operator import add

from ...observe.packed import DECODE, Chunk
from ..state import RequestState, Status


def lengths(rows: Sequence[RequestState]) -> tuple[list[int], list[int]]:
    """``([B] prompt tokens, [B] generated tokens)`` of ``rows`` (their sum: ``n_inputs``), each
    by one C-level ``map(len, ...)`` rather than a Python call a row (tokens). No mlx-lm
    counterpart. Raises nothing."""
    return list(map(len, [r.valid.prompt_ids for r in rows])), list(map(len, [r.tokens for r in rows]))


def known_tokens(rows: Sequence[RequestState]) -> list[int]:
    """``[B]`` each row's known tokens (``n_inputs``: prompt plus generated), counted as
    :func:`lengths` counts them. No mlx-lm counterpart. Raises nothing."""
    return list(map(add, map(len, [r.valid.prompt_ids for r in rows]), map(len, [r.tokens for r in rows])))


def decode_plan(
    rows: Sequence[RequestState], held: Sequence[int], unread: Collection[int], budget: int
) -> tuple[Chunk, ...] | None:
    """The next forward's chunks when no row of the batch joins: ``plan_chunks(wants,
    budget, schedule)`` for any schedule (a schedule only orders prefill against decode),
    without the ``Want`` s; ``None`` when some unfinished row has prefill left (then the full
    plan runs). The caller makes sure no row follows a leader (``PackedBatch.follows`` empty).

    Args:
        rows: the batch's rows (``PackedBatch.rows``); held: ``[B]`` tokens in each row's pages.
        unread: uids whose latest token is launched but unread (they count it as known and
            decode; one at its ``max_tokens`` plans nothing).
        budget: most tokens the forward carries.

    Raises:
        ValueError: more decoding rows than ``budget`` (as ``plan_chunks``).
    """
    spans = []
    finished, running = Status.FINISHED, Status.RUNNING
    prompts, generated = map(len, [r.valid.prompt_ids for r in rows]), map(len, [r.tokens for r in rows])
    for r, h, p, n in zip(rows, held, prompts, generated, strict=True):
        status = r.status
        if status is finished:
            continue
        if r.uid in unread:
            if n + 1 >= r.valid.request.max_tokens:
                continue  # its unread token is its last
            n += 1
        elif status is not running:  # joining: prefill to plan, unless it has none left
            if p + n > h:
                return None
            continue
        if p + n > h:
            spans.append((r.uid, h))
    if len(spans) > budget:
        raise ValueError(f"{len(spans)} decoding rows but a token budget of {budget}")
    new, chunks = object.__new__, []
    for uid, start in spans:  # Chunk(uid, start, 1, "decode") without its __init__'s five setattrs
        c = new(Chunk)
        c.__dict__.update(uid=uid, start=start, n_tokens=1, kind=DECODE, samples=True)
        chunks.append(c)
    return tuple(chunks)
