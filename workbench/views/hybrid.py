"""One engine step of the padded layout in which a joining prompt prefills while running rows
decode: which forwards ran, in which order, with which rows and masks.

Knows: the event log (:mod:`workbench.observe.events`), a snapshot taken between ``admit()``
and ``step()``, :mod:`workbench.observe.forward_masks`, :func:`render_attention`. Must not
know: the scheduler, MLX.

The padded engine never mixes a prefill chunk and decode rows in one forward (the "hybrid"
batch of the textbook, which the packed layout builds): ``admit()`` runs the joiner's chunk
as its own ``[1, C]`` forward (at most one chunk per call with ``interleave_prefill``), a
prefilled group's last tokens as one ``[n, 1]`` join forward, and ``step()`` then runs the
running rows' ``[B, 1]`` decode forward. All of them carry the same step index in the log
(``Event.step``: decode steps completed before them). Text form (:func:`hybrid_text`)::

    step 1: 2 separate forwards, one after the other
      forward 1  prefill [1, 5]  uid 2: positions 0-4 of 13 prompt tokens
      forward 2  decode  [2, 1]  uids 0,1: one token each over 5 keys (KV width 4 + the fed token)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.figure import Figure

from ..observe.events import Event
from ..observe.forward_masks import ForwardMask, decode_forward, prefill_forwards
from ..observe.snapshot import Snapshot
from .attention import render_attention


@dataclass(frozen=True)
class HybridStep:
    """The forwards of one padded engine step (``admit()`` then ``step()``), in run order.

    Attributes:
        step: the step index (``Event.step`` of its events, ``Snapshot.step``).
        prefill: the prefill chunk forwards ``admit()`` ran at this step (``[B, N, S]`` masks).
        prompt_tokens: ``uid -> tokens to prefill`` (the ``admit`` event's ``n_tokens``) of
            each prefilling uid.
        joined: uids that joined at this step (one ``[n, 1]`` join forward; empty: none).
        decode: the ``[B, 1, S]`` decode forward ``step()`` ran (from the snapshot).
        decoded: uids that got a token at this step (the decode forward's rows).
    """

    step: int
    prefill: tuple[ForwardMask, ...]
    prompt_tokens: dict[int, int]
    joined: tuple[int, ...]
    decode: ForwardMask
    decoded: tuple[int, ...]

    @property
    def forwards(self) -> int:
        """How many model forwards the step ran (chunks, the join forward, the decode)."""
        return len(self.prefill) + bool(self.joined) + 1


def hybrid_step(events: Sequence[Event], snap: Snapshot) -> HybridStep:
    """What the padded engine ran at ``snap.step``: its prefill chunks (from the log), its
    join forward and its decode forward (from ``snap``, taken after ``admit()`` and before
    ``step()``).

    Raises:
        ValueError: when a uid that got a token at this step is not a row of ``snap`` (the
            snapshot is not the one taken before this step), or the step ran no decode.
    """
    at = [e for e in events if e.step == snap.step]
    decoded = tuple(e.uid for e in at if e.kind == "token")
    if not decoded:
        raise ValueError(f"step {snap.step}: no token events (run step() after the snapshot)")
    strangers = sorted(set(decoded) - set(snap.uids))
    if strangers:
        raise ValueError(
            f"step {snap.step}: uids {strangers} decoded but are not rows of the snapshot "
            f"(rows {list(snap.uids)}); take it after admit() and before step()"
        )
    first = next(i for i, e in enumerate(events) if e.step == snap.step)
    chunks = tuple(
        f
        for f in prefill_forwards(events)
        if f.first_event >= first and events[f.first_event].step == snap.step
    )
    prompt = {e.uid: e.n_tokens for e in events if e.kind == "admit"}
    return HybridStep(
        snap.step,
        chunks,
        {u: prompt[u] for f in chunks for u in f.uids if u in prompt},
        tuple(e.uid for e in at if e.kind == "join"),
        decode_forward(snap),
        decoded,
    )


def _lines(h: HybridStep) -> list[tuple[str, ForwardMask | None]]:
    """One ``(line, mask)`` per forward, in run order."""
    out: list[tuple[str, ForwardMask | None]] = []
    for f in h.prefill:
        B, N, S = f.shape
        last = f.n_cached + N - 1
        ids = ",".join(map(str, f.uids))
        of = ", ".join(f"{h.prompt_tokens[u]}" for u in f.uids if u in h.prompt_tokens)
        tail = f" of {of} prompt tokens" if of else ""
        out.append(
            (f"prefill [{B}, {N}]  uid{'s' if B > 1 else ''} {ids}: positions {f.n_cached}-{last}{tail}", f)
        )
    if h.joined:
        n = len(h.joined)
        out.append(
            (f"join    [{n}, 1]  uids {','.join(map(str, h.joined))}: each one's last prompt token", None)
        )
    B, _, S = h.decode.shape
    out.append(
        (
            f"decode  [{B}, 1]  uids {','.join(map(str, h.decode.uids))}: one token each over {S} keys "
            f"(KV width {S - 1} + the fed token)",
            h.decode,
        )
    )
    return out


def hybrid_text(h: HybridStep) -> str:
    """The step as text, one line per forward in run order (see the module docstring)."""
    lines = _lines(h)
    head = f"step {h.step}: " + (
        "1 forward" if len(lines) == 1 else f"{len(lines)} separate forwards, one after the other"
    )
    return "\n".join([head] + [f"  forward {i}  {line}" for i, (line, _) in enumerate(lines, 1)])


def render_hybrid(h: HybridStep, width_in: float = 9.0) -> Figure:
    """The step's masks (:func:`render_attention`), one panel per forward row, each titled
    ``forward i: ...`` in run order (the join forward, which has no drawn mask, is numbered
    and named in the title)."""
    drawn = [
        dataclasses.replace(f, label=f"forward {i} {list(f.shape[:2])}: {f.label}")
        for i, (_, f) in enumerate(_lines(h), 1)
        if f is not None
    ]
    title = (
        f"step {h.step}: {h.forwards} separate forwards (the padded engine does not mix prefill and decode)"
    )
    if h.joined:
        title += f"; the join forward of uids {','.join(map(str, h.joined))} ran between them"
    return render_attention(drawn, title=title, width_in=width_in)
