"""The batch-invariant mode's row blocks on the CPU, calibrated by a kernel-threshold sweep
(``docs/batch-invariance.md``, issue 39).

Knows: MLX's CPU matmul and the BLAS behind it (:mod:`workbench.runtime.blas`), the mode's
:class:`~workbench.engine.levers.invariant.RowBlocks`. Must not know: requests, the scheduler.

A BLAS picks its sgemm kernel from the call's shape: on this project's CPU (OpenBLAS,
Zen/SkylakeX kernels) a float32 projection gives a row the same bits for every row count
``M`` up to a switch point (its small-matrix kernel, ``M * N * K`` up to about a million),
and other bits (equally neighbour- and position-free) above it. :func:`sweep` runs one
projection at ``M = 1 .. ROWS_SWEPT`` and groups the row counts by the bits a probe row gets;
:func:`block_from` takes the cheapest run of consecutive row counts that share one group as
the mode's ``RowBlocks(lo, hi)``: ``B`` rows run in calls of at most ``hi`` rows, each padded
to at least ``lo``, so every row is computed by a kernel of that one group, alone or in any
batch. One call per projection for ``B <= hi`` instead of the fixed blocks of 8 or one call
per row before (which read a large weight ``B / 8`` or ``B`` times a step). A call costs
:data:`CALL_ROWS` rows whatever the weight's size (measured: a call re-reads its weight, from
memory or from cache alike; :func:`block_from`).

The sweep also tells the two things issue 39 asks to keep apart (:class:`Sweep`): a
*leak* (the probe row's bits change with its neighbours' values at one ``M`` and position:
nothing a fixed block can fix) and a *switch* (the probe's bits change with ``M`` only:
joining a batch of another size costs rounding, measured by ``max_diff``).

:mod:`workbench.engine.levers.invariant_record` records the calibrated blocks per (mlx
version, BLAS) for the bundled model's projections; ``tests/engine/test_invariant_blocks.py``
re-sweeps them, so a version bump that moves a kernel boundary fails the suite rather than
the mode silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

ROWS_SWEPT = 32  # row counts M = 1 .. ROWS_SWEPT are swept; larger batches run blocks of at most this
CALL_ROWS = 4  # the cost of one call in rows, when choosing between runs (its dispatch, a weight read)
CACHED_BYTES = 4 << 20  # float weights up to this size stay in cache (``invariant.ROWS_APART_BYTES``)


@dataclass(frozen=True)
class Sweep:
    """What a projection's row count does to a row's bits (:func:`sweep`).

    Attributes:
        rows: the row counts ``M`` swept, ascending.
        group: per ``M``, the id of the probe row's bits (equal ids: equal bits); ``group[0]``
            is ``M = rows[0]``'s.
        leak: per ``M``, True when the probe's bits changed with its neighbours' values at
            the same ``M`` and position (checked only with ``neighbours=True``).
        moved: per ``M``, True when the probe's bits changed with its position in the call
            (checked only with ``neighbours=True``).
        max_diff: per ``M``, the largest ``|y - y_alone|`` of the probe row against ``M = 1``.
    """

    rows: tuple[int, ...]
    group: tuple[int, ...]
    leak: tuple[bool, ...]
    moved: tuple[bool, ...]
    max_diff: tuple[float, ...]

    def runs(self) -> list[tuple[int, int]]:
        """Maximal ``(lo, hi)`` ranges of consecutive swept row counts sharing one group,
        with no leak and no moved row."""
        out: list[tuple[int, int]] = []
        for i, M in enumerate(self.rows):
            if self.leak[i] or self.moved[i]:
                continue
            if out and out[-1][1] == self.rows[i - 1] and self.group[i] == self.group[i - 1]:
                out[-1] = (out[-1][0], M)
            else:
                out.append((M, M))
        return out

    def switches(self) -> list[int]:
        """The row counts at which the probe's bits change from the row count before."""
        return [M for i, M in enumerate(self.rows) if i and self.group[i] != self.group[i - 1]]

    def text(self) -> str:
        """One line: the groups by ``M``, leaks, moved rows and the largest difference."""
        marks = "".join(chr(ord("a") + g % 26) for g in self.group)
        return (
            f"M={self.rows[0]}..{self.rows[-1]} bits groups {marks}; switches at {self.switches() or 'none'}; "
            f"leaks at {[M for M, x in zip(self.rows, self.leak) if x] or 'none'}; "
            f"position-dependent at {[M for M, x in zip(self.rows, self.moved) if x] or 'none'}; "
            f"largest |diff| vs alone {max(self.max_diff):.3g}"
        )


