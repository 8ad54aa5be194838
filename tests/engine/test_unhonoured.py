"""A setting the configuration would leave without effect is refused at construction, naming
both settings (``SchedulerConfig.refuse_unhonoured``); the same setting at its default, or
where it is honoured, builds."""

from __future__ import annotations

from pathlib import Path

import pytest

import workbench as wb
from workbench.engine.config import SchedulerConfig

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = {"prose": str(ROOT / "data/adapters/prose")}

REFUSED = [
    (dict(layout="packed", interleave_prefill=False), "interleave_prefill=False", "layout='packed'"),
    (dict(layout="packed", reuse_slots=False), "reuse_slots=False", "layout='packed'"),
    (dict(layout="packed", fast_decode=True), "fast_decode=True", "layout='packed'"),
    (
        dict(layout="packed", prefill_step_size=8, max_num_batched_tokens=16),
        "prefill_step_size=8",
        "max_num_batched_tokens=16",
    ),
    (dict(page_size=8), "page_size=8", "layout='padded'"),
    (dict(max_num_batched_tokens=32), "max_num_batched_tokens=32", "layout='padded'"),
    (dict(packed_schedule="decode-first"), "packed_schedule='decode-first'", "layout='padded'"),
    (dict(pacing=True, interleave_prefill=False), "interleave_prefill=False", "pacing=True"),
    (dict(batch_invariant=True, fast_decode=True), "fast_decode=True", "batch_invariant=True"),
    (dict(history_size=0, history_checkpoints=2), "history_checkpoints=2", "history_size=0"),
    (dict(fast_decode=True, adapters=ADAPTERS), "fast_decode=True", "adapters"),
]


@pytest.mark.parametrize("settings, setting, other", REFUSED)
def test_a_setting_left_without_effect_is_refused_naming_both(make_sched, settings, setting, other):
    with pytest.raises(ValueError) as refused:
        make_sched(**settings)
    message = str(refused.value)
    assert message.startswith(f"{setting} has no effect with {other}: "), message
    assert "leave " in message and "at its default" in message


def test_every_rule_is_exercised():
    """Each rule of UNHONOURED has a case above (a new rule needs a test)."""
    from workbench.engine.config import UNHONOURED

    named = {(s.split("=")[0], o.split("=")[0]) for _, s, o in REFUSED}
    assert {(name, other) for name, other, _, _ in UNHONOURED} == named


@pytest.mark.parametrize(
    "settings",
    [
        dict(layout="packed"),  # the defaults reuse_slots=True, interleave_prefill=True ask for nothing
        dict(layout="packed", fast_decode=False, pipeline=False, prefill_step_size=16),
        dict(layout="packed", prefill_step_size=16, max_num_batched_tokens=16),  # the same thing said twice
        dict(speculative="prompt-lookup", pipeline=False, num_draft_tokens=2),
        dict(kv_bits=8, kv_group_size=32),
        dict(batch_invariant=True, fast_decode=False),
        dict(reuse_slots=False, interleave_prefill=False, history_size=4, history_checkpoints=2),
        dict(adapters=ADAPTERS, fast_decode=False),
        dict(kv_group_size=32, num_draft_tokens=2),  # a lever's own parameter, its lever off (as mlx-lm)
    ],
)
def test_settings_that_take_effect_build(make_sched, settings):
    sched = make_sched(**settings)
    assert sched.config == SchedulerConfig(**{k: v for k, v in settings.items() if k != "adapters"})


def test_a_config_alone_is_a_template_and_the_scheduler_refuses(bundled):
    """SchedulerConfig itself accepts any valid value (a sweep's base); the Scheduler refuses."""
    model, tok = bundled
    cfg = SchedulerConfig(reuse_slots=False)
    with pytest.raises(ValueError, match="reuse_slots=False has no effect with layout='packed'"):
        wb.Scheduler(model, tok, cfg, layout="packed")
    with pytest.raises(ValueError, match="packed_schedule='decode-first' has no effect with layout='padded'"):
        wb.Scheduler(model, tok).fork(packed_schedule="decode-first")
