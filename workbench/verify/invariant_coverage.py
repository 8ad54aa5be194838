"""What composes with the batch-invariant mode, checked by the engine itself (issue 39:
"``workbench invariance`` and notebook 15 show the new costs and coverage, drawn from the
same run"; ``docs/batch-invariance.md``, "Coverage").

Knows: :mod:`workbench.verify.compose` (its features as Scheduler settings, its mixed
workload and "the same request alone in the same settings" oracle). Must not know: the
mode's internals (a refusal is the engine's own ``ValueError`` at construction).

:func:`coverage` builds the Scheduler with ``batch_invariant=True`` and each other feature
of :data:`~workbench.verify.compose.FEATURES` (and with the packed layout plus each of
:data:`PACKED_WITH`), runs the mixed workload in one batch and compares every row with the
same request alone (tokens, log-probs, top-k log-probs, finish reason: ``==`` on the CPU);
:func:`coverage_text` is the table::

    with the mode     result
    speculative       every row equal to its run alone (8 of 8)
    packed + kv_bits  refused at construction:
                        layout='packed' with batch_invariant does not take kv_bits yet: ...
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from .compose import FEATURES, PairResult, check_pair, short_reason

MODE = "batch_invariant"
PACKED_WITH = ("speculative", "kv_bits", "adapters")  # three-way runs the packed layout may refuse
# issue 39's coverage: the packed layout, speculative decoding, quantized KV, preemption (a KV budget)
ISSUE_FEATURES = ("packed", "speculative", "kv_bits", "kv_budget")


def combinations(names: Sequence[str] | None = None) -> list[tuple[str, ...]]:
    """The feature sets :func:`coverage` checks with the mode: each of ``names`` alone
    (default: every other feature of :data:`~workbench.verify.compose.FEATURES`; issue 39
    names :data:`ISSUE_FEATURES`), then ``("packed", x)`` for each of :data:`PACKED_WITH`."""
    singles = [n for n in FEATURES if n != MODE] if names is None else list(names)
    return [(name,) for name in singles] + [("packed", x) for x in PACKED_WITH]


def coverage(
    model: Any,
    tokenizer: Any,
    sets: Sequence[tuple[str, ...]] | None = None,
    progress: Callable[[tuple[str, ...]], None] | None = None,
) -> list[PairResult]:
    """:func:`~workbench.verify.compose.check_pair` of the mode with each feature set of
    ``sets`` (default :func:`combinations`): refused at construction (the engine's message),
    or the workload's rows run in one batch of 4 and compared with their runs alone.

    Raises:
        KeyError: a name that is not one of :data:`~workbench.verify.compose.FEATURES`.
    """
    out = []
    for names in sets if sets is not None else combinations():
        unknown = [n for n in names if n not in FEATURES]
        if unknown:
            raise KeyError(f"sets: {unknown} not among the features {sorted(FEATURES)}")
        if progress is not None:
            progress(names)
        out.append(check_pair(model, tokenizer, (MODE, *names)))
    return out


def coverage_text(results: Sequence[PairResult]) -> str:
    """A header, then one line per result: the features beside the mode, and either ``every row
    equal to its run alone (n of n)`` or the rows that differ; a refused set says ``refused at
    construction:`` with the engine's reason indented on the next line."""
    width = max([len("with the mode"), *(len(" + ".join(r.pair[1:])) for r in results)])
    lines = [f"{'with the mode'.ljust(width)}  result"]
    for r in results:
        names = " + ".join(r.pair[1:]).ljust(width)
        if r.result == "refused":
            lines.append(f"{names}  refused at construction:")
            pad = " " * (width + 4)
            lines.append(
                textwrap.fill(short_reason(r.refused), 100, initial_indent=pad, subsequent_indent=pad)
            )
            continue
        if r.result == "wrong":
            verdict = f"{r.rows - r.equal} of {r.rows} rows differ from their runs alone: {dict(r.wrong)}"
        else:
            verdict = f"every row equal to its run alone ({r.equal} of {r.rows})"
        lines.append(f"{names}  {verdict}")
    return "\n".join(lines)
