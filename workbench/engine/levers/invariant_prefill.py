"""The batch-invariant mode's prefill of several prompts in one forward: each prompt's next
chunk of exactly ``prefill_step_size`` tokens, every row's bits those of its prefill alone.

Knows: :class:`~workbench.engine.levers.invariant_preempt.ReplayPrefillGroup` (subclassed:
its chunk schedule and its replay of a resumed row's decode steps),
:mod:`~workbench.engine.levers.invariant`'s row blocks (:func:`~.invariant.blocked`),
mlx-lm's single-sequence ``KVCache`` and ``mx.fast.scaled_dot_product_attention``. Must not
know: requests, the queue, events.

The mode's alone prefill is this path too (a group of one), so a prompt computes the same
bits whatever else prefills beside it:

- **projections** run in the mode's row blocks (:func:`~.invariant.blocked`, the plan of
  :func:`prefill_plan`): within a calibrated block a row's bits do not depend on its
  neighbours, its place in the call or the call's row count, so the ``B' x C`` rows of a
  forward get the bits each gets in the prompt's forward alone (``1 x C`` rows);
- **attention** runs per prompt (:class:`PromptChunks`): its chunk's queries over its own
  single-sequence cache's keys, causally, one ``mx.fast.scaled_dot_product_attention`` call of
  the shapes it has alone (queries made contiguous, keys as its ``KVCache`` returns them);
- **RoPE** at each prompt's own offset (``offset`` an ``[B']`` array, the call alone makes
  with ``[1]``); norms, the MLP and the residuals are row-wise;
- **the chunk schedule** is the alone one: chunk ``j`` of a prompt is its tail's tokens
  ``[j * C, (j + 1) * C)``, so each chunk attends the keys it attends alone.

Example, ``C = 8``, tails of 3, 8 and 19 tokens: three forwards instead of five, the rows
right-padded to the longest chunk in each (a projection runs only the real rows, unless
:data:`REAL_ROWS_ONLY` says otherwise; padding is never attended or stored)::

    forward 1  [3, 8]   rows: a[0:3]+pad, b[0:8], c[0:8]
    forward 2  [1, 8]   rows: c[8:16]
    forward 3  [1, 3]   rows: c[16:19]

A resumed row's replayed tail (its decode steps, :mod:`.invariant_preempt`) runs after its
chunks, one token per forward, as before. Axis letters: ``B'`` prompts in a forward, ``C``
the longest chunk among them, ``H`` query heads, ``D`` head dim.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from ..kv import caches as kv
from ..model_hooks import hooks_of
from . import invariant
from . import invariant_prefill_attention as prefill_attention
from .invariant import ROW_BLOCKS, Invariance, RowBlocks, blocked, rows_agree
from .invariant_preempt import ReplayPrefillGroup

_PREFILL_BLOCKS: dict = {}  # (backend, signature) -> RowBlocks or None, off the CPU

# A prefill's first choice of row blocks off the CPU, before :func:`~.invariant.clean_range`
# cuts it: on an H100 (mlx 0.32.4, bf16, 2026-12-07, ``scripts/lab/gpu_batched_blocks.py``) the
# 1B-shaped llama's projections of K = 2048 kept a row's bits in one call of up to 1,400 rows
# (sampled), where the decode step's ``RowBlocks(2, 256)`` cut a 1,218-row prefill into 5 calls;
# its ``down_proj`` (K = 8192) stays at its clean range (72 rows), batched or not.
# Quantized weights keep the decode step's ``RowBlocks(8, 256)`` (then fixed calls of 512 rows):
# ``RowBlocks(8, 2048)`` took SmolLM2-135M's 4-bit prefill of 16 prompts on an H100 from 1.57x to
# 1.26x the default path's, every row bit-equal alone (2026-12-07, ``scripts/lab/quantized_prefill_ab.py``),
# but its calibration (``clean_range`` to 2,048 rows, the tied read-out of 49,152 outputs included)
# runs at the first prefill and was not timed: not adopted until it is.
PREFILL_ROW_BLOCKS: dict[tuple[str, str], RowBlocks] = {("cuda", "half"): RowBlocks(2, 2048)}
# Where that range is cut below this many rows (``down_proj`` at 72: a prefill of 5,000 rows
# would be 70 calls), a prefill runs fixed calls of exactly this many rows instead (the last one
# zero-padded), if every row of such a call keeps its bits wherever it sits and whatever its
# neighbours (:func:`fixed_block_holds`). 512 rows of a 1B ``down_proj`` cost the GPU ~0.03 ms.
PREFILL_FIXED_ROWS: dict[str, int] = {"cuda": 512, "metal": 512}
# Where a prefill forward projects only its real rows (the padding gathered out, the outputs
# gathered back, a padding position a copy of its row's last real token): the CPU, compute-bound,
# where padding rows would be matmul rows (16 prompts of 160-486 tokens: 7,776 rows against
# 5,100); there the gather back (not zeros and a scatter) took the prefill of 4 / 16 prompts
# from 1.08x, 1.09x / 1.04x, 1.07x to 1.02x, 1.03x / 1.00x, 0.99x the default path (llama-155m,
# 2026-12-07). Off it the padding rows are projected too (finite values no real query attends, as
# the default path's padded prefill): no gathers, fewer nodes for a host-bound GPU. On an H100
# (1B bf16, one process, ``scripts/lab/invariant_prefill_profile.py``) projecting the padding
# took the mode's prefill from 1.25x / 1.37x / 1.24x to 1.02x / 1.11x / 0.98x the default path's
# at 4 / 16 / 64 prompts (Metal follows CUDA here, unmeasured). The rows keep their bits either way.
REAL_ROWS_ONLY = {"cpu"}
PERMUTATIONS = 4  # fixed_block_holds: each row checked at this many other places besides its own


def serves(model: Any, max_kv_size: int | None = None) -> bool:
    """Whether ``model`` prefills in the mode's batched forwards: every layer's
    single-sequence cache is mlx-lm's plain ``KVCache`` (full attention: no ring, no
    recurrent state) and its attention layers are hooked (:mod:`workbench.engine.model_hooks`).
    Other models prefill each prompt alone (:class:`ReplayPrefillGroup`)."""
    plain = all(type(c) is KVCache for c in kv.single_cache(model, max_kv_size))
    return plain and hooks_of(model, projections=True).attention_hooked


def prefill_plan(inv: Invariance, module: Any) -> tuple[RowBlocks | None, Any]:
    """``(blocks, rows_apart)`` of ``module`` for :func:`~.invariant.blocked` in a prefill
    forward. On the CPU the decode step's (:meth:`Invariance.plan_for`). Off the CPU a
    prefill's ``B' x C`` rows (thousands) run in the device's prefill blocks
    (:data:`PREFILL_ROW_BLOCKS`, else :data:`~.invariant.ROW_BLOCKS`: e.g. ``RowBlocks(2,
    2048)`` for bf16 on CUDA, where the decode step keeps ``RowBlocks(2, 256)``), cut to a
    clean range (:func:`~.invariant.clean_range`) and checked (:func:`~.invariant.rows_agree`)
    once per projection shape; a range cut short runs fixed calls of
    :data:`PREFILL_FIXED_ROWS` rows where they hold (:func:`fixed_block_holds`); where the
    checks fail, the decode step's plan. Prefill bits
    need not be the decode step's, only the same alone and batched (every prompt's prefill
    runs this plan, alone or beside others)."""
    blocks, apart = inv.plan_for(module)
    if inv.backend == "cpu":
        return blocks, apart
    key = (inv.backend, invariant.signature(module))
    if key not in _PREFILL_BLOCKS:
        _PREFILL_BLOCKS[key] = _device_blocks(module, inv.backend)
    found = _PREFILL_BLOCKS[key]
    return (blocks, apart) if found is None else (found, None)


def _device_blocks(module: Any, backend: str) -> RowBlocks | None:
    """The device's prefill row blocks for ``module`` (:func:`prefill_plan`), or ``None``
    where they do not keep a row's bits."""
    kind = invariant._kind(module)
    first = PREFILL_ROW_BLOCKS.get((backend, kind), ROW_BLOCKS.get((backend, kind)))
    if first is None:
        return None
    f, K = invariant._plain_call(module), invariant._in_features(module)
    dtype = module["scales"].dtype if "scales" in module else module["weight"].dtype
    if first.max_rows > first.min_rows:
        first = invariant.clean_range(f, K, dtype, first)
    fixed = PREFILL_FIXED_ROWS.get(backend, 0)
    if first.max_rows < fixed and fixed_block_holds(f, K, dtype, fixed):
        return RowBlocks(fixed, fixed)
    return first if rows_agree(f, K, dtype, first) else None


