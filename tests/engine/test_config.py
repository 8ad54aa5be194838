"""Settings held once (``SchedulerConfig``), the cache recipe, the per-request view, and
the small rules of issue 26's engine pass: one prefill-mode rule, the probe forgetting
collected models, ``step()`` saying when nothing was admitted."""

import dataclasses
import gc
import inspect
import warnings
import weakref

import pytest

import workbench as wb
from workbench.engine import probe as probe_module
from workbench.engine.config import SchedulerConfig
from workbench.engine.kv.allocation import RowTokens, plan_of, prefill_mode
from workbench.engine.kv.caches import CacheRecipe, new_batch_cache, single_cache
from workbench.engine.kv.profile import kv_profile
from workbench.engine.prefill import PrefillGroup


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("max_batch", 0, "max_batch must be an int >= 1, got 0"),
        ("prefill_step_size", 1.5, "prefill_step_size must be an int >= 1, got 1.5"),
        ("kv_budget_bytes", True, "kv_budget_bytes must be an int >= 1, got True"),
        ("history_checkpoints", -1, "history_checkpoints must be an int >= 0, got -1"),
        ("policy", "lifo", "policy must be one of"),
        ("seed", -1, "seed must be an int >= 0, got -1"),
        ("seed", "x", "seed must be an int >= 0, got 'x'"),
        ("seed", 1.5, "seed must be an int >= 0, got 1.5"),
        ("pipeline", "false", "pipeline must be True or False, got 'false'"),
        ("interleave_prefill", "no", "interleave_prefill must be True or False, got 'no'"),
        ("reuse_slots", 1, "reuse_slots must be True or False, got 1"),
    ],
)
def test_a_config_outside_its_limits_is_refused_naming_the_field_and_limit(field, value, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**{field: value})


def test_numpy_integers_are_plain_ints_in_the_config_and_none_seeds_from_fresh_entropy():
    import numpy as np

    cfg = SchedulerConfig(
        max_batch=np.int64(4), seed=np.int64(3), history_size=np.int32(0), pipeline=np.bool_(False)
    )
    assert (cfg.max_batch, cfg.seed, cfg.history_size, cfg.pipeline) == (4, 3, 0, False)
    assert {type(cfg.max_batch), type(cfg.seed), type(cfg.history_size), type(cfg.pipeline)} == {int, bool}
    assert SchedulerConfig(seed=None).seed is None


