"""The packed layout as data: one iteration's packed tokens, its block-diagonal causal
mask, the page table, and the token budget split into decode and prefill tokens.

Knows: what :class:`workbench.engine.packed.batch.PackedBatch` shows of itself between
engine calls (plain ints and tuples). Must not know: MLX, the model, the scheduler.
The engine builds its attention mask with :func:`packed_mask` too, so what a view draws
is what the forward used.

Glossary. A *chunk* is one request's consecutive tokens in one packed forward: a
running row's next token (``decode``, 1 token) or a slice of a joining row's prompt
(``prefill``). The forward's ``T`` query tokens are the chunks' tokens in order; its
``S`` key positions are, chunk by chunk, the request's whole context after the step
(its cached pages, then the chunk's own tokens). Token ``t`` of request ``r`` at
position ``p`` attends key ``s`` iff ``s`` belongs to ``r`` and sits at a position
``<= p``: block-diagonal over requests, causal inside each block.

Worked example (uid 0 decodes its 4th token, uid 1 prefills its first 3 tokens)::

    chunks = (Chunk(0, 3, 1, "decode"), Chunk(1, 0, 3, "prefill"))
    keys:          uid0 p0 p1 p2 p3 | uid1 p0 p1 p2
    t0 uid0 p3        #  #  #  #    |   .  .  .
    t1 uid1 p0        .  .  .  .    |   #  .  .
    t2 uid1 p1        .  .  .  .    |   #  #  .
    t3 uid1 p2        .  .  .  .    |   #  #  #

Axis letters: ``T`` packed query tokens of one forward, ``S`` key positions it reads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DECODE, PREFILL = "decode", "prefill"


@dataclass(frozen=True)
class Chunk:
    """One request's tokens in one packed forward.

    Attributes:
        uid: the request. start: position (tokens already in its pages) of the chunk's
        first token. n_tokens: tokens in the chunk (``>= 1``). kind: ``"decode"`` (a
        running row's next token) or ``"prefill"``. samples: the chunk ends the request's
        known tokens, so the logits at its last token give its next token.
    """

    uid: int
    start: int
    n_tokens: int
    kind: str
    samples: bool = True

    @property
    def end(self) -> int:
        """Tokens of the request in pages after the step (``start + n_tokens``)."""
        return self.start + self.n_tokens


@dataclass(frozen=True)
class PackedState:
    """The packed layout between two engine calls (a :class:`Snapshot` field).

    Attributes:
        page_size: token positions per page. page_bytes: bytes one page holds over all
            layers (keys and values). capacity_pages: pages the pools allocate.
        pages: ``(uid, page ids)`` per request holding pages, row order (its page table).
        free_pages: page ids on the free list, the next one handed out first.
        held_tokens: ``(uid, tokens in its pages)`` per request holding pages.
        last_chunks: the chunks of the latest packed forward (``()`` before the first).
        token_budget: most tokens one packed forward carries (``max_num_batched_tokens``).
        cached_pages: with prefix caching, the pages no request holds that keep a cached
            prefix, least recently used first (``None``: prefix caching off).
        paced_tokens: with pacing (``Scheduler(pacing=...)``), most tokens the time budget
            let the latest forward carry (``<= token_budget``; ``None``: pacing off).
        predicted_s: with pacing, that forward's predicted seconds (``None``: unknown/off).
        time_budget_s: with pacing, its time budget in seconds (``inf``: no running row).
    """

    page_size: int
    page_bytes: int
    capacity_pages: int
    pages: tuple[tuple[int, tuple[int, ...]], ...] = ()
    free_pages: tuple[int, ...] = ()
    held_tokens: tuple[tuple[int, int], ...] = ()
    last_chunks: tuple[Chunk, ...] = ()
    token_budget: int = 0
    cached_pages: tuple[int, ...] | None = None
    paced_tokens: int | None = None
    predicted_s: float | None = None
    time_budget_s: float | None = None

    @property
    def used_pages(self) -> int:
        """Distinct pages held by requests (a page shared by several counted once)."""
        return len({p for _, pages in self.pages for p in pages})

    @property
    def shared_pages(self) -> tuple[int, ...]:
        """Pages held by more than one request, sorted."""
        counts = Counter(p for _, pages in self.pages for p in pages)
        return tuple(sorted(p for p, n in counts.items() if n > 1))

    @property
    def held_bytes(self) -> int:
        """Bytes the requests' pages hold: ``used_pages * page_bytes``."""
        return self.used_pages * self.page_bytes

    @property
    def cached_bytes(self) -> int:
        """Bytes of the cached pages: ``len(cached_pages) * page_bytes``."""
        return len(self.cached_pages or ()) * self.page_bytes

    @property
    def token_bytes(self) -> int:
        """Bytes of the tokens held (``sum held_tokens * page_bytes / page_size``)."""
        return sum(n for _, n in self.held_tokens) * self.page_bytes // self.page_size

    def text(self) -> str:
        """ASCII form: the page table, the latest forward's chunks (and with pacing, its
        time budget: :func:`pacing_text`)."""
        paced = pacing_text(self)
        return "\n".join(
            [page_table_text(self), chunks_text(self.last_chunks, self.token_budget)] + [paced] * bool(paced)
        )


def packed_layout(chunks: Sequence[Chunk]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The packed forward's token and key order.

    Returns:
        ``(query_uid [T], query_pos [T], key_uid [S], key_pos [S])`` int64: per packed
        token its request and position; per key position its request and position (each
        chunk's request's positions ``0 .. end - 1``, chunk by chunk).

    Raises:
        ValueError: a request in two chunks, or a chunk of fewer than one token.
    """
    uids = [c.uid for c in chunks]
    if len(set(uids)) != len(uids):
        raise ValueError(f"a packed forward holds one chunk per request, got uids {uids}")
    if any(c.n_tokens < 1 or c.start < 0 for c in chunks):
        raise ValueError(f"every chunk needs n_tokens >= 1 and start >= 0, got {list(chunks)}")
    qu = np.concatenate([np.full(c.n_tokens, c.uid) for c in chunks]) if chunks else np.zeros(0, np.int64)
    qp = np.concatenate([np.arange(c.start, c.end) for c in chunks]) if chunks else np.zeros(0, np.int64)
    ku = np.concatenate([np.full(c.end, c.uid) for c in chunks]) if chunks else np.zeros(0, np.int64)
    kp = np.concatenate([np.arange(c.end) for c in chunks]) if chunks else np.zeros(0, np.int64)
    return qu.astype(np.int64), qp.astype(np.int64), ku.astype(np.int64), kp.astype(np.int64)


def packed_mask(chunks: Sequence[Chunk]) -> np.ndarray:
    """``[T, S]`` bool: packed token ``t`` attends key ``s`` (see the module docstring;
    the example there is ``packed_mask((Chunk(0, 3, 1, "decode"), Chunk(1, 0, 3, "prefill")))``)."""
    qu, qp, ku, kp = packed_layout(chunks)
    return (qu[:, None] == ku[None, :]) & (kp[None, :] <= qp[:, None])


def mask_text(chunks: Sequence[Chunk]) -> str:
    """The packed mask as an ASCII grid: one line per packed token (``uid@position``),
    ``#`` attended, ``.`` not, ``|`` between requests' key blocks."""
    if not chunks:
        return "(no packed forward yet)"
    mask = packed_mask(chunks)
    qu, qp, ku, _ = packed_layout(chunks)
    cuts = set(np.flatnonzero(np.diff(ku)) + 1)
    lines = [
        f"packed mask: T={mask.shape[0]} tokens x S={mask.shape[1]} keys ('#' attended, '|' request blocks)"
    ]
    for t in range(mask.shape[0]):
        cells = "".join(
            ("|" if s in cuts else "") + ("#" if mask[t, s] else ".") for s in range(mask.shape[1])
        )
        lines.append(f"  {f'{qu[t]}@{qp[t]}':>8} {cells}")
    return "\n".join(lines)


def page_table_text(state: PackedState) -> str:
    """The page table: one line per request (uid, tokens, pages; a page shared with
    another request marked ``*``), then the free list and, with prefix caching, the cached
    pages. Example line: ``uid 3: 9 tokens in pages [0*, 1*, 4]``."""
    held, shared = dict(state.held_tokens), set(state.shared_pages)
    lines = [
        f"page table: {state.used_pages}/{state.capacity_pages} pages of {state.page_size} tokens "
        f"({state.page_bytes:,} bytes each): {state.held_bytes:,} bytes held, "
        f"{state.token_bytes:,} bytes of tokens"
    ]
    for uid, pages in state.pages:
        ids = ", ".join(f"{p}{'*' if p in shared else ''}" for p in pages)
        lines.append(f"  uid {uid}: {held.get(uid, 0)} tokens in pages [{ids}]")
    lines.append(f"  free pages: {list(state.free_pages)}")
    if state.cached_pages is not None:
        lines.append(
            f"  cached pages (least recently used first): {list(state.cached_pages)} "
            f"({state.cached_bytes:,} bytes); * shared: {len(shared)} page(s)"
        )
    return "\n".join(lines)


def chunks_text(chunks: Sequence[Chunk], token_budget: int = 0) -> str:
    """One forward's chunks and its token budget split: ``decode d + prefill p = T``."""
    split = budget_split(chunks)
    head = (
        f"packed forward: decode {split['decode_tokens']} + prefill {split['prefill_tokens']} = "
        f"{split['tokens']} tokens"
    )
    lines = [head + (f" of a {token_budget} budget" if token_budget else "")]
    for c in chunks:
        lines.append(
            f"  uid {c.uid}: {c.kind} positions {c.start}..{c.end - 1}{' -> samples' if c.samples else ''}"
        )
    return "\n".join(lines)


def pacing_text(state: PackedState) -> str:
    """With pacing, one line on the latest forward's time budget, e.g. ``paced: at most 40
    tokens, predicted 9.1 ms of a 12.0 ms budget``; ``""`` with pacing off."""
    if state.paced_tokens is None:
        return ""
    ms = lambda s: "unknown" if s is None else f"{s * 1e3:.1f} ms"  # noqa: E731
    budget = (
        "no time budget (no running row)"
        if state.time_budget_s == float("inf")
        else f"a {ms(state.time_budget_s)} budget"
    )
    return f"paced: at most {state.paced_tokens} tokens, predicted {ms(state.predicted_s)} of {budget}"


def budget_split(chunks: Sequence[Chunk]) -> dict[str, int]:
    """``{"decode_tokens", "prefill_tokens", "tokens"}`` of one forward's chunks."""
    d = sum(c.n_tokens for c in chunks if c.kind == DECODE)
    p = sum(c.n_tokens for c in chunks if c.kind != DECODE)
    return {"decode_tokens": d, "prefill_tokens": p, "tokens": d + p}


@dataclass(frozen=True)
class BudgetRow:
    """One packed forward's budget use: ``step`` (decode steps completed after it),
    ``decode_tokens``, ``prefill_tokens``, ``budget_tokens``; with pacing ``paced_tokens``
    (the cap its time budget set), ``predicted_s`` and ``time_budget_s`` (seconds), else ``None``."""

    step: int
    decode_tokens: int
    prefill_tokens: int
    budget_tokens: int = field(default=0)
    paced_tokens: int | None = None
    predicted_s: float | None = None
    time_budget_s: float | None = None


def budget_rows(snapshots: Sequence) -> list[BudgetRow]:
    """Per distinct packed forward in ``snapshots`` (a scheduler's history, oldest first;
    snapshots without ``packed`` skipped), its token budget split."""
    out: list[BudgetRow] = []
    seen = None
    for snap in snapshots:
        packed = getattr(snap, "packed", None)
        if packed is None or not packed.last_chunks or (snap.step, packed.last_chunks) == seen:
            continue
        seen = (snap.step, packed.last_chunks)
        split = budget_split(packed.last_chunks)
        out.append(
            BudgetRow(
                snap.step,
                split["decode_tokens"],
                split["prefill_tokens"],
                packed.token_budget,
                packed.paced_tokens,
                packed.predicted_s,
                packed.time_budget_s,
            )
        )
    return out
