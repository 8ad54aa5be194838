"""The batch-invariance oracle and audit: is a row the same bits whatever its neighbours?

Knows: the scheduler's public contract, :mod:`workbench.engine.levers.invariant`, MLX ops. Must
not know: views.

- :func:`bit_check`: every row of a ``Scheduler(batch_invariant=True)`` run finished by
  ``stop`` or ``length`` against the same request run alone in the plain mode (:func:`run_alone`:
  the scheduler's own settings, adapters and the row's seed, ``max_batch=1``, no speculation or
  pacing): tokens and log-probs compared bit for bit, no tolerance.
- :func:`audit`: for a model on this device, which operations change a row's bits when
  the row count or the left padding changes (row alone vs inside ``B`` rows), by how much,
  and whether the mode's choices remove it; and end to end, how many rows of a batch equal
  their run alone, by default and in the mode (``workbench invariance``).

Axis letters: ``B`` rows, ``K`` input features, ``S`` cached positions.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from ..engine.levers import invariant
from ..engine.request import Request
from ..engine.scheduler import Scheduler
from .oracle import DECIDING_CALLABLES, checkable_uids


@dataclass(frozen=True)
class BitRow:
    """One row's comparison: ``uid``, ``equal`` (tokens and log-probs bit for bit), the first
    generated-token index where tokens or log-probs differ (``None`` if equal), and ``stopped``:
    ``"abort"`` or ``"error"`` for a row named to :func:`bit_check` that ended so, compared up
    to where it stopped (its run alone goes on), else ``None``."""

    uid: int
    equal: bool
    first_difference: int | None
    stopped: str | None = None


# Why bit_check leaves a row out by default, as its report counts it ("1 aborted row").
SKIPPED = {
    "abort": "aborted",
    "error": "errored",
    "unfinished": "unfinished",
    "not restored": "whose sampler or logits processors a checkpoint file did not restore",
}


@dataclass(frozen=True)
class BitReport:
    """Rows of a batched run against their runs alone, and ``skipped``: ``(uid, why)`` of the
    rows not checked (``why`` a key of :data:`SKIPPED`). ``text()`` is one line."""

    rows: list[BitRow] = field(default_factory=list)
    skipped: tuple[tuple[int, str], ...] = ()

    @property
    def n_equal(self) -> int:
        """Rows bit-equal to their run alone."""
        return sum(r.equal for r in self.rows)

    @property
    def ok(self) -> bool:
        """Whether every checked row is bit-equal to its run alone (skipped rows aside)."""
        return self.n_equal == len(self.rows)

    def text(self) -> str:
        """E.g. ``bit-exact: 14/14 rows equal to their run alone (tokens and log-probs)``, with
        the rows compared up to where they stopped and those not checked, e.g. ``(tokens and
        log-probs; 1 aborted row not checked)``."""
        notes = ["tokens and log-probs"] + [
            f"uid {r.uid} up to its {r.stopped}" for r in self.rows if r.stopped
        ]
        whys = [why for _, why in self.skipped]
        if whys:
            counts = [(n, SKIPPED[why]) for why in SKIPPED if (n := whys.count(why))]
            notes.append(", ".join(_rows(n, what) for n, what in counts) + " not checked")
        out = f"bit-exact: {self.n_equal}/{len(self.rows)} rows equal to their run alone ({'; '.join(notes)})"
        bad = [f"uid {r.uid} from token {r.first_difference}" for r in self.rows if not r.equal]
        return out + (": differ " + ", ".join(bad) if bad else "")


def _rows(n: int, what: str) -> str:
    """``"1 aborted row"``, ``"2 aborted rows"``, ``"1 row whose ..."``."""
    rows = "row" if n == 1 else "rows"
    return f"{n} {rows} {what}" if what.startswith("whose") else f"{n} {what} {rows}"


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first index where ``a`` and ``b`` differ (a length difference counts at the
    shorter length), ``None`` when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def alone(
    model: Any,
    tokenizer: Any,
    request: Request,
    prefill_step_size: int,
    batch_invariant: bool = True,
    **settings: Any,
) -> tuple[list[int], list[float]]:
    """``(tokens, log-probs)`` of ``request`` run alone: ``Scheduler(max_batch=1,
    batch_invariant=..., prefill_step_size=..., **settings)`` (e.g. ``kv_bits``). For a row of
    a scheduler you have, :func:`run_alone` takes all its settings. Mirrors: none.

    Raises:
        ValueError: what ``Scheduler(...)`` and ``Scheduler.submit`` raise.
    """
    sched = Scheduler(
        model,
        tokenizer,
        max_batch=1,
        prefill_step_size=prefill_step_size,
        batch_invariant=batch_invariant,
        **settings,
    )
    uid = _run_one(sched, request)
    return sched.tokens(uid), sched.logprobs(uid)


def _run_one(sched: Scheduler, request: Request) -> int:
    """Submit ``request`` to the empty ``sched`` without its ``on_token`` (the batched run's
    callback stays there) and run it to its end; its uid there."""
    uid = sched.submit(dataclasses.replace(request, on_token=None))
    sched.run()
    return uid


def run_alone(sched: Scheduler, uid: int, **changes: Any) -> tuple[Scheduler, int]:
    """Request ``uid`` of ``sched`` run again by itself on ``sched.fresh(**changes)``: the same
    model, settings (``SchedulerConfig``: layout, ``page_size``, ``kv_bits``, ``max_kv_size``,
    ``prefill_step_size``, ...), adapters, prompt cache (a size: a new, empty one; an mlx-lm
    cache: shared) and clock, ``changes`` replacing some (:data:`ALONE_CHANGES` for
    :func:`bit_check`), with the seed the row drew (``sched.requests[uid].seed``: a sampled
    request submitted without one, or a ``submit_n`` sample, draws what it drew there).

    Returns:
        ``(other, v)``: the scheduler it ran on and its uid there (``other.tokens(v)``, ...).

    Raises:
        KeyError: a ``uid`` ``sched`` does not know. ValueError: what ``Scheduler.fresh`` and
        ``submit`` raise for ``changes`` or the request.

    Mirrors: none.
    """
    request = dataclasses.replace(sched.request_of(uid).request, seed=sched.requests[uid].seed)
    other = sched.fresh(**changes)
    return other, _run_one(other, request)


# What differs for a run alone, beside max_batch=1. The run alone is the plain mode in the checked
# scheduler's settings: docs' "alone" is Scheduler(batch_invariant=True, max_batch=1), and the docs
# (docs/batch-invariance.md) promise that speculation, pacing and when a row's forwards run change no
# bit, so the settings that still act on a row alone and only decide those go back to their defaults
# (a default is never refused beside other settings), and the check holds them to that promise
# instead of comparing a row with itself under them:
# - speculative=None: no speculation (a draft model is the `speculative` value itself;
#   num_draft_tokens then acts on nothing and stays);
# - pacing=None: fixed chunks (in the mode a prompt's chunks are fixed; pacing decides when they run);
# - pipeline=True, interleave_prefill=True, packed_schedule="hybrid": when a forward or a chunk runs,
#   and what shares a packed forward.
# No prompt cache: nothing of the batched run is reused (in the mode a hit keeps a row's bits, so its
# reference is its whole prefill) and a user's mlx-lm cache is left as it was. The real clock: an
# injected one is not advanced. Kept as the scheduler has them: what makes a row's bits
# (prefill_step_size, layout, page_size, max_num_batched_tokens, kv_bits, kv_group_size, max_kv_size,
# the adapters) and what does nothing to one row alone (policy, prompt_concurrency, reuse_slots,
# fast_decode, clear_cache_every, history; a KV budget: one request alone always fits it, submit
# refuses one that could not; seed: the row's own is passed).
ALONE_CHANGES = dict(
    max_batch=1,
    prompt_cache=None,
    clock=time.perf_counter,
    speculative=None,
    pacing=None,
    pipeline=True,
    interleave_prefill=True,
    packed_schedule="hybrid",
)


def bit_check(sched: Scheduler, uids: Sequence[int] | None = None) -> BitReport:
    """Rows of ``sched`` against the same request run alone in the plain mode: :func:`run_alone`
    with :data:`ALONE_CHANGES` (``sched``'s settings, adapters and the row's seed; ``max_batch=1``,
    no prompt cache, no speculation or pacing), tokens and log-probs bit for bit. Speculation,
    pacing and preemption leave every row the bits it has without them, so the run alone has
    none. Mirrors: none.

    By default the rows :func:`~workbench.verify.oracle.checkable_uids` gives (finished by
    ``stop`` or ``length``, sampled too); the others are the report's ``skipped`` (aborted,
    errored, unfinished, or loaded from a checkpoint file without their sampler or logits
    processors). A row named in ``uids`` that was aborted or errored is compared up to where it
    stopped (``BitRow.stopped``): its tokens and log-probs equal its run alone's first as many.

    Raises:
        ValueError: ``sched`` is not in the batch-invariant mode; a uid of ``uids`` that is not
            finished (naming it and its status), or whose sampler or logits processors a
            checkpoint file did not restore.
        KeyError: a uid of ``uids`` ``sched`` does not know.
    """
    if sched.batch_invariant is None:
        raise ValueError(
            "bit_check needs a Scheduler(batch_invariant=True): outside the mode rows are "
            "compared with a tolerance (workbench.verify.oracle.solo_check)"
        )
    if uids is None:
        uids = checkable_uids(sched, greedy_only=False)
        checked = set(uids)
        skipped = tuple((u, _why_skipped(s)) for u, s in sched.requests.items() if u not in checked)
    else:
        skipped = ()
        for u in uids:
            _refuse_unchecked(sched, u)
    rows = []
    for u in uids:
        solo, v = run_alone(sched, u, **ALONE_CHANGES)
        got, stopped = list(zip(sched.tokens(u), sched.logprobs(u))), sched.finish_reason(u)
        ref = list(zip(solo.tokens(v), solo.logprobs(v)))
        stopped = stopped if stopped in ("abort", "error") else None
        d = first_difference(got, ref[: len(got)] if stopped else ref)
        rows.append(BitRow(u, d is None, d, stopped))
    return BitReport(rows, skipped)


def _why_skipped(s: Any) -> str:
    """Why the request state ``s`` is no row :func:`bit_check` checks by default (a key of
    :data:`SKIPPED`)."""
    if not s.finished:
        return "unfinished"
    return s.finish_reason if s.finish_reason in ("abort", "error") else "not restored"


def _refuse_unchecked(sched: Scheduler, uid: int) -> None:
    """Refuse a ``uid`` named to :func:`bit_check` that has no run alone to compare with:
    unfinished (KeyError for an unknown one), or its sampler or logits processors lost."""
    status = sched.status(uid)  # KeyError naming an unknown uid
    s = sched.requests[uid]
    if not s.finished:
        raise ValueError(
            f"bit_check: uid {uid} is {status.value}, not finished: only a finished row (or one "
            "aborted or errored, compared up to where it stopped) has all the tokens it will have"
        )
    lost = [n for n in DECIDING_CALLABLES if n in s.not_restored]
    if lost:
        raise ValueError(
            f"bit_check: uid {uid} was loaded from a checkpoint file without its {' and '.join(lost)} "
            "(a callable is never saved): run alone now it would not choose its tokens as it did"
        )


# -- the audit ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OpFinding:
    """One operation's variance: ``op`` (name and shape), ``rows`` (row counts tried),
    ``max_abs_diff`` (largest |row among B - row alone| over them, 0.0 = bit-equal), and
    ``mode_diff`` (the same under the mode's choice, ``None`` where the mode does not
    change the operation)."""

    op: str
    rows: tuple
    max_abs_diff: float
    mode_diff: float | None
    mode_choice: str


def _diff(a: mx.array, b: mx.array) -> float:
    return float(mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item())


def projection_findings(model: Any, counts: Sequence[int] = (2, 8, 16, 32)) -> list[OpFinding]:
    """Each distinct projection of ``model``: row 0 computed alone vs inside ``B`` rows
    (``counts``), plainly and in the mode's row blocks (:meth:`Invariance.calibrate`)."""
    inv = invariant.Invariance.calibrate(model)
    out, seen = [], set()
    for name, m in model.named_modules():
        if not isinstance(m, invariant.PROJECTIONS) or "weight" not in m or invariant.signature(m) in seen:
            continue
        seen.add(invariant.signature(m))
        f, K = invariant._plain_call(m), invariant._in_features(m)
        dtype = m["scales"].dtype if "scales" in m else m["weight"].dtype
        x = mx.random.normal((max(counts), K), key=mx.random.key(3)).astype(dtype)  # [B, K]
        blocks = inv.blocks_for(m)
        plain = max(_diff(f(x[:B])[0], f(x[:1])[0]) for B in counts)
        mode = max(
            _diff(invariant.blocked(f, x[:B], blocks)[0], invariant.blocked(f, x[:1], blocks)[0])
            for B in counts
        )
        choice = (
            "any row count"
            if blocks is None
            else "one row per call"
            if blocks == invariant.ONE_ROW
            else f"blocks of {blocks.max_rows} rows (padded to {blocks.min_rows})"
        )
        out.append(
            OpFinding(
                f"{name} {type(m).__name__} {K}->{m['weight'].shape[0]} {dtype}",
                tuple(counts),
                plain,
                mode,
                choice,
            )
        )
    return out


