"""Views: pure functions from a snapshot or report to text or a matplotlib Figure.

Knows: snapshots, reports, matplotlib. Must not know: the engine's internals; views never
call the engine and never hold engine state.
"""

from .timeline import render_timeline, timeline_text

__all__ = ["render_timeline", "timeline_text"]
