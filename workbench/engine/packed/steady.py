"""The packed layout's steady state (every planned row decodes) planned and booked without
per-row objects: what :func:`~workbench.engine.packed.plan.plan_chunks` over
:meth:`~workbench.engine.packed.batch.PackedBatch.wants` gives there, in one pass over the rows.

At B = 128 the packed step's Python was 1.15-1.20x the padded step's on CUDA, its decode
step host-bound; the difference was per-row bookkeeping: a ``Want`` and a ``Chunk`` per row,
and maps rebuilt per step (``docs/packed.md``, eighteenth session). Here the decode plan
builds no ``Want`` and its ``Chunk`` s without the frozen dataclass's per-field
``object.__setattr__`` (:func:`decode_chunks`: the same fields, equal and hashed alike).

Example (rows uid 0 running, holding 5 of its 6 known tokens; uid 1 running with an unread
token, holding 3 of its 3 read ones)::

    decode_plan(rows, [5, 3], unread={1: 0}, budget=8)
      -> (Chunk(0, 5, 1, "decode"), Chunk(1, 3, 1, "decode"))
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from ...observe.packed import DECODE, Chunk
from ..state import RequestState, Status


def decode_chunks(uids: Iterable[int], starts: Iterable[int]) -> tuple[Chunk, ...]:
    """``Chunk(uid, start, 1, "decode")`` per ``(uid, start)`` pair, in order: equal to (and
    hashed as) those :class:`~workbench.observe.packed.Chunk` builds, made by one ``__dict__``
    update each instead of five ``object.__setattr__`` calls (the frozen dataclass's
    ``__init__``; a third of the time)."""
    new, out = object.__new__, []
    for uid, start in zip(uids, starts, strict=True):
        c = new(Chunk)
        c.__dict__.update(uid=uid, start=start, n_tokens=1, kind=DECODE, samples=True)
        out.append(c)
    return tuple(out)


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
    uids, starts = [], []
    finished, running = Status.FINISHED, Status.RUNNING
    for r, h in zip(rows, held, strict=True):
        status = r.status
        if status is finished:
            continue
        n, valid = len(r.tokens), r.valid
        if r.uid in unread:
            if n + 1 >= valid.request.max_tokens:
                continue  # its unread token is its last
            n += 1
        elif status is not running:  # joining: prefill to plan, unless it has none left
            if len(valid.prompt_ids) + n > h:
                return None
            continue
        if len(valid.prompt_ids) + n > h:
            uids.append(r.uid)
            starts.append(h)
    if len(uids) > budget:
        raise ValueError(f"{len(uids)} decoding rows but a token budget of {budget}")
    return decode_chunks(uids, starts)
