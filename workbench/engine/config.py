"""The scheduler's settings, held once: a frozen, validated :class:`SchedulerConfig`.

Knows: every plain setting of :class:`workbench.engine.scheduler.Scheduler`, its unit,
default and limits, and which of them a fork may change. Must not know: the model, MLX,
the levers' own types (``pacing``, ``kv_bits`` / ``kv_group_size`` and ``fast_decode``
are checked by their levers when the scheduler is built, as they depend on them).

Validated once in ``__post_init__``; a change is a ``dataclasses.replace`` (validated
again)::

    cfg = SchedulerConfig(max_batch=8, prefill_step_size=512)
    sched = Scheduler(model, tokenizer, cfg, pipeline=False)   # = replace(cfg, pipeline=False)
    sched.config.max_batch                                      # 8
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .admission import policy_from
from .packed.plan import SCHEDULES

LAYOUTS = ("padded", "packed")

_FORK = {"fork": True}  # field metadata: a fork (``Scheduler.fork``) may change it
SPECULATIVE_METHODS = ("prompt-lookup",)  # speculative= names (else a draft model object)
MAX_DRAFT_TOKENS = 16  # num_draft_tokens' upper limit
# page_size's upper limit: vLLM's largest block size. A row's last page is partly empty and
# the pools grow by whole pages, so a larger page only holds more unused positions per row.
MAX_PAGE_SIZE = 128


def _setting(default: Any, fork: bool = False) -> Any:
    return field(default=default, metadata=_FORK if fork else {})


@dataclass(frozen=True)
class SchedulerConfig:
    """Every plain setting of a :class:`~workbench.engine.scheduler.Scheduler`.

    ``prompt_concurrency=None`` means ``max_batch``; ``history_size`` and
    ``history_checkpoints`` are ``>= 0``; ``kv_budget_bytes`` and ``max_kv_size`` ``>= 1``
    or ``None`` (no limit). ``layout="packed"`` (:mod:`workbench.engine.packed`) takes
    ``page_size`` (in ``[1, 128]``) and ``max_num_batched_tokens`` (``>= max_batch``) and ``packed_schedule``
    (:data:`workbench.engine.packed.plan.SCHEDULES`). ``speculative`` is ``None``,
    ``"prompt-lookup"`` or a draft mlx-lm model sharing the tokenizer, with
    ``num_draft_tokens`` in ``[1, 16]`` (:mod:`workbench.engine.levers.speculative`; what
    cannot speculate is refused when the scheduler is built). A setting other than its default
    that the other settings leave without effect (``reuse_slots=False`` with the packed
    layout, ``page_size`` with the padded one, ...: :data:`UNHONOURED`) is refused when the
    scheduler is built (:meth:`refuse_unhonoured`), never ignored.

    Attributes (each the :class:`~workbench.engine.scheduler.Scheduler` keyword of that name):
        max_batch (default ``4``): most rows in the running batch, >= 1
        prefill_step_size (default ``2048``): prefill chunk, tokens, >= 1 (mlx-lm's
            --prefill-step-size; packed with ``kv_bits``: a row's first forward, on float keys)
        prompt_concurrency (default ``None``): most requests prefilled together
        interleave_prefill (default ``True``): at most one prefill chunk per admit()
        pipeline (default ``True``): launch each decode forward before reading the previous
            tokens (packed: build a decode-only forward from them, started after the read)
        policy (default ``"fcfs"``): admission order: a name in admission.POLICIES, or a Policy
        kv_budget_bytes (default ``None``): projected KV bytes admission may hold
        reuse_slots (default ``True``): evicted rows' cache rows stay free slots (False:
            mlx-lm's filter + extend)
        max_kv_size (default ``None``): rotating KV of this many tokens (models without
            make_cache)
        kv_bits (default ``None``): quantized KV cache, 4 or 8 bits (None: float), as mlx-lm's
            generate_step
        kv_group_size (default ``64``): values sharing one scale and bias: 32, 64 or 128,
            dividing the head dim
        pacing (default ``None``): None: fixed chunks; True, a target gap (seconds) or a
            levers.pacing.Pacing
        fast_decode (default ``None``): decode fast paths: None where they apply, True all,
            False none
        batch_invariant (default ``False``): every row bit-identical to its run alone
            (levers/invariant.py)
        clear_cache_every (default ``256``): mx.clear_cache() every this many steps, >= 1
        history_size (default ``64``): snapshots kept in Scheduler.history (0: no recording)
        history_checkpoints (default ``0``): checkpoints kept with the latest snapshots
        seed (default ``0``): draws the PRNG seed of sampled requests submitted without one (an
            int >= 0; ``None``: numpy's fresh entropy, not reproducible)
        layout (default ``"padded"``): "padded" (mlx-lm's left-padded batch caches) or "packed"
            (engine/packed/)
        page_size (default ``16``): packed layout: token positions per KV page, 1..128
            (docs/packed.md)
        max_num_batched_tokens (default ``None``): packed: most tokens per forward (vLLM's);
            None: prefill_step_size
        packed_schedule (default ``"hybrid"``): packed: "hybrid", "prefill-first" or
            "decode-first"
        speculative (default ``None``): None, "prompt-lookup" or a draft mlx-lm model
            (levers/speculative.py)
        num_draft_tokens (default ``4``): most draft tokens per row and step when speculating,
            1..16

    Raises:
        ValueError: naming the field and its limit (``max_batch must be an int >= 1, got
            0``), or an unknown ``policy`` name.
    """

    max_batch: int = _setting(4, fork=True)  # most rows in the running batch, >= 1
    prefill_step_size: int = 2048  # prefill chunk, tokens, >= 1 (mlx-lm's --prefill-step-size)
    prompt_concurrency: int | None = _setting(None, fork=True)  # most requests prefilled together
    interleave_prefill: bool = _setting(True, fork=True)  # at most one prefill chunk per admit()
    pipeline: bool = True  # launch each decode forward before reading the previous tokens
    policy: Any = _setting("fcfs", fork=True)  # admission order: a name in admission.POLICIES, or a Policy
    kv_budget_bytes: int | None = _setting(None, fork=True)  # projected KV bytes admission may hold
    reuse_slots: bool = True  # evicted rows' cache rows stay free slots (False: mlx-lm's filter + extend)
    max_kv_size: int | None = None  # rotating KV of this many tokens (models without make_cache)
    kv_bits: int | None = None  # quantized KV cache, 4 or 8 bits (None: float), as mlx-lm's generate_step
    kv_group_size: int = 64  # values sharing one scale and bias: 32, 64 or 128, dividing the head dim
    pacing: Any = None  # None: fixed chunks; True, a target gap (seconds) or a levers.pacing.Pacing
    fast_decode: bool | None = None  # decode fast paths: None where they apply, True all, False none
    batch_invariant: bool = False  # every row bit-identical to its run alone (levers/invariant.py)
    clear_cache_every: int = _setting(256, fork=True)  # mx.clear_cache() every this many steps, >= 1
    history_size: int = _setting(64, fork=True)  # snapshots kept in Scheduler.history (0: no recording)
    history_checkpoints: int = _setting(0, fork=True)  # checkpoints kept with the latest snapshots
    seed: int | None = (
        0  # draws the PRNG seed of sampled requests without one (int >= 0; None: fresh entropy)
    )
    layout: str = "padded"  # "padded" (mlx-lm's left-padded batch caches) or "packed" (engine/packed/)
    page_size: int = 16  # packed layout: token positions per KV page, 1..128
    max_num_batched_tokens: int | None = None  # packed: most tokens per forward (vLLM's)
    packed_schedule: str = _setting("hybrid", fork=True)  # packed: hybrid, prefill-first, decode-first
    speculative: Any = None  # None, "prompt-lookup" or a draft mlx-lm model (levers/speculative.py)
    num_draft_tokens: int = 4  # most draft tokens per row and step when speculating, 1..16

    def __post_init__(self) -> None:
        for name in ("max_batch", "prefill_step_size", "clear_cache_every"):
            object.__setattr__(self, name, _check_int(name, getattr(self, name), 1))
        for name in ("prompt_concurrency", "max_kv_size", "kv_budget_bytes"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _check_int(name, getattr(self, name), 1))
        for name in ("history_size", "history_checkpoints"):
            object.__setattr__(self, name, _check_int(name, getattr(self, name), 0))
        if self.seed is not None:  # None: numpy's fresh entropy (not reproducible)
            object.__setattr__(self, "seed", _check_int("seed", self.seed, 0))
        for name in ("interleave_prefill", "pipeline", "reuse_slots"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):  # "false" would be truthy
                raise ValueError(f"{name} must be True or False, got {value!r}")
            object.__setattr__(self, name, bool(value))
        policy_from(self.policy)  # raises for an unknown name
        self._check_layout()
        self._check_speculative()

    def _check_speculative(self) -> None:
        _check_int("num_draft_tokens", self.num_draft_tokens, 1)
        if self.num_draft_tokens > MAX_DRAFT_TOKENS:
            raise ValueError(
                f"num_draft_tokens must be an int in [1, {MAX_DRAFT_TOKENS}], got {self.num_draft_tokens!r}"
            )
        if isinstance(self.speculative, str) and self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative must be None, one of {list(SPECULATIVE_METHODS)} or a draft mlx-lm model, "
                f"got {self.speculative!r}"
            )

    def _check_layout(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        _check_int("page_size", self.page_size, 1)
        if self.page_size > MAX_PAGE_SIZE:
            raise ValueError(
                f"page_size must be an int in [1, {MAX_PAGE_SIZE}] (token positions per KV page; "
                f"{MAX_PAGE_SIZE} is vLLM's largest block: a row's last page is partly empty, so a "
                f"larger page only wastes memory), got {self.page_size!r}"
            )
        if self.max_num_batched_tokens is not None:
            _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.packed_schedule not in SCHEDULES:
            raise ValueError(f"packed_schedule must be one of {SCHEDULES}, got {self.packed_schedule!r}")
        if self.layout == "packed" and self.token_budget < self.max_batch:
            raise ValueError(
                f"max_num_batched_tokens must be >= max_batch ({self.max_batch}) with layout='packed' "
                f"(every running row's next token goes into each forward), got {self.token_budget}"
            )

    def refuse_unhonoured(self, adapters: bool = False) -> None:
        """Refuse a setting the other settings leave without effect (:data:`UNHONOURED`).

        A setting at its default asks for nothing; a value other than the default asks for
        what it says. A lever's own parameter (``kv_group_size``, ``num_draft_tokens``) is not
        refused with its lever off (why: ``docs/lab/engine-notes.md``). Called by the
        :class:`~workbench.engine.scheduler.Scheduler` (a config alone may be a template).

        Args:
            adapters: whether the scheduler loads LoRA adapters.

        Raises:
            ValueError: naming the setting, its value, the setting that leaves it without
                effect and why (``reuse_slots=False has no effect with layout='packed': ...``).
        """
        for name, other, ignored, why in UNHONOURED:
            if getattr(self, name) != _DEFAULTS[name] and ignored(self, adapters):
                value = "adapters" if other == "adapters" else f"{other}={getattr(self, other)!r}"
                raise ValueError(
                    f"{name}={getattr(self, name)!r} has no effect with {value}: {why}; "
                    f"leave {name} at its default ({_DEFAULTS[name]!r})"
                )

    @property
    def token_budget(self) -> int:
        """Most tokens one packed forward carries: ``max_num_batched_tokens``, else
        ``prefill_step_size``."""
        return self.max_num_batched_tokens or self.prefill_step_size

    @classmethod
    def fork_fields(cls) -> tuple[str, ...]:
        """The settings a fork may change (decision settings; the caches' shape stays)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("fork"))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every setting's name, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SchedulerConfig)}
_PACKED = "the packed layout's setting (layout='packed' reads it)"
# (setting, the other setting, whether the other leaves a non-default value of it without effect, why)
UNHONOURED: tuple[tuple[str, str, Any, str], ...] = (
    ("page_size", "layout", lambda c, a: c.layout == "padded", "KV pages are " + _PACKED),
    (
        "max_num_batched_tokens",
        "layout",
        lambda c, a: c.layout == "padded",
        "tokens per forward is " + _PACKED,
    ),
    ("packed_schedule", "layout", lambda c, a: c.layout == "padded", "the forward's plan is " + _PACKED),
    (
        "interleave_prefill",
        "layout",
        lambda c, a: c.layout == "packed",
        "the packed layout prefills inside step()'s forwards, admit() runs no chunk "
        "(packed_schedule='prefill-first' puts prefill first)",
    ),
    (
        "reuse_slots",
        "layout",
        lambda c, a: c.layout == "packed",
        "the packed layout holds pages, not cache rows: an evicted row's pages are freed at once",
    ),
    (
        "fast_decode",
        "layout",
        lambda c, a: c.layout == "packed" and c.fast_decode is True,
        "the compiled MLPs are built for the padded decode step only",
    ),
    (
        "prefill_step_size",
        "max_num_batched_tokens",
        lambda c, a: (
            c.layout == "packed"
            and c.kv_bits is None  # with kv_bits it sizes a row's first forward (on float keys)
            and c.max_num_batched_tokens not in (None, c.prefill_step_size)
        ),
        "a packed forward's tokens, prefill chunks included, are max_num_batched_tokens (without kv_bits)",
    ),
    (
        "interleave_prefill",
        "pacing",
        lambda c, a: c.pacing is not None and c.pacing is not False,
        "paced admits run the chunks that fit each iteration's time budget",
    ),
    (
        "fast_decode",
        "batch_invariant",
        lambda c, a: c.batch_invariant is True and c.fast_decode is True,
        "the mode runs its own row-blocked forward, no fast path",
    ),
    (
        "fast_decode",
        "adapters",
        lambda c, a: a and c.fast_decode is True,
        "a compiled MLP would not see each row's adapter selection",
    ),
    (
        "history_checkpoints",
        "history_size",
        lambda c, a: c.history_size == 0,
        "no snapshot is kept to hold one",
    ),
)


def _check_int(name: str, value: Any, least: int) -> int:
    """``value`` as a Python int (a numpy integer too), or ValueError naming ``name`` and ``least``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return int(value)