def fixed_block_holds(f: Any, K: int, dtype: Any, rows: int, permutations: int | None = None) -> bool:
    """Whether ``f`` (a projection ``[M, K] -> [M, N]``) run as calls of exactly ``rows`` rows
    gives every row the same bits wherever it sits in the call and whatever its neighbours:
    one call over ``rows`` random rows, then ``permutations`` calls over the same rows shuffled
    (:data:`PERMUTATIONS`; each row compared at its new place), and :func:`~.invariant.rows_agree`'s
    rows alone (zero-padded to ``rows``). Every row is checked, not three: a kernel that splits
    its work by tile (stream-K) can round a tile's rows otherwise. Evidence, not proof.

    Raises:
        nothing: a mismatch is ``False``."""
    x = mx.random.normal((rows, K), key=mx.random.key(17)).astype(dtype)  # [rows, K]
    y = f(x)
    for i in range(PERMUTATIONS if permutations is None else permutations):
        order = mx.random.permutation(rows, key=mx.random.key(31 + i))
        if not mx.array_equal(f(x[order]), y[order]).item():
            return False
    return rows_agree(f, K, dtype, RowBlocks(rows, rows))


@contextlib.contextmanager
def prefill_forward(model: Any, inv: Invariance, lengths: Sequence[int] | None = None) -> Iterator[None]:
    """Within the block a forward of ``model`` over :class:`PromptChunks` caches runs its
    projections in :func:`prefill_plan`'s row blocks; its attention is each cache's own
    (:meth:`PromptChunks.attend`). ``lengths``: ``[B']`` each row's real tokens of the
    ``[B', C]`` input; a projection then runs only those rows (gathered; each padding
    position's output a copy of its row's last real one: finite, never attended nor stored)
    on a backend in :data:`REAL_ROWS_ONLY`, so padding costs no matmul rows and no extra
    blocks there. Attention with sinks
    (which the seam does not take) is refused: ``RuntimeError`` naming the mode."""
    keep, spread = _real_rows(lengths) if lengths and inv.backend in REAL_ROWS_ONLY else (None, None)
    last: list = [None, None]  # (input, its real rows): q / k / v and gate / up read one input

    def project(module: Any, plain: Any, x: mx.array) -> mx.array:
        blocks, apart = prefill_plan(inv, module)
        lead, K = x.shape[:-1], x.shape[-1]
        if keep is None or math.prod(lead) != len(lengths) * max(lengths):
            return blocked(lambda b: plain(module, b), x, blocks, apart)
        if last[0] is not x:
            last[:] = [x, x.reshape(-1, K)[keep]]  # [T, K], gathered once per input
        y = blocked(lambda b: plain(module, b), last[1], blocks, apart)  # [T, N]
        return y[spread].reshape(*lead, y.shape[-1])  # [B', C, N]: a gather, no zeros nor scatter

    def refuse(*args: Any, **kwargs: Any) -> mx.array:
        raise RuntimeError("the batch-invariant mode's batched prefill has no attention with sinks")

    with hooks_of(model, projections=True).using(projections=project, attention=refuse):
        yield


