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

from . import blas  # noqa: F401  first: an optimized BLAS must be loaded before mlx (see workbench.blas)
from . import memory  # noqa: F401  MLX's CPU buffer cache: reuse freed KV-sized buffers (see workbench.memory)
from .compare import compare
from .costmodel import CostModel
from .events import Event
from .loading import BUNDLED_MODEL, load
from .metrics import SLO
from .modelref import ModelRef
from .replay import replay
from .report import Report
from .request import Request
from .scheduler import Scheduler
from .snapshot import Snapshot
from .sweep import grid, sweep
from .traces import trace_workload
from .workloads import Workload, synthetic

__all__ = ["BUNDLED_MODEL", "CostModel", "Event", "ModelRef", "Report", "Request", "SLO", "Scheduler", "Snapshot",
           "Workload", "compare", "grid", "load", "replay", "sweep", "synthetic", "trace_workload", "views"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``wb.views`` is imported on first use, so ``import workbench`` stays light."""
    if name == "views":
        import importlib

        return importlib.import_module(".views", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
