"""One decode forward re-run twice with every layer's output recorded: in its batch (from
a scheduler checkpoint) and alone (the row's context through mlx-lm's single-sequence
cache).

Knows: a :class:`~workbench.engine.checkpoint.Checkpoint`'s batch (rows, mlx-lm batch
caches, each row's pending token), mlx-lm's ``make_prompt_cache`` (through
:func:`workbench.verify.oracle.solo_cache`) and how ``generate_step`` fills it (the prompt
but its last token in chunks of ``prefill_step_size``, then one token per forward), and
the layer hooks of :mod:`workbench.verify.layer_hooks`. Must not know: how the scheduler
reached the checkpoint; it never changes the checkpoint or the scheduler.

Which forward: at a checkpoint (between two engine calls) every running row's cache
holds its prompt and its ``n`` read tokens, and its next token (index ``n``) is pending,
computed but unread. The next ``step()`` feeds that pending token ``[B, 1]`` and computes
the distribution of token ``n + 1``. That forward is the one re-run here, batched exactly
as ``step()`` runs it (free slots compacted first, as ``Batch.compact`` does) and alone
after rebuilding the row's cache from its prompt and tokens. The fed token sits at RoPE
position ``P = prompt length + n``.

Axis letters: ``B`` rows, ``T`` the row's positions ``0 .. P`` (its prompt, its tokens,
the fed token), ``V`` vocabulary, ``hidden`` the model width, ``K`` the keys and values
of one position side by side (``2 * n_kv_heads * head_dim``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from ..engine.checkpoint import Checkpoint
from .layer_hooks import recorded_layers
from .oracle import solo_cache


@dataclass(frozen=True)
class StepRecord:
    """What one row's forward produced, layer by layer (numpy, float32).

    Attributes:
        hidden: ``[n_layers, hidden]``, each layer's output at the fed position.
        kv: per layer, the row's cache after the forward as ``[T, K]`` (keys then values
            of each position, ``T = P + 1``), or ``None`` for a layer whose cache is not
            a full-attention ``KVCache`` on both sides (sliding-window, recurrent).
        logprobs: ``[V]``, the log-softmax of the final logits (natural log).
    """

    hidden: np.ndarray
    kv: list[np.ndarray | None]
    logprobs: np.ndarray


@dataclass(frozen=True)
class BatchedStep:
    """The batched side of the re-run: the row's :class:`StepRecord` and where it sat.

    Attributes:
        record: the row's record. row: its row in the (compacted) batch.
        batch_size: rows in the forward (``B``). fed_token: the token fed for the row.
        left_padding: the row's left padding in its first layer's cache (0 when that
            cache has none), positions.
    """

    record: StepRecord
    row: int
    batch_size: int
    fed_token: int
    left_padding: int


def _float32(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32))


def _kv_rows(caches: Sequence[Any]) -> list[np.ndarray | None]:
    """Each single-sequence layer cache's keys and values ``[T, K]`` (``None`` for a
    cache that is not exactly ``KVCache``)."""
    out = []
    for c in caches:
        if type(c) is not KVCache:
            out.append(None)
            continue
        keys, values = c.keys_and_values()  # [1, n_kv_heads, T, head_dim] each
        both = mx.concatenate([keys[0], values[0]], axis=0)  # [2 * n_kv_heads, T, head_dim]
        out.append(_float32(both.transpose(1, 0, 2).reshape(both.shape[1], -1)))
    return out


def _recorded_forward(model: Any, tokens: mx.array, caches: Sequence[Any]) -> tuple[list[mx.array], mx.array]:
    """Feed ``tokens`` ``[B]`` through ``model`` with ``caches`` (updated), recording each
    layer. Returns per layer its output ``[B, 1, hidden]`` and the logprobs ``[B, V]``."""
    with recorded_layers(model) as outputs:
        logits = model(tokens.reshape(-1, 1), cache=list(caches))[:, -1, :].astype(mx.float32)  # [B, V]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    per_layer = [outs[-1] for outs in outputs]
    mx.eval(per_layer, logprobs)
    return per_layer, logprobs


def batched_step(model: Any, checkpoint: Checkpoint, uid: int) -> BatchedStep:
    """Re-run the next decode forward of ``checkpoint``'s batch, recording every layer,
    and return row ``uid``'s part. Mirrors ``Scheduler.step`` (``Batch.compact`` then
    ``workbench.engine.forward.launch``'s ``model(tokens[:, None], cache=...)``) on a clone
    of the checkpoint's batch; the checkpoint is unchanged.

    Raises:
        ValueError: when ``uid`` holds no row of the checkpoint's batch.
    """
    batch = checkpoint.state.batch.clone(lambda s: s)
    uids = [r.uid for r in batch.rows]
    if uid not in uids:
        raise ValueError(
            f"uid {uid} holds no row of the batch at this checkpoint (rows: uids {uids}); "
            "localize a row while it runs"
        )
    batch.compact()
    b = uids.index(uid)
    tokens = batch.pending.tokens  # [B]
    outputs, logprobs = _recorded_forward(model, tokens, batch.caches)
    padding = getattr(batch.caches[0], "left_padding", None)
    record = StepRecord(
        hidden=np.stack([_float32(o[b, -1]) for o in outputs]),
        kv=_kv_rows(batch.extract(b)),
        logprobs=_float32(logprobs[b]),
    )
    return BatchedStep(
        record, b, len(uids), int(tokens[b].item()), 0 if padding is None else int(padding[b].item())
    )


def solo_step(
    model: Any,
    prompt_ids: Sequence[int],
    tokens: Sequence[int],
    fed_token: int,
    prefill_step_size: int = 2048,
    max_kv_size: int | None = None,
) -> StepRecord:
    """The same forward alone: the row's cache rebuilt as mlx-lm's ``generate_step`` builds
    it (``prompt_ids[:-1]`` in chunks of ``prefill_step_size``, then ``prompt_ids[-1]`` and
    each of ``tokens`` one forward each, into :func:`solo_cache`), then ``fed_token``
    ``[1, 1]`` fed with every layer recorded.

    Raises:
        ValueError: for an empty prompt.
    """
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    cache = solo_cache(model, max_kv_size)
    head = list(prompt_ids[:-1])
    for start in range(0, len(head), prefill_step_size):
        model(mx.array(head[start : start + prefill_step_size], dtype=mx.uint32)[None], cache=cache)
        mx.eval([c.state for c in cache])
    for token in [prompt_ids[-1], *tokens]:
        model(mx.array([[token]], dtype=mx.uint32), cache=cache)
        mx.eval([c.state for c in cache])
    outputs, logprobs = _recorded_forward(model, mx.array([fed_token], dtype=mx.uint32), cache)
    return StepRecord(
        hidden=np.stack([_float32(o[0, -1]) for o in outputs]),
        kv=_kv_rows(cache),
        logprobs=_float32(logprobs[0]),
    )
