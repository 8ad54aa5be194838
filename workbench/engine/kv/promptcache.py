"""Prompt-cache reuse under batching, over mlx-lm's ``LRUPromptCache``.

Knows: mlx-lm's ``LRUPromptCache`` (``fetch_nearest_cache`` / ``insert_cache``), cache
``extract`` and ``trim``. Must not know: the queue, events.

At admission a joiner takes the longest cached prefix of the tokens it must prefill and
prefills only the uncached tail; when a row finishes its cache is extracted from the
batch (``extract``), trimmed to the tokens it really holds, and stored under those
tokens (prompt + generated).

One ``LRUPromptCache`` may serve several schedulers (``Scheduler.fresh()`` shares it). Its
trie is partitioned by a key (mlx-lm's "model" key): ours is the model *and everything
else that shapes what a cache holds* (:func:`cache_key`: the window ``max_kv_size``, the
KV quantization, the adapters, the decode fast paths whose numerics differ), so a
scheduler only ever resumes entries that its own prefill would have written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

from .cache_internals import clone_prompt_cache
from .caches import single_cache


def cache_key(model: Any, max_kv_size: int | None = None, **shaped_by: Any) -> str:
    """The key of ``model``'s entries in a shared ``LRUPromptCache`` (mlx-lm partitions its
    trie by a hashable model key): the model's module and id, its window ``max_kv_size``
    (tokens; ``None``: full attention), and every other setting in ``shaped_by`` (name ->
    a value with a stable ``repr``, e.g. ``kv_quant=KVQuant(4, 32)``), in name order.
    Example: ``"mlx_lm.models.qwen3@7f2a max_kv_size=64 kv_quant=None"``."""
    parts = [f"{type(model).__module__}@{id(model):x}", f"max_kv_size={max_kv_size}"]
    return " ".join(parts + [f"{name}={shaped_by[name]!r}" for name in sorted(shaped_by)])


class PromptCache:
    """A per-scheduler view of an ``LRUPromptCache``.

    Args:
        model: the scheduler's model (fresh caches for misses).
        lru: an ``LRUPromptCache``, or an int: its ``max_size`` (entries).
        max_kv_size: as the scheduler's (fresh caches for misses).
        aligned: the batch-invariant mode's chunk length ``C`` (tokens): entries hold only
            whole prefill chunks of their prompt (``[0, k C)``, computed as the prompt alone
            computes them) and a hit is cut to a multiple of ``C``, so the tail prefills in
            the chunks it runs alone; ``None`` (default): any prefix. Part of the key.
        **shaped_by: the scheduler's other settings that change what its caches hold
            (see :func:`cache_key`, which keys the trie with them and ``max_kv_size``).
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
        """An independent copy: the same model key, a copy of the LRU's index sharing its
        (never modified) entries (:func:`workbench.engine.kv.cache_internals.clone_prompt_cache`)."""
        out = PromptCache(self.model, clone_prompt_cache(self.lru), self.max_kv_size, self.aligned)
        out.key = self.key
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the stored entries (mlx-lm's ``LRUPromptCache.nbytes``: the sum of their
        caches' ``nbytes``)."""
        return int(self.lru.nbytes)

    def trim_to(self, n_bytes: int) -> int:
        """Drop least-recently-used entries until at most ``n_bytes`` (``< 0`` counts as 0)
        are stored (mlx-lm's ``LRUPromptCache.trim_to(n_bytes=)``). Returns the bytes dropped."""
        before = self.nbytes
        if before > n_bytes:
            self.lru.trim_to(n_bytes=max(0, int(n_bytes)))
        return before - self.nbytes

    def key_of(self, adapter: str | None = None, first_forward: int | None = None) -> str:
        """The trie's key of entries computed with LoRA ``adapter`` (``None``: the base
        model): a cached prefix holds the keys and values of the adapter it ran with, so a
        row only fetches what its own adapter computed. ``first_forward``: with a quantized
        cache, the tokens its row's first forward ran on float keys (``None``: a float
        cache), so a row only fetches a prefix whose float forward was its own."""
        key = self.key if adapter is None else f"{self.key} adapter={adapter!r}"
        return key if first_forward is None else f"{key} first_forward={first_forward}"

    def fetch(
        self,
        tokens: Sequence[int],
        adapter: str | None = None,
        next_token: int | None = None,
        first_forward: int | None = None,
    ) -> tuple[list[Any], list[int]]:
        """``(single-sequence caches, tokens still to prefill)`` for ``tokens`` computed with
        ``adapter`` (:meth:`key_of`); a miss gives fresh caches and all of ``tokens``. The
        caches are copies.

        A quantized cache's row passes ``first_forward`` (the tokens its first forward runs
        on float keys, :func:`workbench.engine.levers.quantized_prefill.first_forward_tokens`)
        and ``next_token`` (the token its join forward feeds after ``tokens``): it fetches only
        entries whose first forward covered as many tokens, and only a hit of at least that
        many (else a miss), so the prefix holds what its own prefill would compute; and mlx-lm's
        ``fetch_nearest_cache``, which leaves one token of what it is asked for uncached, is
        asked for ``tokens + [next_token]``, so a longer entry can cover all of ``tokens`` (an
        entry of exactly those tokens is trimmed back by one)."""
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
        """mlx-lm's ``fetch_nearest_cache(key, tokens)`` (a copy, or ``None``; the tokens it
        leaves), asked for ``tokens + [next_token]`` first when ``next_token`` is given (see
        :meth:`fetch`)."""
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
        """Store single-sequence ``caches`` holding ``tokens`` plus ``extra_tokens`` fed
        after them (trimmed away first), computed with ``adapter`` and, quantized, a first
        forward of ``first_forward`` tokens on float keys (:meth:`key_of`).
        Returns False when they cannot be trimmed (or,
        :attr:`aligned`, when the first ``prefilled_tokens`` hold no whole chunk)."""
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
