"""``wb.serve(sched)``: a Scheduler behind an OpenAI-compatible HTTP endpoint.

Knows: uvicorn (the ASGI server, in a background thread), the :class:`EngineThread` and the
app. Must not know: OpenAI's shapes (:mod:`workbench.serving.responses`), the request fields
(:mod:`workbench.serving.translate`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.scheduler import Scheduler
from .engine import EngineThread

DEFAULT_MAX_TOKENS = 512  # mlx_lm.server's --max-tokens default
DEFAULT_MAX_QUEUED = 4096


class Server:
    """A served scheduler: uvicorn on ``host:port`` in one thread, the engine in another.

    Attributes:
        sched: the served scheduler (read it, e.g. a Panel or ``sched.report()``; only the
            engine thread calls it while served).
        host, port: where it listens (``port`` the one bound when 0 was asked).
        url: ``http://host:port/v1``, the ``base_url`` of an ``openai.OpenAI`` client.
        metrics: the :class:`EngineMetrics` behind ``/metrics``.
        engine: the :class:`EngineThread`.
    """

    def __init__(
        self,
        sched: Scheduler,
        engine: EngineThread,
        uvicorn_server: Any,
        thread: threading.Thread,
        model_id: str,
    ):
        self.sched, self.engine, self.metrics, self.model_id = sched, engine, engine.metrics, model_id
        self._uvicorn, self._thread = uvicorn_server, thread
        sock = uvicorn_server.servers[0].sockets[0].getsockname()
        self.host, self.port = sock[0], sock[1]
        self.url = f"http://{self.host}:{self.port}/v1"

    @property
    def connections(self) -> int:
        """HTTP connections open now (uvicorn's count; a client's kept-alive ones included)."""
        return len(self._uvicorn.server_state.connections)

    @property
    def running(self) -> bool:
        """Whether the HTTP thread is alive."""
        return self._thread.is_alive()

    @property
    def serving(self) -> bool:
        """Whether the engine thread owns ``sched`` (from ``serve`` until ``stop``)."""
        return self.engine.alive

    def between(self, fn: Callable[[Scheduler], Any]) -> Future:
        """Run ``fn(sched)`` on the engine thread between two of its engine calls and return a
        ``concurrent.futures.Future`` of the result (:meth:`EngineThread.between`): how
        another thread reads the served scheduler safely. ``wb.views.Panel(server)`` takes its
        snapshot copies this way. After :meth:`stop`, ``fn`` runs at once on the caller's thread."""
        return self.engine.between(fn)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop listening, abort the rows still live (their KV freed), end both threads.
        The scheduler is then the caller's again. Idempotent."""
        self._uvicorn.should_exit = True
        self._thread.join(timeout_s)
        self.engine.stop(timeout_s)

    def wait(self) -> None:
        """Block until the HTTP thread ends (Ctrl-C raises ``KeyboardInterrupt`` here)."""
        while self._thread.is_alive():
            self._thread.join(0.2)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Server({self.url}, model={self.model_id!r})"


def serve(
    sched: Scheduler,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    model_id: str = "workbench",
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    max_queued: int = DEFAULT_MAX_QUEUED,
    log_level: str = "warning",
    start_timeout_s: float = 30.0,
) -> Server:
    """Serve ``sched`` over HTTP (OpenAI's ``/v1/chat/completions``, ``/v1/completions``,
    ``/v1/models``; ``/health``, ``/metrics``) from background threads; returns at once.

    Args:
        sched: a :class:`Scheduler` the caller holds; from now until ``server.stop()`` only
            the engine thread calls it (reading it, e.g. a Panel, is fine).
        host, port: where to listen (``port=0``: a free port, read ``server.port``).
        model_id: the name ``/v1/models`` lists and responses carry (any ``model`` field a
            client sends is accepted).
        default_max_tokens: a request's ``max_tokens`` when it sets none (mlx_lm.server's 512).
        max_queued: most requests waiting in the queue; more get HTTP 429.
        log_level: uvicorn's (``"info"`` logs every request).

    Returns:
        The running :class:`Server` (``server.url`` is a client's ``base_url``).

    Raises:
        ValueError: ``port`` not an int (a numpy int too) in ``[0, 65535]`` (before anything starts).
        ImportError: without the ``serve`` extra (``pip install -e ".[serve]"``).
        OSError: the port is taken, or the server did not start within ``start_timeout_s``.

    Example::

        server = wb.serve(sched, port=8000)
        openai.OpenAI(base_url=server.url, api_key="-").completions.create(
            model="workbench", prompt="def add(a, b):", max_tokens=16)
        server.stop()
    """
    if (
        not isinstance(port, (int, np.integer))
        or isinstance(port, (bool, np.bool_))
        or not 0 <= port <= 65535
    ):
        raise ValueError(f"port must be an int in [0, 65535] (0: a free one), got {port!r}")
    port = int(port)  # a numpy int (np.int64(8000)), as SchedulerConfig takes one
    try:  # the serve extra (Starlette, uvicorn, prometheus-client): imported here, named if missing
        import uvicorn

        from .app import build_app
        from .metrics import EngineMetrics
    except ImportError as exc:
        raise ImportError(f"wb.serve needs the serve extra: pip install -e '.[serve]' ({exc})") from None
    metrics = EngineMetrics()
    engine = EngineThread(sched, metrics, max_queued)
    app = build_app(engine, metrics, model_id, default_max_tokens)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off", access_log=False)
    http = uvicorn.Server(config)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            http.run()
        except BaseException as exc:  # SystemExit from uvicorn when the port is taken
            failed.append(exc)

    thread = threading.Thread(target=run, name="workbench-http", daemon=True)
    engine.start()
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not http.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not http.started:
        http.should_exit = True
        engine.stop()
        raise OSError(f"the server did not start on {host}:{port}" + (f": {failed[0]!r}" if failed else ""))
    return Server(sched, engine, http, thread, model_id)


def serve_command(model: str | None, host: str, port: int, settings: dict[str, Any], **options: Any) -> int:
    """``workbench serve``: load ``model`` (``None``: the bundled one), build a
    :class:`Scheduler` with ``settings`` (:class:`~workbench.engine.config.SchedulerConfig`
    fields), serve it until Ctrl-C (which raises ``KeyboardInterrupt`` after stopping the
    server: the CLI's one line and exit code 130). ``options`` go to :func:`serve`.
    Returns 0 when the server ends by itself."""
    from ..runtime.loading import BUNDLED_MODEL, load

    name = model or BUNDLED_MODEL.name
    print(f"serve: loading {name} ...", flush=True)
    loaded, tokenizer = load(model) if model else load()
    sched = Scheduler(loaded, tokenizer, **settings)
    server = serve(sched, host, port, model_id=Path(name).name, **options)
    print(f"serve: {Path(name).name} on {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.wait()
    finally:
        server.stop()
    return 0
