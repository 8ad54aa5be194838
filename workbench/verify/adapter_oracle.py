"""The adapter oracle: every row of a batch with per-row LoRA adapters equals the same
request run alone through mlx-lm with that adapter loaded the mlx-lm way.

Knows: ``mlx_lm.load(path, adapter_path=...)`` (mlx-lm's ``load_adapters``: the model's
Linear layers become ``LoRALinear``), the solo oracle of :mod:`workbench.verify.oracle`.
Must not know: how the engine applies adapters (``workbench.engine.levers.lora``); it
compares token traces only.

A row without adapter is compared with the base model loaded from the same folder.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

import mlx_lm

from .oracle import (
    DEFAULT_ATOL,
    OracleReport,
    checkable_uids,
    compare_traces,
    ref_request,
    scheduler_trace,
    solo_reference,
)


def reference_model(
    model_path: str, adapter_path: str | None, models: MutableMapping[str | None, Any] | None = None
) -> Any:
    """``mlx_lm.load(model_path, adapter_path=adapter_path)``'s model (``None``: the base
    model), kept in ``models`` (keyed by adapter path) when given, so each loads once."""
    if models is not None and adapter_path in models:
        return models[adapter_path]
    model, _ = mlx_lm.load(model_path, adapter_path=adapter_path)
    if models is not None:
        models[adapter_path] = model
    return model


def adapter_check(
    model_path: str,
    sched: Any,
    uids: Sequence[int] | None = None,
    atol: float = DEFAULT_ATOL,
    models: MutableMapping[str | None, Any] | None = None,
) -> OracleReport:
    """Solo oracle for the finished greedy rows of a scheduler with adapters.

    Each uid runs alone through mlx-lm's ``generate_step`` on the model
    ``mlx_lm.load(model_path, adapter_path=<its adapter's folder>)`` (the base model for
    ``Request(adapter=None)``; a quantized KV cache, ``Scheduler(kv_bits=...)``, at the
    same bits and group size), and its tokens and per-token log-probabilities
    (``atol``, natural log) are compared with the scheduler's
    (:func:`workbench.verify.oracle.compare_traces`).

    Args:
        model_path: the folder ``sched``'s model was loaded from.
        sched: a ``workbench.Scheduler`` (its ``adapters`` bank names each folder).
        uids: rows to check (default: every finished greedy uid).
        models: a cache of reference models by adapter path, reused across calls.

    Returns:
        The :class:`OracleReport` (``.ok``, ``.text()``).

    Raises:
        KeyError: a uid the scheduler does not know.
    """
    uids = list(uids) if uids is not None else checkable_uids(sched)
    quant = sched.recipe.kv_quant
    kv = {} if quant is None else {"kv_bits": quant.bits, "kv_group_size": quant.group_size}
    refs = {}
    for u in uids:
        valid = sched.request_of(u)
        name = valid.request.adapter
        path = None if name is None else sched.adapters.adapters[name].path
        model = reference_model(model_path, path, models)
        refs[u] = solo_reference(
            model,
            ref_request(valid),
            sched.config.prefill_step_size,
            sched.config.max_kv_size,
            tokenizer=sched.tokenizer,
            **kv,
        )
    return compare_traces({u: scheduler_trace(sched, u) for u in uids}, refs, atol)
