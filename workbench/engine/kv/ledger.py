"""The KV ledger: the bytes the engine's caches hold now, the projection admission checks
against ``kv_budget_bytes``, and the prompt cache trimmed to what the live batch leaves.

Knows: :class:`workbench.engine.checkpoint.EngineState` (the batch, the prefilling group,
the prompt cache), :mod:`workbench.engine.kv.allocation` (the projection), MLX's memory
counters. Must not know: the policy, events.

One ceiling for everything that holds KV bytes::

    batch caches (free slots included) + prefilling group's caches + prompt-cache entries
        + shared prompts <= kv_budget_bytes, between any two engine calls

Admission keeps the first two under it (:meth:`KVLedger.plan`); :meth:`KVLedger.make_room`
drops shared prompts and trims the prompt cache (mlx-lm's ``LRUPromptCache.trim_to``) to the
rest (when and in what order: ``docs/lab/engine-notes.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .allocation import KVPlan, RowTokens, plan_of, read_allocation


def joiner_tokens(s: Any) -> RowTokens:
    """A queued request (a :class:`~workbench.engine.state.RequestState`) as a joiner:
    its input tokens (prompt, plus generated tokens when resuming) and the most it may hold
    (prompt + ``max_tokens``)."""
    return RowTokens(s.uid, len(s.inputs), len(s.valid.prompt_ids) + s.valid.request.max_tokens)


def row_tokens(s: Any) -> RowTokens:
    """A running row: the tokens its cache holds and the most it may hold (what it holds,
    once finished)."""
    held = s.context_tokens
    return RowTokens(
        s.uid, held, held if s.finished else len(s.valid.prompt_ids) + s.valid.request.max_tokens
    )


@dataclass(frozen=True)
class Held:
    """Bytes held now: ``batch_bytes`` (the running batch's caches, free slots included),
    ``prefill_bytes`` (the prefilling group's caches), ``prompt_cache_bytes`` (the stored
    entries), ``shared_prompt_bytes`` (prompts held for queued ``submit_n`` samples); all
    the sum of the arrays' ``nbytes``."""

    batch_bytes: int
    prefill_bytes: int
    prompt_cache_bytes: int
    shared_prompt_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Everything the budget covers."""
        return self.batch_bytes + self.prefill_bytes + self.prompt_cache_bytes + self.shared_prompt_bytes


def measured_memory() -> tuple[int, int]:
    """``(active, peak)`` bytes MLX reports (``mx.get_active_memory()``,
    ``mx.get_peak_memory()``): every live array of the process, weights included."""
    return int(mx.get_active_memory()), int(mx.get_peak_memory())


class KVLedger:
    """The scheduler's byte books for one model and configuration.

    Args:
        profile: the model's ``kv_profile`` (:mod:`workbench.engine.kv.profile`).
        config: the scheduler's settings (a :class:`~workbench.engine.config.SchedulerConfig`),
            of which the ledger reads ``prefill_step_size``, ``kv_budget_bytes`` (the
            ceiling; ``None``: none) and ``reuse_slots`` (joiners may be written into free slots).
        exact_chunks: groups prefill in fixed chunks from fresh caches (no pacing, no
            prompt cache, float KV), so their growth is computed exactly.
        chunked_padding: right-padded groups run batched in chunks (``ModelRunner.chunks_padding``).
    """

    def __init__(
        self, profile: Sequence[Any], config: Any, exact_chunks: bool = True, chunked_padding: bool = False
    ):
        self.base = plan_of(
            profile,
            config.prefill_step_size,
            exact_chunks=exact_chunks,
            reuse_slots=config.reuse_slots,
            chunked_padding=chunked_padding,
        )
        self.config = config

    def plan(self, st: Any, held_prompts: bool = True, prompt_cache: bool = True) -> KVPlan:
        """The :class:`KVPlan` of engine state ``st`` now (its batch's allocation and rows;
        with a prompt cache, its entries bound the cached prefixes a joiner may copy; while
        a shared prompt is held or a prefilling member starts from one, groups are bounded
        as cached prefixes are, not computed exactly). ``held_prompts=False`` /
        ``prompt_cache=False``: as if the shared prompts / the prompt-cache entries had
        been dropped (what admission decides on once they yield)."""
        stored = 0
        if prompt_cache and st.prompt_cache is not None and self.base.full_token_bytes:
            stored = st.prompt_cache.nbytes // self.base.full_token_bytes
        starts = st.prefilling is not None and any(s.cached_tokens for s in st.prefilling.states)
        return dataclasses.replace(
            self.base,
            exact_chunks=self.base.exact_chunks and not ((held_prompts and st.shared_prompts) or starts),
            now=read_allocation(st.batch.caches),
            stored_tokens=stored,
            rows=tuple(row_tokens(r) for r in st.batch.rows),
        )

    def projected_bytes(self, st: Any) -> int:
        """Most bytes the batch and the prefilling group may hold from now on (0 when
        idle): what admission counted, re-read from the state now."""
        group = [joiner_tokens(s) for s in st.prefilling.states] if st.prefilling else []
        return self.plan(st).projected_bytes(group, started=bool(group))

    def alone_bytes(self, prompt_tokens: int, max_tokens: int) -> int:
        """Bytes one request of ``prompt_tokens`` + ``max_tokens`` may hold alone on an idle
        engine (what :meth:`refusal` compares with the budget)."""
        return _alone(self.base, prompt_tokens, max_tokens)

    def refusal(self, prompt_tokens: int, max_tokens: int) -> str:
        """Why a request can never be admitted under the budget (``""`` when it can)."""
        need = self.alone_bytes(prompt_tokens, max_tokens)
        budget = self.config.kv_budget_bytes
        if budget is None or need <= budget:
            return ""
        return (
            f"request projects {need:,} KV bytes (prompt {prompt_tokens} + max_tokens {max_tokens} tokens, "
            f"as mlx-lm's batch caches allocate them: 256-token growth steps) but kv_budget_bytes is "
            f"{budget:,}, so {budget:,} bytes are available even on an idle engine; it could never be admitted"
        )

    def held(self, st: Any) -> Held:
        """The bytes ``st``'s caches hold now."""
        return Held(
            read_allocation(st.batch.caches).nbytes,
            st.prefilling.prefill.kv_bytes if st.prefilling else 0,
            st.prompt_cache.nbytes if st.prompt_cache is not None else 0,
            shared_bytes(st),
        )

    def room_bytes(self, st: Any) -> int | None:
        """Bytes the budget leaves beside the projected live bytes, the prompt cache and the
        shared prompts now: what a new shared prompt may take (``None``: no budget)."""
        if self.config.kv_budget_bytes is None:
            return None
        held = self.held(st)
        return (
            self.config.kv_budget_bytes
            - self.projected_bytes(st)
            - held.prompt_cache_bytes
            - shared_bytes(st)
        )

    def make_room(self, st: Any, joiners: Sequence[Any] = (), dropped: Sequence[int] = ()) -> int:
        """Fit what may yield into ``budget - projected live bytes`` (the batch, the
        prefilling group, ``joiners`` about to prefill, rows ``dropped`` left out): the shared
        prompts are dropped when they alone do not fit, then the prompt cache is trimmed to
        what is left (mlx-lm's ``LRUPromptCache.trim_to(n_bytes=)``). Returns the bytes
        dropped (0 without a budget)."""
        if self.config.kv_budget_bytes is None or (st.prompt_cache is None and not st.shared_prompts):
            return 0
        group = [joiner_tokens(s) for s in list(joiners) + (st.prefilling.states if st.prefilling else [])]
        room = self.config.kv_budget_bytes - self.plan(st).projected_bytes(
            group, dropped, started=st.prefilling is not None
        )
        freed = 0
        if shared_bytes(st) > room:
            freed, st.shared_prompts = shared_bytes(st), {}
        if st.prompt_cache is not None:
            freed += st.prompt_cache.trim_to(room - shared_bytes(st))
        return freed


def shared_bytes(st: Any) -> int:
    """Bytes of the prompts ``st`` holds for queued ``submit_n`` samples
    (:mod:`workbench.engine.shared_prompts`)."""
    return sum(h.nbytes for h in st.shared_prompts.values())


def alone_bytes(
    model: Any,
    prompt_tokens: int,
    max_tokens: int,
    prefill_step_size: int = 2048,
    max_kv_size: int | None = None,
    exact_chunks: bool = True,
) -> int:
    """Bytes one request (``prompt_tokens`` + ``max_tokens``) may hold alone on an idle
    engine, as mlx-lm allocates its caches: the least ``kv_budget_bytes`` that admits it
    (e.g. tiny-llama, 20 + 8 tokens: 256 positions x 2,048 bytes = 524,288). Pass
    ``exact_chunks=False`` for a scheduler with a prompt cache, pacing or ``kv_bits`` (see
    :class:`KVLedger`). Builds the model's ``kv_profile`` (one probe forward)."""
    from .profile import kv_profile

    return _alone(
        plan_of(kv_profile(model, max_kv_size), prefill_step_size, exact_chunks=exact_chunks),
        prompt_tokens,
        max_tokens,
    )


def _alone(plan: KVPlan, prompt_tokens: int, max_tokens: int) -> int:
    return plan.projected_bytes([RowTokens(-1, prompt_tokens, prompt_tokens + max_tokens)])