def attention_findings(
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
    tokens: int = 300,
    pads: Sequence[int] = (1, 7, 33, 100),
    dtype: Any = mx.float32,
) -> list[OpFinding]:
    """One-query attention of a row over its ``tokens`` keys alone vs behind ``pads`` of
    left padding with a padding mask (what a padded batch row computes), and the mode's
    per-row attention (:func:`workbench.engine.levers.invariant.row_attention` on the CPU;
    elsewhere the row's own keys through MLX's attention, no mask)."""
    k0, k1, k2 = mx.random.split(mx.random.key(5), 3)
    q = mx.random.normal((1, heads, 1, head_dim), key=k0).astype(dtype)
    k = mx.random.normal((1, kv_heads, tokens, head_dim), key=k1).astype(dtype)
    v = mx.random.normal((1, kv_heads, tokens, head_dim), key=k2).astype(dtype)
    scale = head_dim**-0.5
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
    worst, mode = 0.0, 0.0
    for p in pads:
        zeros = mx.zeros((1, kv_heads, p, head_dim), dtype=dtype)
        kp, vp = mx.concatenate([zeros, k], axis=2), mx.concatenate([zeros, v], axis=2)
        mask = (mx.arange(p + tokens) >= p)[None, None, None, :]  # [1, 1, 1, S]
        worst = max(
            worst, _diff(mx.fast.scaled_dot_product_attention(q, kp, vp, scale=scale, mask=mask), ref)
        )
        starts = mx.array([p])
        padded = (
            invariant.row_attention(q, kp, vp, starts, scale)
            if _cpu()
            else mx.fast.scaled_dot_product_attention(q, kp[:, :, p:], vp[:, :, p:], scale=scale)
        )
        alone_ = invariant.row_attention(q, k, v, mx.array([0]), scale) if _cpu() else ref
        mode = max(mode, _diff(padded, alone_))
    return [
        OpFinding(
            f"attention, one query over {tokens} keys, {dtype}",
            tuple(pads),
            worst,
            mode,
            _attention_route(heads // kv_heads, head_dim, dtype),
        )
    ]


def _attention_route(heads_per_kv: int, head_dim: int, dtype: Any) -> str:
    """How the mode attends one row (the finding's last column): on the CPU in fixed key
    blocks where they passed their check for this shape, else the row's own keys, no mask."""
    if _cpu():
        from ..engine.levers.invariant_keyblocks import KEY_BLOCK, blocks_agree

        if blocks_agree(heads_per_kv, head_dim, dtype):
            return f"each row's keys in fixed blocks of {KEY_BLOCK}, from its last key"
    return "each row on its own keys, no mask"


def _cpu() -> bool:
    from ..runtime.device import backend

    return backend() == "cpu"


def rowwise_findings(
    K: int = 128, counts: Sequence[int] = (2, 8, 32), dtype: Any = mx.float32
) -> list[OpFinding]:
    """Row-wise operations (RMSNorm, RoPE at per-row offsets, log-softmax): row 0 alone vs
    inside ``B`` rows; the mode leaves them as they are."""
    x = mx.random.normal((max(counts), 1, K), key=mx.random.key(9)).astype(dtype)
    w = mx.ones((K,), dtype=dtype)
    ops = {
        "rms_norm": lambda a: mx.fast.rms_norm(a, w, 1e-5),
        "rope (per-row offsets)": lambda a: mx.fast.rope(
            a[:, None], K, traditional=False, base=10000.0, scale=1.0, offset=mx.arange(a.shape[0]) * 3 + 5
        )[:, 0],
        "log-softmax": lambda a: a - mx.logsumexp(a, axis=-1, keepdims=True),
    }
    return [
        OpFinding(
            f"{name} {K} {dtype}",
            tuple(counts),
            max(_diff(f(x[:B])[0], f(x[:1])[0]) for B in counts),
            None,
            "unchanged",
        )
        for name, f in ops.items()
    ]


@dataclass(frozen=True)
class Audit:
    """What :func:`audit` found: per-operation findings and, end to end, rows equal to
    their run alone by default and in the mode (``(equal, rows)`` per batch size)."""

    device: str
    ops: list[OpFinding]
    end_to_end: dict

    def text(self) -> str:
        """The findings as a table: one line per operation, then the end-to-end rows."""
        lines = [
            f"batch invariance on {self.device}",
            "operation | rows tried | max |diff| default | in the mode | mode's choice",
        ]
        for f in self.ops:
            mode = "unchanged" if f.mode_diff is None else f"{f.mode_diff:.1e}"
            lines.append(
                f"{f.op} | {', '.join(map(str, f.rows))} | {f.max_abs_diff:.1e} | {mode} | {f.mode_choice}"
            )
        lines.append("end to end (greedy rows bit-equal to their run alone, tokens and log-probs):")
        for (mode, B), (eq, n) in sorted(self.end_to_end.items()):
            lines.append(f"  {mode:9s} B = {B:3d}: {eq}/{n}")
        return "\n".join(lines)


EQUAL, DIFFERS, NO_TOKEN, TOKEN_DIFFERS = 1, 0, -1, 2  # the values of StepGrid.equal


@dataclass(frozen=True)
class StepGrid:
    """Rows of one batched run against their runs alone, token by token.

    Attributes:
        mode: ``"default"`` or ``"invariant"``. batch_size: ``B``.
        equal: ``[B, T]`` int8 (``T = max_tokens``): :data:`EQUAL` where the row's token
            ``t`` and its log-prob are bit-equal to alone, :data:`DIFFERS` where the token
            is the same and only its log-prob differs (last bits), :data:`TOKEN_DIFFERS`
            where the token itself differs (or only one side has a token ``t``),
            :data:`NO_TOKEN` where neither has one (both stopped earlier).
    """

    mode: str
    batch_size: int
    equal: Any

    @property
    def n_equal_rows(self) -> int:
        """Rows equal to alone at every token."""
        return int(((self.equal == EQUAL) | (self.equal == NO_TOKEN)).all(axis=1).sum())

    def first_differences(self) -> list[int | None]:
        """Per row, the first token index that differs (``None``: equal throughout)."""
        differs = (self.equal == DIFFERS) | (self.equal == TOKEN_DIFFERS)
        return [int(r.argmax()) if r.any() else None for r in differs]


def compare_steps(
    got: tuple[Sequence[int], Sequence[float]], ref: tuple[Sequence[int], Sequence[float]], max_tokens: int
) -> Any:
    """``[max_tokens]`` int8 of :data:`EQUAL` / :data:`DIFFERS` (same token, other log-prob)
    / :data:`TOKEN_DIFFERS` / :data:`NO_TOKEN` for one row's ``(tokens, log-probs)`` against
    its reference's.

    >>> compare_steps(([1, 2, 3], [-.5, -.1, -.2]), ([1, 2], [-.5, -.3]), 4).tolist()
    [1, 0, 2, -1]
    >>> compare_steps(([1, 7], [-.5, -.1]), ([1, 2], [-.5, -.1]), 2).tolist()
    [1, 2]
    """
    import numpy as np

    out = np.full(max_tokens, NO_TOKEN, dtype=np.int8)
    a, b = list(zip(*got)), list(zip(*ref))
    for t in range(min(max_tokens, max(len(a), len(b)))):
        if t >= len(a) or t >= len(b) or a[t][0] != b[t][0]:
            out[t] = TOKEN_DIFFERS
        else:
            out[t] = EQUAL if a[t][1] == b[t][1] else DIFFERS
    return out


def step_grids(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    batch_sizes: Sequence[int] = (8,),
    max_tokens: int = 16,
    prefill_step_size: int = 64,
    modes: Sequence[bool] = (False, True),
) -> list[StepGrid]:
    """One :class:`StepGrid` per mode (``batch_invariant`` in ``modes``) and batch size
    ``B``: the first ``B`` of ``prompts`` (str, token ids or chat messages) submitted at
    once into ``max_batch=B``, greedy, each row against the same request alone in the same
    mode (:func:`alone`, with the same ``prefill_step_size``).

    Raises:
        ValueError: fewer ``prompts`` than the largest batch size.
    """
    import numpy as np

    if len(prompts) < max(batch_sizes):
        raise ValueError(f"prompts: {len(prompts)} given, batch size {max(batch_sizes)} needs as many")
    out = []
    for mode in modes:
        refs: dict = {}
        for B in batch_sizes:
            reqs = [_request(p, max_tokens) for p in prompts[:B]]
            sched = Scheduler(
                model, tokenizer, max_batch=B, prefill_step_size=prefill_step_size, batch_invariant=mode
            )
            uids = [sched.submit(r) for r in reqs]
            sched.run()
            rows = []
            for i, (u, r) in enumerate(zip(uids, reqs)):
                if i not in refs:
                    refs[i] = alone(model, tokenizer, r, prefill_step_size, batch_invariant=mode)
                rows.append(compare_steps((sched.tokens(u), sched.logprobs(u)), refs[i], max_tokens))
            out.append(StepGrid("invariant" if mode else "default", B, np.stack(rows)))
    return out


@dataclass(frozen=True)
class ChunkFinding:
    """One prompt prefilled in chunks of ``prefill_step_size`` against the reference chunk
    size: ``tokens_equal`` (the generated tokens), ``max_abs_logprob_diff`` (nats, 0.0 =
    bit-equal log-probs)."""

    prefill_step_size: int
    reference_step_size: int
    tokens_equal: bool
    max_abs_logprob_diff: float


def end_to_end(grids: Sequence[StepGrid]) -> dict:
    """``{("default" | "invariant", B): (rows bit-equal to alone, rows)}`` of the grids of
    :func:`step_grids`: per mode and batch size ``B``, how many rows were bit-equal to their
    run alone at every token (tokens and log-probs).

    >>> import numpy as np
    >>> end_to_end([StepGrid("default", 2, np.array([[1, 1], [1, 0]], np.int8))])
    {('default', 2): (1, 2)}
    """
    return {(g.mode, g.batch_size): (g.n_equal_rows, g.batch_size) for g in grids}


def chunk_findings(
    model: Any,
    tokenizer: Any,
    request: Request,
    chunk_sizes: Sequence[int] = (8, 16, 64),
    reference_step_size: int = 2048,
) -> list[ChunkFinding]:
    """Does the chunk schedule change a row's bits? ``request`` run alone in the mode
    (:func:`alone`) with each of ``chunk_sizes`` as ``prefill_step_size`` against
    ``reference_step_size`` (a prompt shorter than it is prefilled in one call)."""
    ref_t, ref_l = alone(model, tokenizer, request, reference_step_size)
    out = []
    for c in chunk_sizes:
        t, lp = alone(model, tokenizer, request, c)
        n = min(len(lp), len(ref_l))
        diff = max((abs(a - b) for a, b in zip(lp[:n], ref_l[:n])), default=0.0)
        out.append(ChunkFinding(c, reference_step_size, t == ref_t, float(diff)))
    return out


def default_row_divergence(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    batch_size: int | None = None,
    max_tokens: int = 8,
    prefill_step_size: int = 64,
) -> Any:
    """Where batching changes a row on the default path: the first ``batch_size`` of
    ``prompts`` (default: all of them) run at once (default mode, every step's checkpoint
    kept), the first row whose log-probs differ from its run alone (:func:`alone`) at a
    decode token (index ``>= 1``), and that token's forward re-run batched and alone with
    every layer recorded (:func:`workbench.verify.layers.localize`: ``.table`` has
    ``max_abs_delta`` per layer).
    ``None`` when every row's decode tokens are bit-equal to alone."""
    from .layers import localize

    reqs = [_request(p, max_tokens) for p in prompts[:batch_size]]
    sched = Scheduler(
        model,
        tokenizer,
        max_batch=max(len(reqs), 1),
        prefill_step_size=prefill_step_size,
        history_checkpoints=max_tokens + 2,
    )
    uids = [sched.submit(r) for r in reqs]
    sched.run()
    for u, r in zip(uids, reqs):
        diffs = compare_steps(
            (sched.tokens(u), sched.logprobs(u)),
            alone(model, tokenizer, r, prefill_step_size, batch_invariant=False),
            max_tokens,
        )
        later = [t for t in range(1, len(sched.tokens(u))) if diffs[t] in (DIFFERS, TOKEN_DIFFERS)]
        if later:
            return localize(sched, u, token=later[0])
    return None


def _request(p: Any, max_tokens: int) -> Request:
    if isinstance(p, list) and p and isinstance(p[0], dict):
        return Request(messages=p, max_tokens=max_tokens)
    return Request(prompt=p, max_tokens=max_tokens)


def audit(model: Any, tokenizer: Any, prompts: Sequence[Any], **grid_settings: Any) -> Audit:
    """The variance audit of ``model`` on this device: :func:`projection_findings`,
    :func:`attention_findings` (at the model's head shape and dtype),
    :func:`rowwise_findings` and :func:`end_to_end` of
    ``step_grids(model, tokenizer, prompts, **grid_settings)`` (:func:`step_grids`' settings:
    ``batch_sizes`` (default ``(8,)``), ``max_tokens`` (16), ``prefill_step_size`` (64),
    ``modes``).

    Raises:
        ValueError: fewer ``prompts`` than the largest batch size (:func:`step_grids`).
        TypeError: a keyword :func:`step_grids` does not take.

    >>> audit(model, tokenizer, prompts, batch_sizes=(4,)).end_to_end[("invariant", 4)]  # doctest: +SKIP
    (4, 4)
    """
    from ..runtime.device import device_report

    args = getattr(model, "args", None)
    heads = getattr(args, "num_attention_heads", 4)
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    head_dim = getattr(args, "head_dim", None) or getattr(args, "hidden_size", 128) // heads
    dtype = next(
        (
            m["weight"].dtype
            for _, m in model.named_modules()
            if isinstance(m, invariant.PROJECTIONS) and "scales" not in m
        ),
        mx.float32,
    )
    ops = projection_findings(model) + attention_findings(heads, kv_heads, head_dim, dtype=dtype)
    ops += rowwise_findings(dtype=dtype)
    grids = step_grids(model, tokenizer, prompts, **grid_settings)
    return Audit(device_report().text(), ops, end_to_end(grids))


# Shift-Tab / help() show step_grids' settings as audit's own parameters (its real signature).
audit.__signature__ = inspect.signature(step_grids).replace(return_annotation=Audit)  # type: ignore[attr-defined]


# -- the lesson of notebooks/15_batch_invariance.ipynb -----------------------------------


@dataclass(frozen=True)
class Lesson:
    """Everything :func:`lesson` measured on one BLAS: ``blas`` (``blas.STATUS.note``),
    ``library`` (the optimized BLAS loaded, ``None``: MLX's reference BLAS), ``grids``
    (:func:`step_grids`), ``ops`` (:func:`projection_findings` + :func:`attention_findings`),
    ``chunks`` (:func:`chunk_findings`), ``divergence`` (:func:`default_row_divergence`)."""

    blas: str
    library: str | None
    grids: list
    ops: list
    chunks: list
    divergence: Any


def lesson(
    prompts: Sequence[Any],
    long_prompt: Any,
    model_path: str | None = None,
    batch_sizes: Sequence[int] = (8, 32),
    max_tokens: int = 12,
    prefill_step_size: int = 64,
) -> Lesson:
    """The batch-invariance lesson on this process's BLAS for ``model_path`` (default: the
    bundled model): ``prompts`` run in batches of ``batch_sizes`` (``prompts[0]``, the
    request followed alone and among neighbours, is row 0), ``long_prompt`` prefilled in
    chunks of several sizes (:func:`chunk_findings`)."""
    from ..runtime import blas
    from ..runtime.loading import load

    model, tokenizer = load(model_path) if model_path else load()
    grids = step_grids(model, tokenizer, prompts, batch_sizes, max_tokens, prefill_step_size)
    ops = projection_findings(model) + attention_findings() + rowwise_findings()
    chunks = chunk_findings(model, tokenizer, _request(long_prompt, max_tokens))
    divergence = default_row_divergence(
        model, tokenizer, prompts, min(batch_sizes), max_tokens, prefill_step_size
    )
    return Lesson(blas.STATUS.note, blas.STATUS.library, grids, ops, chunks, divergence)


def lesson_with_optimized_blas(prompts: Sequence[Any], timeout_s: float = 300, **kwargs: Any) -> Lesson:
    """:func:`lesson` in a fresh Python process that loads the optimized BLAS users run
    with (``WORKBENCH_BLAS`` unset there: OpenBLAS or MKL, :mod:`workbench.runtime.blas`),
    for a process that runs MLX's reference BLAS itself (the test suite, nbval): waits for
    :func:`start_lesson_with_optimized_blas`'s process.

    Raises:
        RuntimeError: no optimized BLAS is installed (``blas.find_blas()`` is ``None``
            without ``WORKBENCH_BLAS``), or the process failed (its stderr's tail).
    """
    return start_lesson_with_optimized_blas(prompts, timeout_s, **kwargs).result()


class OptimizedBlasLesson:
    """A :func:`lesson` running in a process of its own with the optimized BLAS (started by
    :func:`start_lesson_with_optimized_blas`); :meth:`result` waits for it. Meanwhile this
    process is free, e.g. for the same lesson on its own BLAS:

    >>> users = start_lesson_with_optimized_blas(prompts, long_prompt=p)  # doctest: +SKIP
    >>> here = lesson(prompts, p)  # while the other process runs       # doctest: +SKIP
    >>> users = users.result()                                            # doctest: +SKIP
    """

    def __init__(self, process: Any, out: Any, err: Any, timeout_s: float):
        self.process, self.timeout_s = process, timeout_s
        self._out, self._err = out, err  # temporary files: the process never blocks on a full pipe

    @staticmethod
    def _read(file: Any) -> bytes:
        file.seek(0)
        with file:
            return file.read()

    @property
    def running(self) -> bool:
        """Whether the process has not finished yet."""
        return self.process.poll() is None

    def result(self) -> Lesson:
        """The process's :class:`Lesson` (waits up to ``timeout_s`` seconds from now).

        Raises:
            RuntimeError: the process failed (its stderr's tail) or ran past ``timeout_s``
                (it is then killed).
        """
        import pickle
        import subprocess

        try:
            self.process.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired as exc:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"the optimized-BLAS process ran past {self.timeout_s} s") from exc
        out, err = (self._read(f) for f in (self._out, self._err))
        if self.process.returncode != 0:
            raise RuntimeError(f"the optimized-BLAS process failed: {err.decode()[-2000:]}")
        return pickle.loads(out)