def sweep(
    f: Callable[[mx.array], mx.array],
    K: int,
    dtype: Any,
    rows: Sequence[int] = tuple(range(1, ROWS_SWEPT + 1)),
    neighbours: bool = False,
) -> Sweep:
    """Run ``f`` (a projection ``[M, K] -> [M, N]``) once per row count ``M`` in ``rows``
    with a fixed probe row among random neighbours at a position that moves with ``M``, and
    group the row counts by the probe's output bits.

    Args:
        f: the projection (unpatched).
        K: its input features. dtype: the input dtype.
        rows: the row counts swept (ascending).
        neighbours: also check, per ``M``, the probe among other neighbours at the same
            position (a leak) and at the first position (a moved row): three calls per ``M``.

    Returns:
        a :class:`Sweep`. Evidence, not proof: shapes decide the kernel, values do not.
    """
    top = max(rows)
    pool = mx.random.normal((2 * top + 1, K), key=mx.random.key(11)).astype(dtype)  # [2M+1, K]
    probe, a, b = pool[:1], pool[1 : top + 1], pool[top + 1 :]

    def at(p: int, M: int, others: mx.array) -> mx.array:
        block = mx.concatenate([others[:p], probe, others[p : M - 1]])  # [M, K], the probe at row p
        return f(block)[p]

    alone = f(probe)[0]
    ids: dict[bytes, int] = {}
    group, leak, moved, diff = [], [], [], []
    for M in rows:
        p = (3 * M) // 4 if M > 1 else 0
        y = at(p, M, a)
        mx.eval(y)
        group.append(ids.setdefault(bytes(memoryview(y.astype(mx.float32))), len(ids)))
        diff.append(mx.abs(y.astype(mx.float32) - alone.astype(mx.float32)).max().item())
        leaked = shifted = False
        if neighbours and M > 1:
            leaked = not mx.array_equal(y, at(p, M, b)).item()
            shifted = not mx.array_equal(y, at(0, M, a)).item()
        leak.append(leaked)
        moved.append(shifted)
    return Sweep(tuple(rows), tuple(group), tuple(leak), tuple(moved), tuple(diff))


def block_from(result: Sweep) -> tuple[int, int] | None:
    """The ``(lo, hi)`` of the mode's ``RowBlocks`` for a swept projection: of the runs of
    :meth:`Sweep.runs`, the one whose step costs least against a plain call, summed over
    ``B = 1, 8, 32`` rows (the issue's goals are ratios per ``B``): per ``B``, calls times a
    call's cost in rows (:data:`CALL_ROWS`) plus rows computed (padding included), over one
    plain call of ``B`` rows. ``None`` where no row count was clean (the caller falls back to
    one row per call).

    A call costs :data:`CALL_ROWS` rows for every weight size. Until the twenty-first session a
    weight of up to :data:`CACHED_BYTES` was charged its dispatch only (about one row for 1 MiB),
    which kept a lone row unpadded but ran B = 32 in many calls, each reading the weight again
    from cache. Measured with OpenBLAS, 30 (4-8) copies of the weight, median us per layer at
    B = 1 / 8 / 32 (``python scripts/lab/invariant_call_cost.py``; ``docs/batch-invariance.md``,
    "The real chat model, on the CPU and at 4 bits on CUDA"), the old rule's choice, then this
    one's: SmolLM2-135M's
    ``o_proj`` shape (576x576, 1.3 MiB) 53 / 170 / 572 in blocks of 1-2 rows, **92 / 97 / 148**
    in one call padded to 3 (plain 51 / 97 / 141); llama-155m's ``[256, 1024]`` 42 / 107 / 356
    in blocks of 1-3, **92 / 82 / 123** padded to 4; the bundled model's ``[128, 128]`` 16 / 16 /
    20 padded to 10, **6 / 8 / 35** in blocks of 1-9.

    >>> s = Sweep(tuple(range(1, 33)), (0,) * 3 + (1,) * 29, (False,) * 32, (False,) * 32, (0.0,) * 32)
    >>> block_from(s)
    (4, 32)
    """
    call = float(CALL_ROWS)

    def cost(lo: int, hi: int) -> float:
        total = 0.0
        for B in (1, 8, 32):
            calls, last = divmod(B, hi)
            rows = calls * hi + (max(last, lo) if last else 0)
            total += ((calls + bool(last)) * call + rows) / (call + B)
        return total

    runs = result.runs()
    return min(runs, key=lambda r: (cost(*r), -r[1])) if runs else None
