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

from .runtime import blas  # noqa: F401  first: an optimized BLAS must be loaded before mlx (see workbench.runtime.blas)
from .runtime import precision  # noqa: F401  before mlx runs a matmul: full float32, MLX_ENABLE_TF32=0 (see workbench.runtime.precision)
from .runtime import memory  # noqa: F401  MLX's CPU buffer cache: reuse freed KV-sized buffers (see workbench.runtime.memory)
from .sim.compare import compare
from .sim.costmodel import CostModel
from .observe.events import Event
from .runtime.loading import BUNDLED_MODEL, load
from .observe.metrics import SLO
from .runtime.modelref import ModelRef
from .sim.replay import replay
from .observe.report import Report
from .engine.request import Request
from .engine.checkpoint import Checkpoint
from .engine.config import SchedulerConfig
from .engine.levers.pacing import Pacing
from .engine.admission import ShortestPromptFirst
from .engine.scheduler import Scheduler
from .engine.state import RequestState, Status
from .engine.view import RequestView
from .observe.snapshot import Snapshot
from .sim.sweep import grid, sweep
from .workloads.traces import trace_workload
from .workloads.workload import Workload, synthetic

__all__ = ["BUNDLED_MODEL", "Checkpoint", "CostModel", "Event", "ModelRef", "Pacing", "Report", "Request", "RequestState", "RequestView", "SLO", "Scheduler", "SchedulerConfig",
           "ShortestPromptFirst", "Snapshot", "Status",
           "Workload", "compare", "grid", "load", "replay", "sweep", "synthetic", "trace_workload", "views"]
__version__ = "0.1.0"


_SUBPACKAGES = ("bench", "engine", "observe", "runtime", "sim", "verify", "views", "workloads")


def __getattr__(name: str):
    """Subpackages (``wb.views``, ``wb.verify``, ...) are imported on first use, so
    ``import workbench`` stays light."""
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
