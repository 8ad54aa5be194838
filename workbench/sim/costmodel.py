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

from mlx_lm.models.cache import ArraysCache

from ..engine.levers.cost import CostModel, decode_features, prefill_features  # noqa: F401  (re-exported)


class CostedModel:
    """An mlx-lm model whose forwards advance a :class:`~workbench.sim.clocks.VirtualClock`
    by a :class:`CostModel` inside ``with model.charging():`` (the replay wraps
    ``admit()`` in it; it charges each decode step itself, before ``step()``).

    Everything else (``layers``, ``args``, ``make_cache``, ...) is the wrapped model's,
    so the scheduler and mlx-lm's cache helpers see the model unchanged. A ``[B, L > 1]``
    forward is charged as a prefill chunk, a ``[B, 1]`` forward as ``decode_s`` (a join,
    or a one-token chunk); the start position / KV width is the keys the cache holds
    before the forward (:func:`held_keys`). A packed ``[1, T]`` forward (``layout="packed"``, which calls the
    inner model itself) is priced by :meth:`charge_packed` (``CostModel.packed_s``).
    ``__wrapped__`` is the model (the packed layout checks its family through it).
    """

    def __init__(self, model: Any, clock: Any, cost: CostModel):
        self._model, self._clock, self._cost = model, clock, cost
        self.__wrapped__ = model
        self._fed: dict[int, int] = {}  # id(first layer cache) -> tokens fed (caches held_keys cannot read)
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
        """Seconds for a ``[rows, tokens]`` forward into ``cache`` (a list of layer caches),
        priced at the keys it holds before the forward (:func:`held_keys`): a ``[B, L > 1]``
        forward as ``CostModel.prefill_s(L, held, B)``, a ``[B, 1]`` one as
        ``CostModel.decode_s(B, held)``. A cache that does not tell its keys (no ``size()``
        or ``offset``) is priced by the tokens fed into that cache list so far (every
        forward into it counted, charged or not), which is right only for a cache that is
        never filtered, trimmed or reused."""
        start = held_keys(cache)
        if start is None:
            key = id(cache[0])  # a cache list's first layer lives as long as its rows do
            start = self._fed.get(key, 0)
            if key not in self._fed:
                weakref.finalize(cache[0], self._fed.pop, key, None)
            self._fed[key] = start + tokens
        if tokens > 1:
            return self._cost.prefill_s(tokens, start, rows)
        return self._cost.decode_s(rows, start)


def held_keys(cache: Any) -> int | None:
    """Keys a forward into ``cache`` attends before its new tokens, per row: the most any
    layer holds (a model with sliding-window layers is priced by its full-attention ones, a
    ``CacheList`` by its largest member), or ``None`` when no layer tells.

    Read from each layer's public ``size()`` where its class implements one (mlx-lm's
    ``KVCache``: ``offset``; ``RotatingKVCache`` / ``BatchRotatingKVCache``: the keys in
    the window; ``BatchKVCache`` and the workbench's ``BatchQuantizedKVCache``: ``_idx``,
    the padded width), or from an integer ``offset`` where ``size()`` says 0 or is missing
    (``QuantizedKVCache``, whose ``size()`` is mlx-lm's base class's 0). State caches
    (``ArraysCache``) hold no keys and are skipped. The packed layout's pool caches
    (``PagedLayer``) never reach here: its forwards are priced by
    :meth:`CostedModel.charge_packed`.

    Why the padded width for a batch cache, not each row's own keys (``offset``, which is
    ``_idx - left_padding``): a padded ``[B, L]`` forward computes every row against all
    ``_idx`` columns (the left pads are masked, not skipped), and the cost model's
    ``B * W`` and ``B * pairs`` terms were fitted on padded forwards measured that way
    (:func:`workbench.sim.calibrate.measure_costs`). So a row that joined a wide batch, or a
    prompt extended into a batch whose other rows hold keys, is charged for the padding it
    really computes; a batch filtered down (``BatchKVCache.filter`` drops the common left
    pad) is charged for the narrower width it holds.
    """
    held = None
    for layer in cache if isinstance(cache, (list, tuple)) else ():
        if isinstance(layer, ArraysCache):
            continue  # a state, no keys
        size, offset = getattr(layer, "size", None), getattr(layer, "offset", None)
        if not callable(size) and not isinstance(offset, int):
            continue
        n = int(size()) if callable(size) else 0
        if n == 0 and isinstance(offset, int):
            n = offset  # QuantizedKVCache, ConcatenateKVCache: their size() is mlx-lm's base 0
        held = n if held is None else max(held, n)
    return held
