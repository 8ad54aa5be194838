"""Per-model-instance seams through which the engine swaps a layer's behaviour for one forward.

Nothing here rebinds an MLX or mlx-lm class attribute or module function: each hooked layer
*instance* gets a subclass of its own class (same name and module) whose call reads the
:class:`ModelHooks` of its model, so another model, another scheduler's model or another
thread's model runs mlx-lm's code untouched. With no hook set a hooked layer computes what
its class computes (the same call, the same bits)::

    hooks = hooks_of(model)                        # once per model instance (idempotent)
    with hooks.using(attention=per_row):           # this model's attention, this forward only
        logits = model(tokens, cache=caches)

Notes: ``docs/lab/engine-notes.md``, "model_hooks.py".
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import mlx.nn as nn

HOOKS = "_workbench_hooks"  # the instance attribute holding a layer's (and the model's) ModelHooks
SDPA = "scaled_dot_product_attention"
_PROJECTION_METHODS = (
    (nn.QuantizedLinear, "__call__"),
    (nn.Linear, "__call__"),
    (nn.QuantizedEmbedding, "as_linear"),
    (nn.Embedding, "as_linear"),
)
_HOOKED_PROJECTIONS: dict[
    type, type
] = {}  # a projection class -> its hooked subclass (shared: state is per instance)

Attention = Callable[..., Any]  # (original, queries, keys, values, cache, scale, mask, sinks) -> [B, H, L, D]
Projection = Callable[[Any, Callable[[Any, Any], Any], Any], Any]  # (module, plain, x) -> y


class ModelHooks:
    """What one model instance's hooked layers run in the current forward (all ``None``: as
    mlx-lm defines them).

    Attributes:
        attention: ``(original, queries, keys, values, cache, scale, mask, sinks)`` -> the
            attention output ``[B, H, L, D]``, replacing the model file's
            ``scaled_dot_product_attention`` (``original``: what would run without it).
        quantized: mlx-lm's ``quantized_scaled_dot_product_attention``'s stand-in for a
            quantized cache (same arguments), e.g. a dequantizing attention.
        projections: ``(module, plain, x)`` -> ``y``, replacing each hooked projection's
            call (``plain(module, x)`` is MLX's own).
        attention_hooked: whether any attention layer of the model could be hooked.
    """

    def __init__(self) -> None:
        self.attention: Attention | None = None
        self.quantized: Callable[..., Any] | None = None
        self.projections: Projection | None = None
        self.attention_hooked = False
        self.projections_hooked = False
        self.scopes: list[dict[str, Any]] = []  # each hooked attention class's globals (our copies)

    @contextlib.contextmanager
    def using(self, **hooks: Any) -> Iterator[ModelHooks]:
        """Within the block the named hooks (``attention``, ``quantized``, ``projections``)
        are set; restored after, also on an exception.

        Raises:
            AttributeError: a name that is not a hook.
        """
        unknown = set(hooks) - {"attention", "quantized", "projections"}
        if unknown:
            raise AttributeError(
                f"no hook named {sorted(unknown)}; hooks are attention, quantized, projections"
            )
        saved = {name: getattr(self, name) for name in hooks}
        try:
            for name, value in hooks.items():
                setattr(self, name, value)
            yield self
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    @contextlib.contextmanager
    def calling(self, attention: Attention) -> Iterator[ModelHooks]:
        """Within the block this model's hooked attention layers call ``attention(original,
        queries, keys, values, cache, scale, mask, sinks)`` directly; restored after."""
        saved = [scope[SDPA] for scope in self.scopes]
        try:
            for scope, original in zip(self.scopes, saved):
                scope[SDPA] = functools.partial(attention, original)  # no Python frame of its own
            yield self
        finally:
            for scope, original in zip(self.scopes, saved):
                scope[SDPA] = original

    def sdpa(self, module: types.ModuleType, queries, keys, values, cache, scale, mask, sinks=None):
        """The attention a hooked layer of model file ``module`` runs (mlx-lm's
        ``models.base.scaled_dot_product_attention`` signature)."""
        attend = getattr(cache, "attend", None)
        if attend is not None and sinks is None:  # a paged layer (packed layout) attends by itself
            return attend(queries, scale)
        if self.attention is not None:
            original = functools.partial(self._original, module)
            return self.attention(original, queries, keys, values, cache, scale, mask, sinks)
        return self._original(module, queries, keys, values, cache, scale, mask, sinks)

    def _original(self, module: types.ModuleType, queries, keys, values, cache, scale, mask, sinks=None):
        """The ``quantized`` hook over a quantized cache, else the file's own attention."""
        if self.quantized is not None and hasattr(cache, "bits") and sinks is None:
            return self.quantized(
                queries,
                keys,
                values,
                scale=scale,
                mask=mask,
                group_size=cache.group_size,
                bits=cache.bits,
            )
        plain = getattr(module, SDPA)  # read at call time: a recorder set on the module is seen
        return plain(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)


