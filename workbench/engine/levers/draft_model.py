"""The draft model of speculative decoding: a second, smaller mlx-lm model sharing the
target's tokenizer, drafting greedily for every row with its own batch caches.

The draft caches (:class:`DraftCaches`, in ``Batch.draft``) follow the running rows by uid:
:meth:`DraftModel.propose` keeps rows whose draft cache holds a prefix of their context and
prefills the others alone, so joins, ``filter``, preemption and checkpoints need no hook.
Each row feeds what its draft cache lacks (one ``[B, N]`` forward), then ``k - 1`` more
``[B, 1]`` forwards draft ``k`` tokens; :meth:`DraftModel.settle` trims the rejected ones.
Mirrors mlx-lm's ``speculative_generate_step`` (``_draft_generate``, ``_rewind_cache``), per
row. Axis letters: ``B`` rows, ``N`` most tokens any row feeds, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..kv.cache_internals import clone_caches
from ..kv.trim import check_cache, trim_rows


@dataclass
class DraftCaches:
    """The draft model's batch caches and what each row holds.

    Attributes:
        uids: ``[B]`` the uid of each draft cache row.
        held: per row the tokens its draft cache holds.
        caches: per-layer ``BatchKVCache`` over ``B`` rows.
        fed: per row the drafts fed into its cache since the last :meth:`DraftModel.settle`.
    """

    uids: list[int]
    held: list[list[int]]
    caches: list[Any]
    fed: list[list[int]] = field(default_factory=list)

    def clone(self, share_appended: bool = False) -> "DraftCaches":
        """An independent copy sharing the cache buffers (``clone_caches``)."""
        return DraftCaches(
            list(self.uids),
            [list(h) for h in self.held],
            clone_caches(self.caches, share_appended),
            [list(f) for f in self.fed],
        )


def _prefix(held: Sequence[int], context: Sequence[int]) -> bool:
    return len(held) < len(context) and list(context[: len(held)]) == list(held)


@dataclass(frozen=True)
class DraftModel:
    """A draft mlx-lm model (``model``) prefilling in chunks of ``prefill_step_size`` tokens."""

    model: Any
    prefill_step_size: int = 2048

    @classmethod
    def of(cls, model: Any, vocab_size: int | None, prefill_step_size: int = 2048) -> "DraftModel":
        """Check ``model`` as a draft model and wrap it.

        Raises:
            ValueError: not an mlx-lm model (no ``layers``), another vocabulary size than the
                target's ``vocab_size``, or a layer cache other than ``KVCache``.
        """
        if not callable(model) or not hasattr(model, "layers"):
            raise ValueError(
                f"speculative must be None, 'prompt-lookup' or a draft mlx-lm model (mlx_lm.load), "
                f"got {type(model).__name__}"
            )
        size = getattr(getattr(model, "args", None), "vocab_size", None)
        if vocab_size is not None and size is not None and int(size) != int(vocab_size):
            raise ValueError(
                f"speculative: the draft model's vocab_size is {size}, the model's {vocab_size}; "
                "a draft model must share the tokenizer"
            )
        check_cache(model, "the draft model's")
        return cls(model, prefill_step_size)

    def _prefill(self, tokens: Sequence[int]) -> list[Any]:
        """A single-sequence cache holding ``tokens`` (chunks of ``prefill_step_size``)."""
        cache = make_prompt_cache(self.model)
        for i in range(0, len(tokens), self.prefill_step_size):
            self.model(mx.array(tokens[i : i + self.prefill_step_size], dtype=mx.uint32)[None], cache=cache)
            mx.eval([c.state for c in cache])
        return cache

    def follow(
        self, state: DraftCaches | None, uids: Sequence[int], contexts: Sequence[Sequence[int]]
    ) -> DraftCaches:
        """Draft caches whose rows are ``uids`` in order, each holding a proper prefix of its
        context (kept rows filtered, the others prefilled alone and joined)."""
        old = {u: i for i, u in enumerate(state.uids)} if state is not None else {}
        kept = [b for b, u in enumerate(uids) if u in old and _prefix(state.held[old[u]], contexts[b])]
        fresh = [b for b in range(len(uids)) if b not in kept]
        caches, held = None, {}
        if kept:
            caches = state.caches
            for c in caches:
                c.filter([old[uids[b]] for b in kept])
            held = {b: state.held[old[uids[b]]] for b in kept}
        if fresh:
            joiners = [
                type(layer[0]).merge(list(layer))
                for layer in zip(*(self._prefill(list(contexts[b][:-1])) for b in fresh))
            ]
            if caches is None:
                caches = joiners
            else:
                for mine, theirs in zip(caches, joiners):
                    mine.extend(theirs)
            held.update({b: list(contexts[b][:-1]) for b in fresh})
        order = kept + fresh
        if order != sorted(order):
            where = {b: i for i, b in enumerate(order)}
            for c in caches:
                c.filter([where[b] for b in range(len(uids))])
        return DraftCaches(list(uids), [held[b] for b in range(len(uids))], caches)

    def propose(self, batch: Any, contexts: Sequence[Sequence[int]], caps: Sequence[int]) -> list[list[int]]:
        """Each row's greedy drafts (at most ``caps[b]``), from the draft caches in
        ``batch.draft`` (made to follow the batch's rows first, :meth:`follow`).

        Args:
            batch: the running batch; ``batch.draft`` is replaced.
            contexts: per row its tokens (prompt, then generated).
            caps: per row the most drafts it takes.
        """
        state = self.follow(batch.draft, [r.uid for r in batch.rows], contexts)
        batch.draft = state
        missing = [list(c[len(h) :]) for c, h in zip(contexts, state.held)]
        N = max(len(m) for m in missing)
        inputs = mx.array([m + [m[-1]] * (N - len(m)) for m in missing], dtype=mx.uint32)  # [B, N]
        logits = self.model(inputs, cache=state.caches)  # [B, N, V]
        last = mx.array([len(m) - 1 for m in missing])
        token = mx.argmax(logits[mx.arange(len(missing)), last], axis=-1).astype(mx.uint32)  # [B]
        mx.eval(token)
        trim_rows(state.caches, [N - len(m) for m in missing])
        for h, m in zip(state.held, missing):
            h.extend(m)
        drafts = [token]
        for _ in range(max(caps) - 1):
            token = mx.argmax(self.model(token[:, None], cache=state.caches)[:, -1], axis=-1).astype(
                mx.uint32
            )
            drafts.append(token)
        rows = mx.stack(drafts, axis=1).tolist()  # [B, max(caps)]
        state.fed = [row[:-1] for row in rows]  # the last draft was never fed
        return [row[:n] for row, n in zip(rows, caps)]

    @staticmethod
    def settle(batch: Any, accepted: Sequence[int]) -> None:
        """Trim each row's fed drafts past ``accepted[b]``."""
        state = batch.draft
        if state is None or not state.fed:
            return
        keep = [min(a, len(f)) for a, f in zip(accepted, state.fed)]
        trim_rows(state.caches, [len(f) - a for a, f in zip(keep, state.fed)])
        for h, f, a in zip(state.held, state.fed, keep):
            h.extend(f[:a])
        state.fed = []