def _real_rows(lengths: Sequence[int]) -> tuple[mx.array | None, mx.array | None]:
    """``(keep, spread)`` of a right-padded ``[B', C]`` input (``C`` the longest of
    ``lengths``): ``keep`` ``[T]`` the flat indices of its ``T`` real tokens, ``spread``
    ``[B' * C]`` for each flat position the index in ``keep`` of its own token, or of its row's
    last real token for a padding position (``y[spread]`` takes ``[T, N]`` back to ``[B' * C,
    N]``: a gather, which MLX runs several times faster than zeros and a scatter); ``(None,
    None)`` where no row is padded."""
    C = max(lengths)
    if all(n == C for n in lengths):
        return None, None
    keep = [b * C + j for b, n in enumerate(lengths) for j in range(n)]
    spread, first = [], 0
    for n in lengths:
        spread += range(first, first + n)
        spread += [first + n - 1] * (C - n)
        first += n
    return mx.array(keep, dtype=mx.int32), mx.array(spread, dtype=mx.int32)


class PromptChunks:
    """One layer's cache for a forward of several prompts' chunks ``[B', C]``: row ``b``
    writes its first ``lengths[b]`` positions into its own single-sequence ``KVCache`` and
    attends that cache alone (:meth:`attend`, the seam :class:`~workbench.engine.model_hooks.ModelHooks`
    calls instead of the model file's attention).

    Args:
        rows: ``[B']`` each prompt's ``KVCache`` of this layer (written in place).
        lengths: ``[B']`` each prompt's chunk length (``1 .. C``; the rest is padding).
        backend: the device (``"cuda"``, ``"metal"``, ``"cpu"``) whose fused attention may
            take rows of one offset in one call (:mod:`.invariant_prefill_attention`);
            ``None``: every row attends alone.

    Attributes:
        offset: ``[B']`` int32, the tokens each row's cache holds before this forward (RoPE).

    Raises:
        TypeError: a row's cache is not a plain ``KVCache``.
    """

    def __init__(self, rows: Sequence[Any], lengths: Sequence[int], backend: str | None = None):
        bad = [type(c).__name__ for c in rows if type(c) is not KVCache]
        if bad:
            raise TypeError(f"the mode's batched prefill writes KVCache layers only, got {bad}")
        self.rows, self.lengths, self.backend = list(rows), list(lengths), backend
        self.offsets = [c.offset for c in rows]  # [B'] ints
        self.offset = mx.array(self.offsets, dtype=mx.int32)  # [B']
        self._fetched: list[tuple[mx.array, mx.array]] = []
        self._fresh: tuple[mx.array, mx.array] | None = None

    def make_mask(self, *args: Any, **kwargs: Any) -> None:
        """No mask: :meth:`attend` masks each row causally on its own keys."""
        return None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write row ``b``'s first ``lengths[b]`` positions of ``keys``, ``values`` ``[B',
        n_kv_heads, C, D]`` into its cache; returns them unchanged (:meth:`attend` reads the
        caches)."""
        self._fetched = [
            _write(c, keys[b : b + 1, :, :n], values[b : b + 1, :, :n])
            for b, (c, n) in enumerate(zip(self.rows, self.lengths))
        ]
        self._fresh = (keys, values)
        return keys, values

    def attend(self, queries: mx.array, scale: float) -> mx.array:
        """``[B', H, C, D]``: row ``b``'s ``lengths[b]`` queries over its own cache's keys,
        causally (no mask for one query). Rows of one offset share one
        ``mx.fast.scaled_dot_product_attention`` call where the device keeps each row's bits
        that way (:mod:`.invariant_prefill_attention`); any other row calls it as its prefill
        alone does. A padding position is zeros (alone) or finite and never read (shared)."""
        n_q, D = queries.shape[1], queries.shape[3]
        batched = self.backend is not None and prefill_attention.batched_attention_holds(
            self.backend, n_q, self._fresh[0].shape[1], D, queries.dtype
        )
        return prefill_attention.attend(
            queries, self._fresh, self._fetched, self.offsets, self.lengths, scale, batched
        )


def _write(cache: KVCache, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
    """``cache.update_and_fetch(keys, values)`` (``[1, n_kv_heads, n, D]``); an empty cache
    takes row-contiguous copies of exactly ``n`` positions instead of zeroed buffers of
    mlx-lm's 256-token steps written into (two graph nodes a layer, not six: the same values;
    a later chunk grows them as ``update_and_fetch`` does from mlx-lm's buffer: where that
    chunk fits the buffer of ``step`` multiples mlx-lm's first write made, the copies take its
    zeroed rest first, so the cache holds never more positions than mlx-lm's and the KV ledger
    (:func:`~workbench.engine.kv.allocation.group_capacity_tokens`, which counts mlx-lm's
    growth) still bounds the bytes held)."""
    if cache.keys is not None:
        held, n = cache.offset, keys.shape[2]
        rest = -held % cache.step  # positions mlx-lm's buffer holds past the exact copies
        if cache.keys.shape[2] == held and 0 < n <= rest:
            cache.keys, cache.values = (
                prefill_attention.padded([a], held + rest) for a in (cache.keys, cache.values)
            )
        return cache.update_and_fetch(keys, values)
    cache.keys, cache.values, cache.offset = mx.contiguous(keys), mx.contiguous(values), keys.shape[2]
    return cache.keys, cache.values


class BatchedReplayPrefillGroup(ReplayPrefillGroup):
    """:class:`ReplayPrefillGroup` whose prompts' chunks run together: each
    :meth:`run_chunk` is one forward of the next chunk of every row with prompt chunks left
    (see the module docstring); then each resumed row's replayed tokens as before.

    Args:
        as :class:`ReplayPrefillGroup` (``caches``: per row single-sequence ``KVCache`` layers).

    Attributes:
        forwards: model forwards run so far (chunks and replayed tokens).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        self._done_tokens: list[int] = []
        super().__init__(*args, **kwargs)
        self._done_tokens = [0] * len(self.prompts)
        self.forwards = 0

    @property
    def rows_done_tokens(self) -> list[int]:
        """Per row, its tail tokens already in its cache."""
        return list(self.lengths) if self.done else list(self._done_tokens)

    def clone(self, share_appended: bool = False) -> "BatchedReplayPrefillGroup":
        """An independent copy (see :meth:`PrefillGroup.clone`)."""
        out = super().clone(share_appended)
        out._done_tokens = list(self._done_tokens)
        return out

    def _chunked(self, b: int) -> int:
        """Row ``b``'s tail tokens that prefill in chunks (the rest replay)."""
        return self.lengths[b] - self.replay[b]

    def _chunk_rows(self) -> list[int]:
        return [b for b, k in enumerate(self._done_tokens) if k < self._chunked(b)]

    def next_rows(self) -> list[int]:
        """The rows the next :meth:`run_chunk` runs: every row with a chunk left, else the
        first with replayed tokens left; ``[]`` once done."""
        if self.done:
            return []
        rows = self._chunk_rows()
        return rows or [next(b for b, k in enumerate(self._done_tokens) if k < self.lengths[b])]

    def next_chunk(self) -> tuple[int, int, int]:
        """``(rows, start, remaining)``: the rows of the next forward, the most tokens one of
        them holds, the most it has left; ``(0, 0, 0)`` once done."""
        rows = self.next_rows()
        if not rows:
            return 0, 0, 0
        done = [self._done_tokens[b] for b in rows]
        return len(rows), max(done), max(self.lengths[b] - k for b, k in zip(rows, done))

    def run_chunk(self, tokens: int | None = None) -> list[int]:
        """One forward: the next chunk of exactly ``prefill_step_size`` tokens (fewer at a
        tail's end) of every row with chunks left (``[B', C]``), or once none has, one row's
        replayed tokens (``tokens`` is ignored: the schedule is fixed).

        Returns:
            Tokens per row this call put in the caches.

        Raises:
            RuntimeError: the group is already done.
        """
        if self.done:
            raise RuntimeError("prefill group is done; nothing left to run")
        rows = self._chunk_rows()
        real = [0] * len(self.prompts)
        if rows:
            for b, n in zip(rows, self._run_chunks(rows)):
                real[b] = n
            self.forwards += 1
        else:
            b = self.next_rows()[0]
            real[b] = self._replay_forwards(b, self._done_tokens[b], self.step_size)
            self.forwards += real[b]
        for b, n in enumerate(real):
            self._done_tokens[b] += n
        self.position += sum(real)
        if self.position >= sum(self.lengths):
            self._finish()
        return real

    def _run_chunks(self, rows: list[int]) -> list[int]:
        """One forward of each of ``rows``' next chunk into its own caches; its chunk lengths."""
        starts = [self._done_tokens[b] for b in rows]
        chunks = [
            self.prompts[b][k : min(k + self.step_size, self._chunked(b))] for b, k in zip(rows, starts)
        ]
        C = max(map(len, chunks))
        tokens = mx.array([c + [0] * (C - len(c)) for c in chunks], dtype=mx.uint32)  # [B', C]
        lengths = [len(c) for c in chunks]
        backend = self.invariance.backend
        layers = [
            PromptChunks([self._solo[b][i] for b in rows], lengths, backend)
            for i in range(len(self._solo[0]))
        ]
        with prefill_forward(self.model, self.invariance, lengths):
            self.model(tokens, cache=layers)  # logits unused (never evaluated)
        mx.eval([c.state for b in rows for c in self._solo[b]])
        return lengths
