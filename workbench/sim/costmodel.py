"""A calibrated cost model of the engine's forwards, for replays on a virtual clock.

Knows: the two shapes of forward the scheduler runs (``[B, L]`` prefill chunks and
``[B, 1]`` feeds: decode steps and joins), the model's features. Must not know: the
engine; it runs nothing. Measuring the engine and fitting the coefficients is
:mod:`workbench.sim.calibrate`'s.

The model (seconds per ``[B, L]`` prefill chunk and per ``[B, 1]`` feed) is
:class:`workbench.engine.levers.cost.CostModel`'s; see its module docstring.

The ``filter`` call costs nothing. :class:`CostModel` (defined in
:mod:`workbench.engine.levers.cost`, which the engine's pacing also plans with) holds the coefficients (fitted by
:func:`workbench.sim.calibrate.fit_cost_model`, stored as JSON); :class:`CostedModel`
wraps a model so that the forwards run inside ``admit()`` advance a virtual clock (so
``prefill`` and ``join`` events carry the time their forward ended).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..engine.levers.cost import CostModel, decode_features, prefill_features  # noqa: F401  (re-exported)


class CostedModel:
    """An mlx-lm model whose forwards advance a :class:`~workbench.sim.clocks.VirtualClock`
    by a :class:`CostModel` inside ``with model.charging():`` (the replay wraps
    ``admit()`` in it; it charges each decode step itself, before ``step()``).

    Everything else (``layers``, ``args``, ``make_cache``, ...) is the wrapped model's,
    so the scheduler and mlx-lm's cache helpers see the model unchanged. A ``[B, L > 1]``
    forward is charged as a prefill chunk, a ``[B, 1]`` forward as ``decode_s`` (a join,
    or a one-token chunk); the start position / KV width is the tokens this cache list
    has been fed so far. A packed ``[1, T]`` forward (``layout="packed"``, which calls the
    inner model itself) is priced by :meth:`charge_packed` (``CostModel.packed_s``).
    ``__wrapped__`` is the model (the packed layout checks its family through it).
    """

    def __init__(self, model: Any, clock: Any, cost: CostModel):
        self._model, self._clock, self._cost = model, clock, cost
        self.__wrapped__ = model
        self._fed: dict[int, int] = {}  # id(first layer cache) -> tokens fed so far
        self._charging = False

    def __getattr__(self, name: str) -> Any:  # only reached for names not set in __init__
        if name in ("_model", "_clock", "_cost", "_fed", "_charging"):
            raise AttributeError(name)
        return getattr(self._model, name)

    @contextmanager
    def charging(self) -> Iterator[None]:
        """Forwards inside the block advance the clock."""
        self._charging = True
        try:
            yield
        finally:
            self._charging = False

    def __call__(self, inputs: Any, cache: Any = None, **kwargs: Any) -> Any:
        rows, tokens = inputs.shape  # [B, L]
        cost_s = self.forward_s(rows, tokens, cache)
        if self._charging:
            self._clock.advance(cost_s)
        return self._model(inputs, cache=cache, **kwargs)

    def charge_packed(self, chunks: Any) -> float:
        """Price one packed forward of ``chunks`` (:class:`~workbench.observe.packed.Chunk`:
        a decode chunk attends its ``end`` keys, a prefill chunk is ``n_tokens`` after
        ``start``); the clock advances inside :meth:`charging`. Returns seconds."""
        cost_s = self._cost.packed_s(
            [c.end for c in chunks if c.kind == "decode"],
            [(c.n_tokens, c.start) for c in chunks if c.kind != "decode"],
        )
        if self._charging:
            self._clock.advance(cost_s)
        return cost_s

    def forward_s(self, rows: int, tokens: int, cache: Any) -> float:
        """Seconds for a ``[rows, tokens]`` forward into ``cache``; counts its tokens
        (every forward is counted, charged or not)."""
        key = id(cache[0])  # a cache list's first layer lives as long as its rows do
        start = self._fed.get(key, 0)
        if key not in self._fed:
            weakref.finalize(cache[0], self._fed.pop, key, None)
        self._fed[key] = start + tokens
        if tokens > 1:
            return self._cost.prefill_s(tokens, start, rows)
        return self._cost.decode_s(rows, start)
