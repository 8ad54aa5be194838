"""mlx-lm's solo reference run once per model, request and settings in a test session.

Oracle tests replay the same requests on the same model in several parametrizations (a join
after 3 or after 10 steps, three drafting methods, ...), and each asks mlx-lm for the same
solo runs again. :class:`SoloReferences` stands in for
:func:`workbench.verify.oracle.solo_reference` (the ``solo_references_once`` fixture in
``tests/conftest.py``) and keeps each result: a later call with the same arguments gets a
copy of the trace the first call computed, live, in this process.

The key is everything the run depends on: the model's parameter arrays themselves (MLX arrays
are immutable, so a zeroed layer, an adapter or a re-quantization makes new arrays and a new
key; the arrays are kept alive with the entry, so an id cannot be reused), the request, the
prefill chunk, the window, ``keep``, the KV quantization and, for stop strings, the tokenizer.
Calls with logits processors or a ``complete`` callback (state the key cannot see) always run.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

from mlx.utils import tree_flatten

from workbench.verify import oracle


class SoloReferences:
    """A memo of :func:`workbench.verify.oracle.solo_reference` (same signature, same result)."""

    def __init__(self, run=oracle.solo_reference):
        self._run = run
        self._signature = inspect.signature(run)
        self._kept: dict[tuple, tuple[Any, ...]] = {}
        self.runs = self.reused = 0

    def __call__(self, *args, **kwargs) -> oracle.TokenTrace:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if a["logits_processors"] or a["complete"] is not None:
            self.runs += 1
            return self._run(*args, **kwargs)
        weights = tuple(array for _, array in tree_flatten(a["model"].parameters()))
        key = (
            id(a["model"]),
            tuple(map(id, weights)),
            a["req"],
            a["prefill_step_size"],
            a["max_kv_size"],
            a["keep"],
            id(a["tokenizer"]) if a["req"].stop else None,
            a["kv_bits"],
            a["kv_group_size"] if a["kv_bits"] else None,
        )
        if key in self._kept:
            self.reused += 1
        else:
            self.runs += 1
            self._kept[key] = (self._run(*args, **kwargs), a["model"], weights, a["tokenizer"])
        return copy.deepcopy(self._kept[key][0])
