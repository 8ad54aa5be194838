"""Prompt-cache reuse under batching, over mlx-lm's ``LRUPromptCache``
(``fetch_nearest_cache`` / ``insert_cache``).

At admission a joiner takes the longest cached prefix of the tokens it must prefill and
prefills only the uncached tail; when a row finishes its cache is extracted from the batch,
trimmed to the tokens it holds, and stored under them (prompt + generated). One
``LRUPromptCache`` may serve several schedulers (``Scheduler.fresh()`` shares it); its trie is
keyed by the model and everything else that shapes a cache (:func:`cache_key`), so a scheduler
only resumes entries its own prefill would have written. Notes: ``docs/lab/engine-notes.md``,
"kv/promptcache.py".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

from .cache_internals import clone_prompt_cache
from .caches import single_cache


def cache_key(model: Any, max_kv_size: int | None = None, **shaped_by: Any) -> str:
    """The key of ``model``'s entries in a shared ``LRUPromptCache``: module and id,
    ``max_kv_size`` and each ``shaped_by`` setting (stable ``repr``) in name order.
    Example: ``"mlx_lm.models.qwen3@7f2a max_kv_size=64 kv_quant=None"``."""
    parts = [f"{type(model).__module__}@{id(model):x}", f"max_kv_size={max_kv_size}"]
    return " ".join(parts + [f"{name}={shaped_by[name]!r}" for name in sorted(shaped_by)])


class PromptCache:
    """A per-scheduler view of an ``LRUPromptCache``.

    Args:
        model: the scheduler's model (fresh caches for misses).
        lru: an ``LRUPromptCache``, or an int: its ``max_size`` (entries).
        max_kv_size: as the scheduler's (fresh caches for misses).
        aligned: the batch-invariant mode's chunk length ``C`` (tokens): entries and hits are
            whole chunks (``[0, k C)``); ``None``: any prefix. Part of the key.
        **shaped_by: the other settings that change what caches hold (:func:`cache_key`).
    """

    def __init__(
        self,
        model: Any,
        lru: LRUPromptCache | int,
        max_kv_size: int | None = None,
        aligned: int | None = None,
        **shaped_by: Any,
    ):
        self.model = model
        self.aligned = aligned
        self.key = cache_key(model, max_kv_size, aligned=aligned, **shaped_by)
        self.lru = LRUPromptCache(max_size=lru) if isinstance(lru, int) else lru
        self.max_kv_size = max_kv_size

    def clone(self) -> "PromptCache":
        """An independent copy sharing the (never modified) entries."""
        out = PromptCache(self.model, clone_prompt_cache(self.lru), self.max_kv_size, self.aligned)
        out.key = self.key
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the stored entries (``LRUPromptCache.nbytes``)."""
        return int(self.lru.nbytes)

    def trim_to(self, n_bytes: int) -> int:
        """Drop LRU entries until at most ``n_bytes`` are stored (``LRUPromptCache.trim_to``);
        returns the bytes dropped."""
        before = self.nbytes
        if before > n_bytes:
            self.lru.trim_to(n_bytes=max(0, int(n_bytes)))
        return before - self.nbytes

    def key_of(self, adapter: str | None = None, first_forward: int | None = None) -> str:
        """The trie's key of entries computed with LoRA ``adapter`` and, quantized, a first
        forward of ``first_forward`` tokens on float keys (``None``: float cache)."""
        key = self.key if adapter is None else f"{self.key} adapter={adapter!r}"
        return key if first_forward is None else f"{key} first_forward={first_forward}"

    def fetch(
        self,
        tokens: Sequence[int],
        adapter: str | None = None,
        next_token: int | None = None,
        first_forward: int | None = None,
    ) -> tuple[list[Any], list[int]]:
        """``(single-sequence caches (copies), tokens still to prefill)`` for ``tokens``; a miss
        gives fresh caches and all of ``tokens``. A quantized row passes ``first_forward`` and
        ``next_token`` (the token its join forward feeds after ``tokens``)."""
        key = self.key_of(adapter, first_forward)
        cache, rest = self._nearest(key, list(tokens), next_token)
        hit = len(tokens) - len(rest)
        if cache is None or hit < (first_forward or 0):
            return single_cache(self.model, self.max_kv_size), list(tokens)
        if self.aligned:
            cut = hit % self.aligned
            if hit - cut == 0 or (cut and not can_trim_prompt_cache(cache)):
                return single_cache(self.model, self.max_kv_size), list(tokens)
            if cut:
                trim_prompt_cache(cache, cut)
            rest = list(tokens)[hit - cut :]
        return cache, list(rest)

    def _nearest(self, key: str, tokens: list[int], next_token: int | None) -> tuple[Any, list[int]]:
        """mlx-lm's ``fetch_nearest_cache``, asked for ``tokens + [next_token]`` when given."""
        if next_token is not None and not self.aligned:
            asked = [*tokens, int(next_token)]
            cache, rest = self.lru.fetch_nearest_cache(key, asked)
            if cache is not None and len(rest) < len(asked):
                if rest:
                    return cache, list(rest[:-1])
                if can_trim_prompt_cache(cache):
                    trim_prompt_cache(cache, 1)
                    return cache, []
        return self.lru.fetch_nearest_cache(key, tokens)

    def store(
        self,
        tokens: Sequence[int],
        caches: list[Any],
        extra_tokens: int,
        prefilled_tokens: int | None = None,
        adapter: str | None = None,
        first_forward: int | None = None,
    ) -> bool:
        """Store ``caches`` under ``tokens`` (``extra_tokens`` trimmed away first), keyed by
        :meth:`key_of`; False when they cannot be trimmed (or hold no whole aligned chunk)."""
        if self.aligned:
            keep = (
                (len(tokens) if prefilled_tokens is None else prefilled_tokens) // self.aligned * self.aligned
            )
            if keep == 0:
                return False
            extra_tokens += len(tokens) - keep
            tokens = list(tokens)[:keep]
        if extra_tokens:
            if not can_trim_prompt_cache(caches):
                return False
            trim_prompt_cache(caches, extra_tokens)
        self.lru.insert_cache(self.key_of(adapter, first_forward), list(tokens), caches)
        return True