def test_a_config_is_frozen_and_a_change_is_a_validated_replace():
    cfg = SchedulerConfig(max_batch=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_batch = 2
    assert dataclasses.replace(cfg, pipeline=False) == SchedulerConfig(max_batch=8, pipeline=False)
    with pytest.raises(ValueError, match="max_batch must be an int >= 1"):
        dataclasses.replace(cfg, max_batch=0)


def test_keywords_replace_a_given_config_and_every_helper_reads_the_one_config(bundled):
    model, tokenizer = bundled
    cfg = wb.SchedulerConfig(max_batch=3, kv_budget_bytes=10**7, prefill_step_size=16)
    sched = wb.Scheduler(model, tokenizer, cfg, pipeline=False)
    assert sched.config == dataclasses.replace(cfg, pipeline=False)
    assert sched.admission.config is sched.config and sched.runner.config is sched.config
    assert sched.ledger.config is sched.config
    assert sched.max_batch == 3 and sched.kv_budget_bytes == 10**7  # deprecated read-only aliases
    assert wb.Scheduler(model, tokenizer, max_batch=3).config == SchedulerConfig(max_batch=3)
    with pytest.raises(TypeError, match="unknown setting.*max_batches"):
        wb.Scheduler(model, tokenizer, max_batches=3)


def test_the_scheduler_signature_lists_every_setting_for_shift_tab():
    params = inspect.signature(wb.Scheduler).parameters
    assert list(params)[:3] == ["model", "tokenizer", "config"]
    for f in dataclasses.fields(SchedulerConfig):
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY and params[f.name].default == f.default
    assert {"clock", "prompt_cache", "adapters"} <= set(params)


def test_a_fork_replaces_only_fork_fields_and_keeps_the_rest(make_sched):
    sched = make_sched(max_batch=4, prefill_step_size=32)
    fork = sched.fork(max_batch=2, policy="priority")
    assert fork.config == dataclasses.replace(sched.config, max_batch=2, policy="priority")
    assert "prefill_step_size" not in SchedulerConfig.fork_fields()
    with pytest.raises(ValueError, match="fork: cannot change \\['prefill_step_size'\\]"):
        sched.fork(prefill_step_size=8)


def test_a_cache_recipe_makes_the_caches_and_profile_of_its_triple(bundled):
    model, _ = bundled
    recipe = CacheRecipe(model, None, None)
    shapes = lambda caches: [type(c).__name__ for c in caches]  # noqa: E731
    assert shapes(recipe.single()) == shapes(single_cache(model))
    assert shapes(recipe.batch(3)) == shapes(new_batch_cache(model, 3))
    assert recipe.profile() == kv_profile(model)


def test_request_returns_a_frozen_view_equal_to_the_per_uid_readers(make_sched, prompt):
    sched = make_sched()
    uid = sched.submit(wb.Request(prompt=prompt(6), max_tokens=4))
    sched.run()
    view = sched.request(uid)
    assert view.status is wb.Status.FINISHED and view.finish_reason == sched.finish_reason(uid)
    assert list(view.tokens) == sched.tokens(uid) and list(view.logprobs) == sched.logprobs(uid)
    assert view.text == sched.text(uid) and view.error == "" and list(view.prompt_ids) == prompt(6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.tokens = ()
    with pytest.raises(KeyError, match="uid 9 is unknown"):
        sched.request(9)


def test_step_with_requests_queued_and_none_admitted_warns_naming_admit(make_sched, prompt):
    sched = make_sched()
    assert sched.step() == []  # idle: nothing waits, nothing to say
    sched.submit(wb.Request(prompt=prompt(5), max_tokens=3))
    with pytest.warns(UserWarning, match=r"call admit\(\) first"):
        assert sched.step() == []
    assert sched.step_index == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sched.run()  # its own loop never trips the warning
        sched.submit(wb.Request(prompt=prompt(40), max_tokens=3))
        assert "".join(piece for _, piece in sched.stream_all())


def test_prefill_mode_is_one_rule_for_the_group_and_the_projection():
    assert prefill_mode([3, 3], 8, False) == "batched" and prefill_mode([5, 1], 8, False) == "batched"
    assert prefill_mode([30, 5], 8, False) == "per row" and prefill_mode([30, 5], 8, True) == "chunked"
    assert prefill_mode([1, 0], 8, True) == "per row"  # a padded 1-column prompt


def test_the_projection_of_a_chunked_padded_group_is_what_its_caches_allocate(bundled, prompt):
    model, _ = bundled
    prompts = [prompt(5), prompt(30, 3)]  # inputs of 6 and 31 tokens: 5 and 30 prefilled
    group = PrefillGroup(model, prompts, prefill_step_size=8, chunked_padding=True)
    assert group.chunked_padding
    while not group.done:
        group.run_chunk()
    joiners = [RowTokens(0, 6, 10), RowTokens(1, 31, 35)]
    plan = plan_of(kv_profile(model), 8, chunked_padding=True)
    held, joined = plan.group_bytes(joiners)
    assert held == group.kv_bytes and joined == group.caches[0].keys.shape[2] == 256
    assert (
        plan_of(kv_profile(model), 8).group_bytes(joiners)[1] == 30 + 256
    )  # per row: merge, then one growth step


def test_the_probe_forgets_a_model_once_it_is_collected():
    model, _ = wb.load("tiny-llama")
    key = id(model)
    assert probe_module.probe(model) == ""
    assert probe_module._RESULTS[key] == ""
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None and key not in probe_module._RESULTS