def start_lesson_with_optimized_blas(
    prompts: Sequence[Any], timeout_s: float = 300, **kwargs: Any
) -> OptimizedBlasLesson:
    """Start :func:`lesson` (``prompts`` and ``kwargs``, e.g. ``long_prompt=``) in a fresh
    Python process without ``WORKBENCH_BLAS``, which loads the optimized BLAS, and return
    at once; ``.result()`` waits for its :class:`Lesson` (at most ``timeout_s`` seconds).

    Raises:
        RuntimeError: no optimized BLAS is installed (``blas.find_blas()`` is ``None``
            without ``WORKBENCH_BLAS``).
    """
    import os

    from ..runtime.blas import INSTALL_HINT, find_blas

    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_BLAS"}
    saved = os.environ.pop("WORKBENCH_BLAS", None)
    try:
        found = find_blas()
    finally:
        if saved is not None:
            os.environ["WORKBENCH_BLAS"] = saved
    if found is None:
        raise RuntimeError(f"no optimized BLAS installed to compare with ({INSTALL_HINT})")
    return _start_lesson(env, prompts, timeout_s, kwargs)


def start_lesson_with_reference_blas(
    prompts: Sequence[Any], timeout_s: float = 300, **kwargs: Any
) -> OptimizedBlasLesson:
    """:func:`start_lesson_with_optimized_blas`'s twin for a process that runs the optimized
    BLAS itself (a JupyterLab kernel): the fresh process runs with ``WORKBENCH_BLAS=off``,
    MLX's bundled reference BLAS. Returns at once; ``.result()`` waits for its :class:`Lesson`."""
    import os

    return _start_lesson({**os.environ, "WORKBENCH_BLAS": "off"}, prompts, timeout_s, kwargs)


