"""One forward of either layout: described once, run with its levers, its logits sampled lazily.

- :class:`Forward` lists the forward's *segments* in token order (a row of the padded ``[B, L]``
  batch, or a chunk of the packed ``[1, T]`` forward): request, adapter, position, tokens fed,
  whether it samples, drafted positions verified.
- :meth:`ForwardLevers.applied` installs every configured lever (LoRA, batch-invariant mode,
  quantized attention path, decode fast paths) from that description; every forward site enters
  it, none stacks the levers by hand.
- :func:`launch` runs a padded ``[B, 1]`` decode forward and :func:`sample_pending` samples any
  forward's logits ``[B, V]`` into a lazy :class:`Pending`, evaluated with ``mx.async_eval``
  while Python reads the previous step (mirrors mlx-lm's ``GenerationBatch._step``).

::

    with levers.applied(Forward.of_rows(DECODE, batch.rows, held), batch.caches):
        pending = launch(model, caches, tokens, ...)
    tokens, logprobs, finite = pending.read()

Axis letters: ``B`` rows, ``V`` vocabulary. Which lever reads which field:
``docs/lab/engine-notes.md``, "forward.py".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import mlx.core as mx

from .levers.fastpath import FastDecode, decode_fast_path
from .levers.invariant import Invariance, invariant_forward
from .levers.invariant_packed import packed_invariant_forward
from .levers.lora import AdapterBank, selected
from .levers.quantized_attention import attention_path
from .sampling import RowSampler, TokenCheck, sample_rows
from .top_logprobs import TopArrays, TopPairs, arrays_of, read_top, top_arrays

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
            token's position).
        n_tokens: tokens each segment feeds (decode and join: 1; verify: ``1 + K``).
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
        """A padded forward, one segment per row of ``states`` (``uid``, ``valid.request.adapter``)."""
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
        """A packed ``[1, T]`` forward of ``chunks`` (:class:`workbench.observe.packed.Chunk`);
        ``adapter_of``: uid -> adapter; ``drafts``: uid -> drafts verified after its first chunk.

        Raises:
            KeyError: a chunk's uid missing from ``adapter_of``.
        """
        first, verifies = set(), []
        for c in chunks if drafts else ():
            verifies.append(0 if c.uid in first else len(drafts.get(c.uid, ())))
            first.add(c.uid)
        uids = tuple([c.uid for c in chunks])
        return cls(
            PACKED,
            uids,
            tuple(map(adapter_of.__getitem__, uids)),
            tuple([c.start for c in chunks]),
            tuple([c.n_tokens for c in chunks]),
            tuple([bool(c.samples) for c in chunks]),
            tuple(verifies) if drafts else (0,) * len(uids),
        )

    def token_adapters(self) -> list[str | None]:
        """``[T]``: each token's adapter name, segments in order."""
        return [a for a, n in zip(self.adapters, self.n_tokens) for _ in range(n)]

    def token_positions(self) -> list[int]:
        """``[T]``: each token's position in its request (``held + j``)."""
        return [h + j for h, n in zip(self.held, self.n_tokens) for j in range(n)]

    def sampling(self) -> list[int]:
        """The indices of the segments that sample, in order."""
        return [i for i, s in enumerate(self.samples) if s]


class _Span(NamedTuple):
    """A segment as the packed per-token adapter selection reads a chunk."""

    uid: int
    n_tokens: int


@dataclass(frozen=True)
class ForwardLevers:
    """Every lever a scheduler configured for its forwards, installed by :meth:`applied`.

    Args:
        model: the mlx-lm model instance (hooks are set on it alone).
        adapters: the LoRA bank (``None``: none loaded).
        invariant: the batch-invariant mode (``None``: off).
        quantized_attention: ``"dequantize"``, ``"quantized_matmul"`` or ``None`` (float cache, pages).
        fast_decode: the decode fast paths allowed (``None``: none).
        select_tokens: the packed layout's per-token adapter selection
            (:func:`workbench.engine.packed.adapters.selected_tokens`), for packed forwards with adapters.
    """

    model: Any
    adapters: AdapterBank | None = None
    invariant: Invariance | None = None
    quantized_attention: str | None = None
    fast_decode: FastDecode | None = None
    select_tokens: Callable[..., Any] | None = None

    @contextlib.contextmanager
    def applied(self, forward: Forward, caches: Any = None) -> Iterator[str]:
        """Within the block, a forward built on :attr:`model` runs as ``forward`` describes with
        every configured lever; restored after, also on an exception. ``caches``: a padded
        decode's batch caches (for the fast paths). Yields the fast paths on (``""``: none).

        Raises:
            ValueError: a packed forward with adapters and no :attr:`select_tokens`.
        """
        with contextlib.ExitStack() as stack:
            if forward.kind == PACKED:
                if self.adapters is not None and self.select_tokens is None:
                    raise ValueError(
                        "select_tokens: a packed forward with adapters needs the per-token selection"
                    )
                if self.adapters is not None:
                    spans = [_Span(u, n) for u, n in zip(forward.uids, forward.n_tokens)]
                    adapter_of = dict(zip(forward.uids, forward.adapters))
                    stack.enter_context(self.select_tokens(self.adapters, spans, adapter_of))
                if self.invariant is not None:
                    stack.enter_context(packed_invariant_forward(self.model, self.invariant))
                yield ""
                return
            stack.enter_context(selected(self.adapters, forward.adapters))
            if forward.kind != PREFILL:
                stack.enter_context(invariant_forward(self.model, self.invariant, forward.held))
            stack.enter_context(attention_path(self.model, self.quantized_attention))
            path = ""
            if forward.kind == DECODE and caches is not None and self.fast_decode is not None:
                path = stack.enter_context(
                    decode_fast_path(self.model, caches, forward.held, self.fast_decode)
                )
            yield path


