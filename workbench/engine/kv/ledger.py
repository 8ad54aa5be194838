"""The KV ledger: the bytes the engine's caches hold now, the projection admission checks
against ``kv_budget_bytes``, and the prompt cache trimmed to what the live batch leaves.

One ceiling for everything that holds KV bytes::

    batch caches (free slots included) + prefilling group's caches + prompt-cache entries
        + shared prompts <= kv_budget_bytes, between any two engine calls

Admission keeps the first two under it (:meth:`KVLedger.plan`); :meth:`KVLedger.make_room`
drops shared prompts and trims the prompt cache (mlx-lm's ``LRUPromptCache.trim_to``) to the
rest (when and in what order: ``docs/lab/engine-notes.md``, "kv/ledger.py").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .allocation import KVPlan, RowTokens, plan_of, read_allocation


def joiner_tokens(s: Any) -> RowTokens:
    """A queued request as a joiner: its input tokens and the most it may hold."""
    return RowTokens(s.uid, len(s.inputs), len(s.valid.prompt_ids) + s.valid.request.max_tokens)


def row_tokens(s: Any) -> RowTokens:
    """A running row: the tokens its cache holds and the most it may hold."""
    held = s.context_tokens
    return RowTokens(
        s.uid, held, held if s.finished else len(s.valid.prompt_ids) + s.valid.request.max_tokens
    )


@dataclass(frozen=True)
class Held:
    """Bytes (``nbytes``) held now: ``batch_bytes`` (free slots included), ``prefill_bytes``,
    ``prompt_cache_bytes``, ``shared_prompt_bytes``."""

    batch_bytes: int
    prefill_bytes: int
    prompt_cache_bytes: int
    shared_prompt_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Everything the budget covers."""
        return self.batch_bytes + self.prefill_bytes + self.prompt_cache_bytes + self.shared_prompt_bytes


def measured_memory() -> tuple[int, int]:
    """``(active, peak)`` bytes MLX reports for the whole process, weights included."""
    return int(mx.get_active_memory()), int(mx.get_peak_memory())


class KVLedger:
    """The scheduler's byte books for one model and configuration.

    Args:
        profile: the model's ``kv_profile`` (:mod:`workbench.engine.kv.profile`).
        config: the scheduler's settings (``prefill_step_size``, ``kv_budget_bytes``, ``reuse_slots``).
        exact_chunks: fixed chunks from fresh caches (no pacing, prompt cache, or ``kv_bits``).
        chunked_padding: right-padded groups run batched in chunks.
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
        """The :class:`KVPlan` of engine state ``st`` now; ``held_prompts=False`` /
        ``prompt_cache=False``: as if those had yielded."""
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
        """Most bytes the batch and the prefilling group may hold from now on (0: idle)."""
        group = [joiner_tokens(s) for s in st.prefilling.states] if st.prefilling else []
        return self.plan(st).projected_bytes(group, started=bool(group))

    def alone_bytes(self, prompt_tokens: int, max_tokens: int) -> int:
        """Bytes one request may hold alone on an idle engine (see :func:`alone_bytes`)."""
        return _alone(self.base, prompt_tokens, max_tokens)

    def refusal(self, prompt_tokens: int, max_tokens: int) -> str:
        """Why a request can never be admitted under the budget (``""`` when it can)."""
        need = self.alone_bytes(prompt_tokens, max_tokens)
        budget = self.config.kv_budget_bytes
        if budget is None or need <= budget:
            return ""
        why = (
            ""
            if self.base.exact_chunks
            else "; with pacing, a prompt cache or kv_bits a prefill need not start on the chunk grid, "
            "so the projection takes its larger chunks"
        )
        return (
            f"request projects {need:,} KV bytes (prompt {prompt_tokens} + max_tokens {max_tokens} tokens, "
            f"as mlx-lm's batch caches allocate them: 256-token growth steps{why}) but kv_budget_bytes is "
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
        """Bytes the budget leaves for a new shared prompt now (``None``: no budget)."""
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
        """Fit shared prompts and the prompt cache into ``budget - projected live bytes`` (with
        ``joiners``, without rows ``dropped``); returns the bytes dropped."""
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
    """Bytes of the prompts ``st`` holds for queued ``submit_n`` samples."""
    return sum(h.nbytes for h in st.shared_prompts.values())


def alone_bytes(
    model: Any,
    prompt_tokens: int,
    max_tokens: int,
    prefill_step_size: int = 2048,
    max_kv_size: int | None = None,
    exact_chunks: bool = True,
) -> int:
    """The least ``kv_budget_bytes`` that admits one request alone on an idle engine (e.g.
    tiny-llama, 20 + 8 tokens: 256 positions x 2,048 bytes = 524,288); one probe forward."""
    from .profile import kv_profile

    return _alone(
        plan_of(kv_profile(model, max_kv_size), prefill_step_size, exact_chunks=exact_chunks),
        prompt_tokens,
        max_tokens,
    )


def _alone(plan: KVPlan, prompt_tokens: int, max_tokens: int) -> int:
    return plan.projected_bytes([RowTokens(-1, prompt_tokens, prompt_tokens + max_tokens)])