def _start_lesson(env: dict, prompts: Sequence[Any], timeout_s: float, kwargs: dict) -> OptimizedBlasLesson:
    """:func:`lesson` in a fresh Python process with environment ``env``."""
    import pickle
    import subprocess
    import sys
    import tempfile

    code = (
        "import pickle, sys\nfrom workbench.verify import invariance\n"
        "sys.stdout.buffer.write(pickle.dumps(invariance.lesson(**pickle.loads(sys.stdin.buffer.read()))))"
    )
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=out, stderr=err, env=env
    )
    process.stdin.write(pickle.dumps({"prompts": list(prompts), **kwargs}))
    process.stdin.close()  # the process reads its arguments to the end, then runs
    return OptimizedBlasLesson(process, out, err, timeout_s)


def lessons_on_both_blas(
    prompts: Sequence[Any], timeout_s: float = 300, **kwargs: Any
) -> tuple[Lesson, Lesson | None, str | None]:
    """:func:`lesson` on MLX's reference BLAS and on the optimized BLAS, each run once: the
    one this process has (``blas.STATUS``) here, the other at the same time in a fresh
    process (:func:`start_lesson_with_reference_blas` or
    :func:`start_lesson_with_optimized_blas`).

    Returns:
        ``(reference, optimized, note)``: ``optimized`` is ``None`` when no optimized BLAS
        is installed, and ``note`` then says so (the install hint); else ``note`` is ``None``.

    Raises:
        RuntimeError: the other process failed (its stderr's tail) or ran past ``timeout_s``.
    """
    from ..runtime import blas

    if blas.STATUS.library is not None:  # this process is on the optimized BLAS
        started = start_lesson_with_reference_blas(prompts, timeout_s, **kwargs)
        optimized = lesson(prompts, **kwargs)
        return started.result(), optimized, None
    try:
        started = start_lesson_with_optimized_blas(prompts, timeout_s, **kwargs)
    except RuntimeError as exc:
        return lesson(prompts, **kwargs), None, str(exc)
    reference = lesson(prompts, **kwargs)
    return reference, started.result(), None
