"""The engine served: an OpenAI-compatible HTTP endpoint over a Scheduler (``wb.serve``).

Knows: HTTP (Starlette + uvicorn), OpenAI's request and response shapes, Prometheus. Uses the
engine only through the Scheduler's public calls, from one thread. Must not know: views.
Needs the ``serve`` extra (``pip install -e ".[serve]"``); docs/serve.md.

The package is ``serving``, not ``serve``: importing a subpackage sets it as an attribute of
its parent, which would hide the function ``wb.serve``.

Modules: :mod:`.server` (``serve`` and :class:`Server`), :mod:`.engine` (the engine thread
and its queues), :mod:`.translate` (OpenAI fields -> ``Request``), :mod:`.responses`
(OpenAI's JSON and SSE chunks), :mod:`.app` (routes, status codes, disconnects),
:mod:`.metrics` (``/metrics`` from the engine's events).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Server", "serve"]


def __getattr__(name: str) -> Any:
    """``Server`` and ``serve`` from :mod:`.server`, imported on first use: the load client
    (``python -m workbench.serving.replay``) and the trace writer run in processes of their
    own and need neither the engine nor MLX (importing them took seconds)."""
    if name in __all__:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
