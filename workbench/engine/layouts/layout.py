"""The face both layouts share (:class:`Layout`) and what a step yields (:class:`Read`).

Knows: the engine state's fields, the event recorder, the pacer. Must not know: the
scheduler, the queue's order, admission's policy.

A layout's generators hand work back instead of calling the scheduler::

    for limit in layout.admit(st, recorder):   # the layout asks for a new group of rows
        scheduler starts one (admission's choice, at most ``limit`` prefill tokens)
    for item in layout.step(st, recorder):     # a Read: the scheduler reads that token
        ...                                    # an Event: returned among the step's events
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, NamedTuple

from ...observe.events import Event
from ...observe.recorder import Recorder
from ..config import SchedulerConfig
from ..levers import speculative
from ..state import RequestState, Status


class Read(NamedTuple):
    """One token a forward computed for running row ``b`` (``message``: why it has none)."""

    row: RequestState
    b: int
    token: int
    logprob: float
    message: str
    top: tuple = ()


NON_FINITE = "non-finite logits (NaN or inf)"


def speculation_of(model: Any, cfg: SchedulerConfig, vocab_size: int | None) -> Any:
    """The layout's :class:`~workbench.engine.levers.speculative.Speculation` from the
    settings (``None`` without ``speculative``): :func:`speculative.configure` with ``cfg``'s
    fields, the same in both layouts.

    Raises:
        ValueError: what :func:`~workbench.engine.levers.speculative.configure` raises.
    """
    return speculative.configure(
        model,
        cfg.speculative,
        cfg.num_draft_tokens,
        batch_invariant=cfg.batch_invariant,
        vocab_size=vocab_size,
        prefill_step_size=cfg.prefill_step_size,
        max_kv_size=cfg.max_kv_size,
    )


class Layout:
    """What the scheduler asks of a layout; :class:`~.padded.PaddedLayout` and
    :class:`~.packed.PackedLayout` fill it in.

    Attributes:
        config: the scheduler's settings. ledger: the KV books admission reads.
        pacer: the pacing's running estimates, ``None`` with pacing off.
    """

    packed = False
    config: SchedulerConfig
    ledger: Any
    pacer: Any = None

    @staticmethod
    def check(model: Any, config: SchedulerConfig, prompt_cache: Any, adapters: Any) -> None:
        """Refuse, by name, a model or settings this layout cannot run (nothing by default)."""

    @staticmethod
    def serial_reason(model: Any, config: SchedulerConfig) -> str:
        """Why the model must run one row at a time in this layout (``""``: it batches)."""
        return ""

    def new_batch(self) -> Any:
        """An empty batch of this layout."""
        raise NotImplementedError

    def start(self, st: Any, chosen: Sequence[RequestState]) -> None:
        """Start the rows admission chose (their status is already ``PREFILLING``)."""
        raise NotImplementedError

    def admit(self, st: Any, recorder: Recorder) -> Iterator[int | None]:
        """Prefill and join; yields to ask for a new group of rows (the most padded prefill
        tokens it may bring, ``None``: no limit); logs ``prefill`` and ``join`` events."""
        raise NotImplementedError

    def step(self, st: Any, recorder: Recorder) -> Generator[Read | Event, None, bool]:
        """One decode forward: yields each token read (a :class:`Read`) and each event the
        step returns; returns False when it ran no forward."""
        raise NotImplementedError

    def preemptable(self, status: Status) -> bool:
        """Whether a row in ``status`` can be preempted."""
        return status is Status.RUNNING

    def snapshot_fields(self, st: Any) -> dict[str, Any]:
        """This layout's own fields of a snapshot."""
        return {}

    def store(self, st: Any, b: int) -> None:
        """Store running row ``b``'s cache in the prompt cache (before it is evicted)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no prompt cache entries")

    def end_iteration(self, clock: Callable[[], float]) -> None:
        """Close one ``admit()`` for the pacer."""
        if self.pacer is not None:
            self.pacer.end_iteration(clock())


def reads_of(rows: Sequence[RequestState], toks, lps, finite, tops, errors) -> Iterator[Read]:
    """A :class:`Read` per unfinished row ``b`` of ``rows`` from a forward's per-row token
    ids, log-probs, finiteness, top-k log-probs and errors (row ``b`` at index ``b``),
    checking ``finished`` as each is taken."""
    for b, row in enumerate(rows):
        if not row.finished:
            message = errors.get(b) or ("" if finite[b] else NON_FINITE)
            yield Read(row, b, toks[b], lps[b], message, tops.get(b, ()))
