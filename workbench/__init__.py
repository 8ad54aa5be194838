"""The batching workbench: a step-at-a-time continuous-batching engine over mlx-lm.

Public contract (see README and docs/)::

    model, tokenizer = wb.load()                      # or any mlx-lm path / HF repo id
    sched = wb.Scheduler(model, tokenizer, max_batch=4)
    uid = sched.submit(wb.Request(prompt="def add(a, b):", max_tokens=24))
    sched.admit(); sched.step(); sched.filter()
    sched.tokens(uid); sched.snapshot(); sched.run()
    wb.views.render_masks(sched.snapshot()); wb.views.Panel(sched)   # views, widgets
"""

from . import blas  # noqa: F401  first: an optimized BLAS must be loaded before mlx (see workbench.blas)
from .events import Event
from .loading import BUNDLED_MODEL, load
from .report import Report
from .request import Request
from .scheduler import Scheduler
from .snapshot import Snapshot

__all__ = ["BUNDLED_MODEL", "Event", "Report", "Request", "Scheduler", "Snapshot", "load", "views"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``wb.views`` is imported on first use, so ``import workbench`` stays light."""
    if name == "views":
        import importlib

        return importlib.import_module(".views", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
