"""Oracles: the same requests through mlx-lm itself, and the comparison with our rows.

Knows: mlx-lm's ``generate_step`` (solo oracle: one request alone, with the model's own
cache from ``make_prompt_cache``) and ``BatchGenerator`` (batch oracle: mlx-lm's own
continuous batching). Must not know: the scheduler's internals; it compares token traces.

A *token trace* (:class:`TokenTrace`; not a request trace of
:mod:`workbench.workloads.traces`) is one request's generated tokens, the log-probability
of each chosen token and, for references, the top-2 logprob margin at each step (how close
the argmax was to a tie). :func:`compare_traces` compares ours with the references (not
the policy table :func:`workbench.compare`). Greedy traces only: sampled rows have no
oracle here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences, generate_step

from ..engine.kv.caches import single_cache
from ..engine.text import RowText
from ..observe.numbers import scientific

DEFAULT_ATOL = 1e-4


@dataclass
class TokenTrace:
    """One request's generation: tokens ``[T]``, chosen-token logprobs ``[T]`` (natural
    log) and reference margins ``[T]`` (top-1 minus top-2 logprob; empty for our own
    rows)."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)

    def add(self, token: int, logprobs_v: mx.array) -> None:
        """Append one step from a ``[V]`` logprob vector."""
        top2 = mx.topk(logprobs_v, 2)
        mx.eval(top2, logprobs_v)
        a, b = sorted(top2.tolist(), reverse=True)
        self.tokens.append(int(token))
        self.logprobs.append(float(logprobs_v[token].item()))
        self.margins.append(a - b)


