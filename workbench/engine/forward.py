"""One forward, described once and layout-neutral: what every lever of the forward reads.

Knows: nothing of the engine (plain data). Must not know: the model, the caches, the levers.

A :class:`Forward` lists the forward's *segments* in the order of its tokens: a row of the
padded layout's ``[B, L]`` batch, or a chunk of the packed layout's ``[1, T]`` forward. Per
segment it holds the request (uid), its adapter, the tokens its cache held before (its first
token's position), the tokens it feeds, whether it samples and how many drafted positions it
verifies. :meth:`workbench.engine.levers.forward.ForwardLevers.applied` installs every lever
a scheduler has configured from it; the forward itself then runs as the layout builds it::

    with levers.applied(Forward.of_rows(DECODE, batch.rows, held)):
        pending = launch(model, caches, tokens, ...)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PREFILL, JOIN, DECODE, VERIFY, PACKED = "prefill", "join", "decode", "verify", "packed"
KINDS = (PREFILL, JOIN, DECODE, VERIFY, PACKED)


@dataclass(frozen=True)
class Forward:
    """One model forward, segment by segment (all tuples have one entry per segment).

    Attributes:
        kind: ``"prefill"`` (a padded prefill chunk, ``[B, C]`` or ``[1, C]``), ``"join"`` (the
            ``[n, 1]`` forward of a prefilled group's last input tokens), ``"decode"``
            (``[B, 1]``), ``"verify"`` (a speculative ``[B, 1 + K]``) or ``"packed"`` (one
            ``[1, T]`` forward of chunks of any kind).
        uids: each segment's request.
        adapters: each segment's LoRA adapter name (``None``: the base model).
        held: tokens each segment's request held in its cache before this forward (its first
            token's position; a prefill chunk: its prompt tokens cached or prefilled so far).
        n_tokens: tokens each segment feeds (decode and join: 1; verify: ``1 + K``, the
            padded width; prefill: the prompt tokens it has left, of which the group's chunk
            length ``C`` runs at most; packed: the chunk's tokens).
        samples: whether the logits at the segment's last token are sampled.
        verifies: drafted positions the segment verifies (speculative; else 0).

    Raises:
        ValueError: from construction, an unknown ``kind`` or tuples of unequal lengths
            (naming the field and both lengths).
    """

    kind: str
    uids: tuple[int, ...]
    adapters: tuple[str | None, ...]
    held: tuple[int, ...]
    n_tokens: tuple[int, ...]
    samples: tuple[bool, ...]
    verifies: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r}: must be one of {', '.join(KINDS)}")
        n = len(self.uids)
        for name in ("adapters", "held", "n_tokens", "samples", "verifies"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name}: {len(getattr(self, name))} entries for {n} segments (uids)")

    @classmethod
    def of_rows(
        cls,
        kind: str,
        states: Sequence[Any],
        held: Sequence[int],
        n_tokens: int | Sequence[int] = 1,
        samples: bool = True,
        verifies: Sequence[int] | None = None,
    ) -> "Forward":
        """A padded forward of ``states`` (request states or batch rows: ``uid`` and
        ``valid.request.adapter``), one segment per row; ``held``: ``[B]`` tokens each row's
        cache held before it; ``n_tokens``: per row or one for all."""
        rows = len(states)
        width = [n_tokens] * rows if isinstance(n_tokens, int) else list(n_tokens)
        return cls(
            kind,
            tuple(s.uid for s in states),
            tuple(s.valid.request.adapter for s in states),
            tuple(held),
            tuple(width),
            (samples,) * rows,
            tuple(verifies) if verifies is not None else (0,) * rows,
        )

    @classmethod
    def of_chunks(
        cls,
        chunks: Sequence[Any],
        adapter_of: Mapping[int, str | None],
        drafts: Mapping[int, Sequence[int]] | None = None,
    ) -> "Forward":
        """A packed ``[1, T]`` forward of ``chunks`` (:class:`workbench.observe.packed.Chunk`:
        ``uid``, ``start``, ``n_tokens``, ``samples``); ``adapter_of``: uid -> adapter name;
        ``drafts``: uid -> the drafts verified after its row's first decode chunk (each draft
        a one-token chunk of its own, :func:`workbench.engine.packed.verify.verify_chunks`).

        Raises:
            KeyError: a chunk's uid missing from ``adapter_of``.
        """
        drafts, first = drafts or {}, set()
        verifies = []
        for c in chunks:
            verifies.append(0 if c.uid in first else len(drafts.get(c.uid, ())))
            first.add(c.uid)
        return cls(
            PACKED,
            tuple(c.uid for c in chunks),
            tuple(adapter_of[c.uid] for c in chunks),
            tuple(c.start for c in chunks),
            tuple(c.n_tokens for c in chunks),
            tuple(bool(c.samples) for c in chunks),
            tuple(verifies),
        )

    def token_adapters(self) -> list[str | None]:
        """``[T]``: each token's adapter name, segments in order (a padded forward's rows
        counted ``n_tokens`` each)."""
        return [a for a, n in zip(self.adapters, self.n_tokens) for _ in range(n)]

    def token_positions(self) -> list[int]:
        """``[T]``: each token's position in its request (``held + j``)."""
        return [h + j for h, n in zip(self.held, self.n_tokens) for j in range(n)]

    def sampling(self) -> list[int]:
        """The indices of the segments that sample, in order."""
        return [i for i, s in enumerate(self.samples) if s]