@dataclass
class Pending:
    """Lazy results of one forward's sampling, aligned with the rows it ran for.

    Attributes:
        tokens: ``[B]`` uint32, each row's sampled next token.
        logprobs: ``[B]`` float32, the log-probability of that token.
        finite: ``[B]`` bool, False where the processed logits held NaN, +inf or all -inf.
        errors: row -> message (processors or sampler raised or broke their contract), or ->
            a custom sampler's :class:`~workbench.engine.sampling.TokenCheck` until :meth:`read`.
        top: row -> its top-k ``(ids [k], log-probs [k])`` where ``Request(top_logprobs=k)``.
    """

    tokens: mx.array
    logprobs: mx.array
    finite: mx.array
    errors: dict
    top: TopArrays = field(default_factory=dict)

    def take(self, rows: Sequence[int]) -> "Pending":
        """Only rows ``rows`` (after a filter)."""
        idx = mx.array(list(rows), dtype=mx.int32)
        errors = {new: self.errors[old] for new, old in enumerate(rows) if old in self.errors}
        top = {new: self.top[old] for new, old in enumerate(rows) if old in self.top}
        return Pending(self.tokens[idx], self.logprobs[idx], self.finite[idx], errors, top)

    @staticmethod
    def concat(a: "Pending | None", b: "Pending") -> "Pending":
        """Rows of ``a`` then rows of ``b`` (after a join)."""
        if a is None:
            return b
        n = a.tokens.shape[0]
        errors = {**a.errors, **{n + k: v for k, v in b.errors.items()}}
        top = {**a.top, **{n + k: v for k, v in b.top.items()}}
        return Pending(
            mx.concatenate([a.tokens, b.tokens]),
            mx.concatenate([a.logprobs, b.logprobs]),
            mx.concatenate([a.finite, b.finite]),
            errors,
            top,
        )

    def clone(self) -> "Pending":
        """A copy sharing the arrays, with its own ``errors`` and ``top``."""
        return Pending(self.tokens, self.logprobs, self.finite, dict(self.errors), dict(self.top))

    def read(self) -> tuple[list[int], list[float], list[bool]]:
        """Evaluate (waits for the forward) and return ``(tokens, logprobs, finite)`` as
        lists; ``errors`` then holds messages only (custom samplers' ids checked)."""
        checks = [c for c in self.errors.values() if isinstance(c, TokenCheck)]
        mx.eval(self.tokens, self.logprobs, self.finite, *[c.ok for c in checks], *arrays_of(self.top))
        resolved = {b: e if isinstance(e, str) else e.message() for b, e in self.errors.items()}
        self.errors = {b: message for b, message in resolved.items() if message}
        return self.tokens.tolist(), self.logprobs.tolist(), self.finite.tolist()

    def arrays(self) -> list[mx.array]:
        """The arrays a read evaluates: tokens, log-probs, finiteness, the top-k arrays."""
        return [self.tokens, self.logprobs, self.finite, *arrays_of(self.top)]

    def read_top(self) -> dict[int, TopPairs]:
        """Row -> its top-k ``((id, log-prob), ...)`` best first (evaluates)."""
        return read_top(self.top)


def launch(
    model: Any,
    caches: list[Any],
    inputs: mx.array,
    samplers: Sequence[RowSampler],
    contexts: Sequence[Any],
    token_index: Sequence[int],
    asynchronous: bool = True,
) -> Pending:
    """Feed ``inputs`` ``[B]`` (token ids, may be lazy) through the model with ``caches``
    (updated in place) and sample each row's next token.

    Args:
        samplers, contexts, token_index: per row, see :func:`workbench.engine.sampling.sample_rows`.
        asynchronous: start evaluation with ``mx.async_eval`` and return at once (the
            pipelined path); ``False`` evaluates before returning.

    Returns:
        The :class:`Pending` next tokens.
    """
    logits = model(inputs.reshape(-1, 1), cache=caches)[:, -1, :]  # [B, V]
    return sample_pending(logits, samplers, contexts, token_index, asynchronous)


def sample_pending(
    logits: mx.array,
    samplers: Sequence[RowSampler],
    contexts: Sequence[Any],
    token_index: Sequence[int],
    asynchronous: bool | None = True,
) -> Pending:
    """The :class:`Pending` of ``logits`` ``[B, V]``: evaluated (``asynchronous=False``), started
    (``True``) or lazy (``None``: the caller starts :meth:`Pending.arrays`)."""
    sampled, logprobs, errors = sample_rows(logits, samplers, contexts, token_index)  # [B], [B, V]
    # NaN or +inf in a row's (processed) logits, or all -inf, makes its log-softmax NaN;
    # -inf entries alone (banned tokens) are fine.
    finite = mx.logical_not(mx.isnan(logprobs).any(axis=-1))  # [B]
    chosen = mx.take_along_axis(logprobs, sampled[:, None].astype(mx.int32), axis=-1)[:, 0]
    top = top_arrays(logprobs, [s.top_logprobs for s in samplers])  # the same [B, V] as ``chosen``
    pending = Pending(sampled, chosen.astype(mx.float32), finite, errors, top)
    if asynchronous is not None:
        (mx.async_eval if asynchronous else mx.eval)(*pending.arrays())
    return pending


def row_context(row: Any, pending: Pending | None, b: int) -> Callable[[], mx.array]:
    """Builds the row's tokens ``[T]`` (prompt, read, unread at ``pending`` row ``b``) when asked."""

    def build() -> mx.array:
        known = mx.array(list(row.valid.prompt_ids) + row.tokens, dtype=mx.uint32)
        return known if pending is None else mx.concatenate([known, pending.tokens[b : b + 1]])

    return build