def _hooked_attention_class(cls: type, hooks: ModelHooks) -> type | None:
    """``cls`` with its file's ``scaled_dot_product_attention`` resolved to ``hooks`` (or ``None``)."""
    call = cls.__dict__.get("__call__")
    module = sys.modules.get(cls.__module__)
    if not isinstance(call, types.FunctionType) or module is None or SDPA not in call.__code__.co_names:
        return None
    if not hasattr(module, SDPA):
        return None
    scope = dict(call.__globals__)  # a copy: the model file's own globals stay as they are
    scope[SDPA] = functools.partial(hooks.sdpa, module)  # no Python frame of its own
    hooks.scopes.append(scope)
    hooked = types.FunctionType(call.__code__, scope, call.__name__, call.__defaults__, call.__closure__)
    hooked.__kwdefaults__ = call.__kwdefaults__
    return type(
        cls.__name__,
        (cls,),
        {"__call__": hooked, "__module__": cls.__module__, "__qualname__": cls.__qualname__},
    )


def _hooked_projection_class(cls: type) -> type:
    """``cls`` whose projection runs its instance's ``projections`` hook when set."""
    if cls not in _HOOKED_PROJECTIONS:
        name = next(method for base, method in _PROJECTION_METHODS if issubclass(cls, base))
        plain = getattr(cls, name)

        def project(self: Any, x: Any) -> Any:
            hooks = self.__dict__.get(HOOKS)
            if hooks is None or hooks.projections is None:
                return plain(self, x)
            return hooks.projections(self, plain, x)

        project.__doc__ = plain.__doc__
        attrs = {name: project, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
        _HOOKED_PROJECTIONS[cls] = type(cls.__name__, (cls,), attrs)
    return _HOOKED_PROJECTIONS[cls]


def _plain_projection(module: Any) -> bool:
    """Whether ``module`` projects with MLX's own method (not overridden)."""
    for base, name in _PROJECTION_METHODS:
        if isinstance(module, base):
            return getattr(type(module), name) is base.__dict__[name]
    return False


def hooked_class_of(module: Any) -> type:
    """The MLX or mlx-lm class ``module`` is an instance of, hooked or not."""
    cls = type(module)
    return cls.__bases__[0] if HOOKS in module.__dict__ else cls


def hooks_of(model: Any, projections: bool = False) -> ModelHooks:
    """The :class:`ModelHooks` of ``model``, hooking its attention layers (and, with
    ``projections``, its projections) the first time; idempotent."""
    hooks = model.__dict__.get(HOOKS)
    if hooks is None:
        hooks = ModelHooks()
        made: dict[type, type | None] = {}
        for _, m in model.named_modules():
            cls = type(m)
            if isinstance(m, nn.Module) and HOOKS not in m.__dict__ and "__call__" in cls.__dict__:
                if cls not in made:
                    made[cls] = _hooked_attention_class(cls, hooks)
                if made[cls] is not None:
                    m.__class__ = made[cls]
                    object.__setattr__(m, HOOKS, hooks)
                    hooks.attention_hooked = True
        object.__setattr__(model, HOOKS, hooks)
    if projections and not hooks.projections_hooked:
        for _, m in model.named_modules():
            if _plain_projection(m) and HOOKS not in m.__dict__:
                m.__class__ = _hooked_projection_class(type(m))
                object.__setattr__(m, HOOKS, hooks)
        hooks.projections_hooked = True
    return hooks
