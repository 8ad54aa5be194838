"""The batching workbench: a step-at-a-time continuous-batching engine over mlx-lm.

Public contract (see README and docs/)::

    model, tokenizer = wb.load()                      # or any mlx-lm path / HF repo id
    sched = wb.Scheduler(model, tokenizer, max_batch=4)
    uid = sched.submit(wb.Request(prompt="def add(a, b):", max_tokens=24))
    sched.admit(); sched.step(); sched.filter()
    sched.tokens(uid); sched.snapshot(); sched.run()
    wb.views.render_masks(sched.snapshot()); wb.views.Panel(sched)   # views, widgets

Workloads, replay and comparison (docs/policies.md)::

    work = wb.synthetic(tokenizer, 50, rate_per_s=4.0, seed=0)   # or wb.trace_workload(...)
    table = wb.compare(work, {"fcfs": {}, "spf": {"policy": "shortest-prompt-first"}},
                       cost_model=wb.CostModel.load(...), slo=wb.SLO(ttft_s=0.5))
"""

from .runtime import (
    blas,  # noqa: F401  first: an optimized BLAS must be loaded before mlx (see workbench.runtime.blas)
    precision,  # noqa: F401  before mlx runs a matmul: full float32, MLX_ENABLE_TF32=0 (see workbench.runtime.precision)
)

# Public names, imported on first use (PEP 562), so ``import workbench`` and ``workbench --help`` load
# neither mlx nor pandas; ``wb.Scheduler`` imports the engine the first time it is read.
_PUBLIC = {
    "compare": "sim.compare",
    "CostModel": "sim.costmodel",
    "Event": "observe.events",
    "BUNDLED_MODEL": "runtime.loading",
    "load": "runtime.loading",
    "SLO": "observe.metrics",
    "ModelRef": "runtime.modelref",
    "replay": "sim.replay",
    "Report": "observe.report",
    "Request": "engine.request",
    "Checkpoint": "engine.checkpoint",
    "Pacing": "engine.levers.pacing",
    "ShortestPromptFirst": "engine.admission",
    "Scheduler": "engine.scheduler",
    "RequestState": "engine.state",
    "Status": "engine.state",
    "Snapshot": "observe.snapshot",
    "grid": "sim.sweep",
    "sweep": "sim.sweep",
    "trace_workload": "workloads.traces",
    "Workload": "workloads.workload",
    "synthetic": "workloads.workload",
    "SchedulerConfig": "engine.config",
    "RequestView": "engine.view",
    "serve": "serving.server",
    "Server": "serving.server",
}

__all__ = [
    "BUNDLED_MODEL",
    "Checkpoint",
    "CostModel",
    "Event",
    "ModelRef",
    "Pacing",
    "Report",
    "Request",
    "RequestState",
    "RequestView",
    "SLO",
    "Scheduler",
    "SchedulerConfig",
    "Server",
    "ShortestPromptFirst",
    "Snapshot",
    "Status",
    "Workload",
    "compare",
    "grid",
    "load",
    "replay",
    "serve",
    "sweep",
    "synthetic",
    "trace_workload",
    "views",
]
__version__ = "0.1.0"


_SUBPACKAGES = ("bench", "engine", "observe", "runtime", "serving", "sim", "verify", "views", "workloads")


def __getattr__(name: str):
    """Public names (``wb.Scheduler``, ``wb.load``, ...) and subpackages (``wb.views``,
    ``wb.verify``, ...) are imported on first use, so ``import workbench`` stays light;
    the first one also raises MLX's CPU buffer-cache limit (:mod:`workbench.runtime.memory`)."""
    import importlib

    if name in _PUBLIC or name in _SUBPACKAGES:
        importlib.import_module(".runtime.memory", __name__)
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """What Jupyter's tab completion lists: the public names and subpackages, imported or not."""
    return sorted({*globals(), *_PUBLIC, *_SUBPACKAGES})