@dataclass(frozen=True)
class RefRequest:
    """What an oracle needs of a request: prompt ids, ``max_tokens``, stop ids and stop
    strings (matched on the decoded text, as the engine matches them)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    stop_ids: frozenset[int]
    stop: tuple[str, ...] = ()


def solo_cache(model: Any, max_kv_size: int | None = None, keep: int = 0) -> list[Any]:
    """The solo reference's cache: :func:`workbench.engine.kv.caches.single_cache` (``keep=0``
    rotating caches, like the batch's; ``keep=4`` is mlx-lm's single-sequence default)."""
    return single_cache(model, max_kv_size, keep)


def solo_reference(
    model: Any,
    req: RefRequest,
    prefill_step_size: int = 2048,
    max_kv_size: int | None = None,
    keep: int = 0,
    tokenizer: Any = None,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
    logits_processors: Sequence[Any] = (),
    complete: Callable[[list[int]], bool] | None = None,
) -> TokenTrace:
    """Run ``req`` alone through mlx-lm's ``generate_step`` (greedy, the model's own
    cache from :func:`solo_cache`), with ``logits_processors`` (mlx-lm's
    ``(tokens [T], logits [1, V]) -> logits [1, V]``, e.g. a row's grammar mask).

    With ``kv_bits`` the cache is quantized as ``generate_step(kv_bits=, kv_group_size=,
    quantized_kv_start=0)`` does: after the first forward (the first prefill chunk of
    ``prefill_step_size`` tokens), so that forward attends to float keys and every later
    one to quantized keys (the batch matches it: :mod:`workbench.engine.levers.quantized_kv`).

    Stops after a stop id (included, as mlx-lm yields it), after the token whose text
    completes one of ``req.stop`` (mlx-lm's streaming detokenizer over mlx-lm's tokens,
    through :class:`workbench.engine.text.RowText`, the engine's own stop-string rule), after
    the token for which ``complete(tokens so far)`` is True (a complete grammar), or after
    ``max_tokens`` tokens.

    Raises:
        ValueError: when ``req.stop`` is not empty and no ``tokenizer`` is given.
    """
    if req.stop and tokenizer is None:
        raise ValueError("solo_reference: a request with stop strings needs the tokenizer to decode its text")
    text = RowText(tokenizer, req.stop) if req.stop else None
    trace = TokenTrace()
    prompt = mx.array(list(req.prompt_ids), dtype=mx.uint32)
    for token, logprobs_v in generate_step(
        prompt,
        model,
        max_tokens=req.max_tokens,
        prefill_step_size=prefill_step_size,
        prompt_cache=solo_cache(model, max_kv_size, keep),
        kv_bits=kv_bits,
        kv_group_size=kv_group_size,
        quantized_kv_start=0,
        logits_processors=list(logits_processors) or None,
    ):
        trace.add(int(token), logprobs_v)
        if int(token) in req.stop_ids or (text is not None and text.feed(int(token))):
            break
        if complete is not None and complete(trace.tokens):
            break
    return trace


def batch_reference(
    model: Any,
    reqs: Sequence[RefRequest],
    max_batch: int,
    prefill_step_size: int = 2048,
    max_kv_size: int | None = None,
) -> list[TokenTrace]:
    """Run ``reqs`` together through mlx-lm's ``BatchGenerator`` (greedy), all inserted
    at once, ``max_batch`` rows decoding and prefilling at a time. Returns traces in
    request order."""
    gen = BatchGenerator(
        model,
        completion_batch_size=max_batch,
        prefill_batch_size=max_batch,
        prefill_step_size=prefill_step_size,
        max_kv_size=max_kv_size,
    )
    try:
        uids = gen.insert(
            [list(r.prompt_ids) for r in reqs],
            max_tokens=[r.max_tokens for r in reqs],
            stop_sequences=[StopSequences([[s] for s in sorted(r.stop_ids)]) for r in reqs],
        )
        traces = {uid: TokenTrace() for uid in uids}
        active = set(uids)
        while active:
            for resp in gen.next_generated():
                traces[resp.uid].add(resp.token, resp.logprobs)
                if resp.finish_reason is not None:
                    active.discard(resp.uid)
    finally:
        gen.close()
    return [traces[u] for u in uids]


MATCH, NEAR_TIE, PRECISION_NEAR_TIE, LOGPROB_NOISE, DIVERGENCE = (
    "match",
    "near-tie",
    "near-tie under reduced precision",
    "log-prob noise",
    "divergence",
)
NOISE_FACTOR = 4.0  # a top-2 margin within this many times the measured log-prob noise can flip


@dataclass(frozen=True)
class RowResult:
    """Comparison of one row with its reference, classified by what the numerics allow.

    ``match`` is True when tokens are equal and every logprob is within ``atol``, or when
    the first token divergence happens where the reference's top-2 margin is below
    ``atol`` (an accepted near-tie, ``tie_accepted``).

    ``noise`` is the measured log-prob noise (nats): the largest ``|ours - reference|``
    chosen-token log-prob over the steps where both chose the same token and, at the first
    divergence, the two top-1 log-probs (both runs' best token at the same context). A
    float32 run agrees to about 1e-6; TF32 matmuls give about 1e-3. ``cause`` is one of:

    - ``match``: as above, no divergence;
    - ``near-tie``: the tokens diverge where the reference's margin is below ``atol``
      (accepted, ``match`` True);
    - ``near-tie under reduced precision``: the margin is above ``atol`` but within
      ``NOISE_FACTOR`` times the noise: rounding this large can flip the argmax, so the
      divergence is explained by the precision, not by a bug (``match`` False: the run
      is not at the tolerance the oracle holds it to);
    - ``log-prob noise``: the tokens are equal but a log-prob differs by more than
      ``atol`` (reduced precision, or a bug that changes values without changing the argmax);
    - ``divergence``: the margin is far above the noise: a real divergence.
    """

    uid: int
    match: bool
    n_tokens: int
    max_logprob_diff: float
    first_divergence_step: int | None = None
    ours: int | None = None
    theirs: int | None = None
    logprob_gap: float | None = None
    ref_margin: float | None = None
    tie_accepted: bool = False
    noise: float = 0.0
    cause: str = MATCH

    def describe(self) -> str:
        """One line for humans: the verdict, and for a divergence its step, tokens, the
        reference's top-2 margin there and the measured log-prob noise."""
        if self.first_divergence_step is None:
            verdict = "match" if self.match else f"MISMATCH ({self.cause})"
            diff = scientific(self.max_logprob_diff)
            return f"uid {self.uid}: {verdict} ({self.n_tokens} tokens, max |dlogprob| {diff})"
        verdict = "near-tie accepted" if self.tie_accepted else f"MISMATCH ({self.cause})"
        return (
            f"uid {self.uid}: {verdict} at step {self.first_divergence_step}: ours {self.ours} vs reference "
            f"{self.theirs}, logprob gap {self.logprob_gap:.2e}, reference top-2 margin {self.ref_margin:.2e}, "
            f"measured log-prob noise {self.noise:.2e}"
        )


def divergence_cause(margin: float, noise: float, atol: float) -> str:
    """Why tokens diverged where the reference's top-2 margin is ``margin`` and the
    measured log-prob noise is ``noise`` (nats): ``near-tie`` below ``atol``, ``near-tie
    under reduced precision`` within ``NOISE_FACTOR * noise``, else ``divergence``.

    >>> divergence_cause(5e-5, 1e-6, 1e-4), divergence_cause(2e-3, 1e-3, 1e-4), divergence_cause(0.5, 1e-3, 1e-4)
    ('near-tie', 'near-tie under reduced precision', 'divergence')
    """
    if margin < atol:
        return NEAR_TIE
    return PRECISION_NEAR_TIE if margin <= NOISE_FACTOR * noise else DIVERGENCE


def compare_row(uid: int, ours: TokenTrace, ref: TokenTrace, atol: float = DEFAULT_ATOL) -> RowResult:
    """Compare our trace with the reference trace of the same request (see
    :class:`RowResult` for the fields and the classification)."""
    n = min(len(ours.tokens), len(ref.tokens))
    diffs = [abs(a - b) for a, b in zip(ours.logprobs[:n], ref.logprobs[:n])]
    for t in range(max(len(ours.tokens), len(ref.tokens))):
        a = ours.tokens[t] if t < len(ours.tokens) else None
        b = ref.tokens[t] if t < len(ref.tokens) else None
        if a != b:
            gap = abs(ours.logprobs[t] - ref.logprobs[t]) if a is not None and b is not None else float("nan")
            margin = ref.margins[t] if t < len(ref.margins) else float("nan")
            noise = max(diffs[: t + 1] if a is not None and b is not None else diffs[:t], default=0.0)
            cause = (
                divergence_cause(margin, noise, atol) if margin == margin else DIVERGENCE
            )  # NaN: length differs
            tie = cause == NEAR_TIE
            return RowResult(
                uid,
                tie,
                len(ours.tokens),
                max(diffs[:t], default=0.0),
                t,
                a,
                b,
                gap,
                margin,
                tie,
                noise,
                cause,
            )
    worst = max(diffs, default=0.0)
    return RowResult(
        uid,
        worst <= atol,
        len(ours.tokens),
        worst,
        noise=worst,
        cause=MATCH if worst <= atol else LOGPROB_NOISE,
    )


@dataclass(frozen=True)
class OracleReport:
    """Per-row results; ``ok`` when every row matches."""

    rows: list[RowResult]

    @property
    def ok(self) -> bool:
        """True when every row matches its reference."""
        return all(r.match for r in self.rows)

    @property
    def n_match(self) -> int:
        """How many rows match."""
        return sum(r.match for r in self.rows)

    def text(self) -> str:
        """One line per row (``RowResult.describe``)."""
        return "\n".join(r.describe() for r in self.rows)

    def causes(self) -> dict[str, int]:
        """Rows per :attr:`RowResult.cause`, in order of first appearance, e.g.
        ``{"match": 12, "near-tie under reduced precision": 2}``."""
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.cause] = out.get(r.cause, 0) + 1
        return out

    @property
    def noise(self) -> float:
        """The largest measured log-prob noise of any row (nats; 0.0 for no rows)."""
        return max((r.noise for r in self.rows), default=0.0)


def compare_traces(
    ours: dict[int, TokenTrace], refs: dict[int, TokenTrace], atol: float = DEFAULT_ATOL
) -> OracleReport:
    """Compare every uid of ``refs`` with ``ours`` (:func:`compare_row` per uid, in
    ``refs``' order).

    Args:
        ours: our token trace per uid (e.g. :func:`scheduler_trace`).
        refs: the reference trace per uid (:func:`solo_reference`, :func:`batch_reference`).
        atol: logprob tolerance (natural log) and the near-tie margin.

    Raises:
        KeyError: when a uid of ``refs`` is missing from ``ours``.
    """
    return OracleReport([compare_row(uid, ours[uid], refs[uid], atol) for uid in refs])


def scheduler_trace(sched: Any, uid: int) -> TokenTrace:
    """Our trace of ``uid`` from a scheduler (tokens and logprobs, no margins)."""
    return TokenTrace(tokens=sched.tokens(uid), logprobs=sched.logprobs(uid))


# A request's callables that decide its tokens: a row loaded from a checkpoint file without them
# (``RequestState.not_restored``) cannot be run again as it ran.
DECIDING_CALLABLES = ("sampler", "logits_processors")


def checkable_uids(sched: Any, greedy_only: bool = True) -> list[int]:
    """Uids of ``sched`` that finished by ``stop`` or ``length`` (evicted or not), with the
    request they ran (none of :data:`DECIDING_CALLABLES` lost to a checkpoint file) and, with
    ``greedy_only``, decoded greedily, in uid order: the rows an oracle can check (an aborted
    or errored row stopped where its run alone goes on). Mirrors: none."""
    return [
        u
        for u, s in sched.requests.items()
        if s.finish_reason in ("stop", "length")
        and not set(DECIDING_CALLABLES) & set(s.not_restored)
        and (s.valid.request.greedy or not greedy_only)
    ]


def ref_request(valid: Any) -> RefRequest:
    """A :class:`RefRequest` from a validated request (``workbench.engine.request.ValidRequest``),
    its stop strings included."""
    return RefRequest(valid.prompt_ids, valid.request.max_tokens, valid.stop_ids, tuple(valid.stop))


def solo_check(
    model: Any, sched: Any, uids: Sequence[int] | None = None, atol: float = DEFAULT_ATOL
) -> OracleReport:
    """Solo oracle for finished greedy rows of ``sched``: each uid run alone through
    mlx-lm and compared (stop strings decoded with ``sched.tokenizer``; a quantized KV
    cache, ``Scheduler(kv_bits=...)``, at the same bits and group size). ``uids`` defaults
    to every finished greedy uid."""
    uids = list(uids) if uids is not None else checkable_uids(sched)
    quant = sched.recipe.kv_quant
    kv = {} if quant is None else {"kv_bits": quant.bits, "kv_group_size": quant.group_size}
    refs = {
        u: solo_reference(
            model,
            ref_request(sched.request_of(u)),
            sched.config.prefill_step_size,
            sched.config.max_kv_size,
            tokenizer=sched.tokenizer,
            **kv,
        )
        for u in uids
    }
    return compare_traces({u: scheduler_trace(sched, u) for u in uids}, refs, atol)
