"""Per-request LoRA adapters in one batch (``workbench.engine.levers.lora``), held to the
adapter oracle: each row equals the same request alone through
``mlx_lm.load(path, adapter_path=...)``; rows without adapter equal the base model.

The model is loaded here, not taken from the session fixture: a scheduler with adapters
wraps the model's target Linear layers in place.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.tuner.lora import LoRALinear

import workbench as wb
from workbench.engine.levers import lora
from workbench.runtime.device import on_gpu
from workbench.verify.adapter_oracle import adapter_check
from workbench.verify.oracle import DEFAULT_ATOL

MODEL = str(wb.BUNDLED_MODEL)
ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = {"prose": str(ROOT / "data/adapters/prose"), "numbers": str(ROOT / "data/adapters/numbers")}
PROMPTS = [
    ("The ", "prose"),
    ("def add(a, b):", None),
    ("12 + 3 =", "numbers"),
    ("import os\nimport sys\n", "prose"),
]


@pytest.fixture(scope="module")
def loaded():
    """``(model, tokenizer)``: a private copy of the bundled model (wrapped by the tests)."""
    return wb.load(MODEL)


@pytest.fixture(scope="module")
def references():
    """Reference models of the oracle by adapter path, loaded once for the module."""
    return {}


def _submit_all(sched, prompts=PROMPTS, max_tokens=12):
    return [sched.submit(wb.Request(prompt=p, max_tokens=max_tokens, adapter=a)) for p, a in prompts]


def test_rows_with_two_adapters_and_none_in_one_batch_match_mlx_lm_alone(loaded, references):
    model, tok = loaded
    sched = wb.Scheduler(model, tok, max_batch=4, adapters=ADAPTERS)
    uids = _submit_all(sched)
    sched.admit()
    assert sched.snapshot().adapters == ("prose", None, "numbers", "prose")  # one batch, three kinds of row
    sched.run()
    report = adapter_check(MODEL, sched, uids, models=references)
    assert report.ok, report.text()
    assert report.n_match == 4


def test_adapters_change_what_a_row_writes(loaded):
    model, tok = loaded
    sched = wb.Scheduler(model, tok, max_batch=3, adapters=ADAPTERS)
    uids = _submit_all(sched, [("The ", None), ("The ", "prose"), ("The ", "numbers")])
    sched.run()
    base, prose, numbers = (sched.text(u) for u in uids)
    assert len({base, prose, numbers}) == 3
    assert sum(c.isdigit() for c in numbers) > sum(c.isdigit() for c in prose)


def test_base_rows_in_a_mixed_batch_equal_a_scheduler_without_adapters_bit_for_bit(loaded):
    model, tok = loaded
    mixed = wb.Scheduler(model, tok, max_batch=4, adapters=ADAPTERS)
    uids = _submit_all(mixed)
    mixed.run()
    plain_model, _ = wb.load(MODEL)
    plain = wb.Scheduler(plain_model, tok, max_batch=4)
    plain_uids = _submit_all(plain, [(p, None) for p, _ in PROMPTS])
    plain.run()
    assert mixed.logprobs(uids[1]) == plain.logprobs(plain_uids[1])  # the base row: exactly equal floats
    assert mixed.tokens(uids[0]) != plain.tokens(plain_uids[0])  # the prose row is not the base model's


def test_per_row_prefill_chunks_joins_free_slots_and_preemption_keep_each_rows_adapter(loaded, references):
    model, tok = loaded
    sched = wb.Scheduler(model, tok, max_batch=2, prefill_step_size=3, adapters=ADAPTERS)
    arrivals = [
        (0, wb.Request(prompt=p, max_tokens=6 + 2 * i, adapter=a)) for i, (p, a) in enumerate(PROMPTS)
    ]
    arrivals += [(3, wb.Request(prompt="for i in range(10):", max_tokens=8, adapter="numbers"))]
    modes = set()
    for _, request in arrivals:
        sched.submit(request)
    preempted = False
    while not sched.idle:
        modes |= {e.join_mode for e in sched.admit() if e.kind == "join"}
        sched.step()
        if not preempted and sched.step_index == 3:
            sched.preempt(sched.snapshot().uids[0])
            preempted = True
        sched.filter()
    assert {"free slot", "extend"} & modes and preempted
    report = adapter_check(MODEL, sched, models=references)
    assert report.ok and report.n_match == 5, report.text()


def test_checkpoint_restore_and_fork_keep_the_adapters(loaded):
    model, tok = loaded
    sched = wb.Scheduler(model, tok, max_batch=4, adapters=ADAPTERS)
    uids = _submit_all(sched)
    sched.admit()
    sched.step()
    cp = sched.checkpoint()
    fork = sched.fork(max_batch=6)  # a changed setting; below the 4 rows it holds is refused
    sched.run()
    first = [sched.tokens(u) for u in uids]
    sched.restore(cp)
    sched.run()
    fork.run()
    assert [sched.tokens(u) for u in uids] == first == [fork.tokens(u) for u in uids]
    assert fork.adapters is sched.adapters  # shared, not loaded again
    assert fork.snapshot().adapters_loaded == ("prose", "numbers")


def test_snapshot_shows_each_rows_adapter_and_the_bytes_the_stacks_hold(loaded):
    model, tok = loaded
    sched = wb.Scheduler(model, tok, max_batch=4, adapters=ADAPTERS)
    _submit_all(sched)
    sched.admit()
    snap = sched.snapshot()
    bank = sched.adapters
    expected = 0
    for a, b in bank.layers.values():
        n, I, R = a.shape  # noqa: E741 (the module's axis letters: I in, O out)
        O = b.shape[2]  # noqa: E741
        assert n == 3 and R == 8  # base slot + 2 adapters, ranks 8 and 4 padded to 8
        expected += 4 * (n * I * R + n * R * O)  # float32 A, B
    assert snap.adapter_bytes == bank.nbytes == expected
    assert snap.adapters_loaded == ("prose", "numbers")
    assert "row 1: uid 1 running" in snap.text() and "adapter none" in snap.text()
    assert "adapters loaded: prose, numbers" in snap.text()
    assert len(bank.layers) == 35  # prose: 7 Linears x 5 layers; numbers: 3 x 3 of them


def test_row_lora_linear_equals_mlx_lm_lora_linear_per_row():
    mx.random.seed(0)
    base = nn.Linear(16, 12)
    refs = []
    for r, scale in ((4, 2.0), (2, 0.5)):
        ref = LoRALinear.from_base(base, r=r, scale=scale)
        ref.lora_b = mx.random.normal((r, 12))
        refs.append(ref)
    adapters = [
        lora.Adapter(f"a{i}", "", ref.lora_a.shape[1], ref.scale, {"l": (ref.lora_a, ref.lora_b)}, 0)
        for i, ref in enumerate(refs)
    ]
    bank = lora.AdapterBank(
        ("a0", "a1"), {}, {"l": lora._stack(adapters, "l", 4)}, (0.0, 2.0, 0.5), lora.Selection(), 0
    )
    layer = lora.RowLoRALinear(base, "l", bank.selection)
    x = mx.random.normal((3, 5, 16))  # [B, L, I]
    with lora.selected(bank, ["a1", None, "a0"]):
        y = layer(x)  # [B, L, O]
    np.testing.assert_allclose(np.array(y[0]), np.array(refs[1](x[0:1])[0]), atol=1e-5)
    assert mx.array_equal(y[1], base(x[1:2])[0]).item()  # no adapter: exactly the base layer
    np.testing.assert_allclose(np.array(y[2]), np.array(refs[0](x[2:3])[0]), atol=1e-5)
    assert mx.array_equal(layer(x), base(x)).item()  # outside a selection: the base layer
    with pytest.raises(RuntimeError, match="selection has 2 rows"), lora.selected(bank, ["a0", "a1"]):
        layer(x)


def test_an_unknown_adapter_is_refused_at_submit_and_nothing_changes(loaded):
    model, tok = loaded
    sched = wb.Scheduler(model, tok, max_batch=2, adapters=ADAPTERS)
    sched.submit(wb.Request(prompt="The ", max_tokens=4, adapter="prose"))
    before = (sched.queue, len(sched.events), sched.state.next_uid)
    with pytest.raises(ValueError, match=r"adapter 'poetry' is not loaded.*\['prose', 'numbers'\]"):
        sched.submit(wb.Request(prompt="The ", max_tokens=4, adapter="poetry"))
    with pytest.raises(ValueError, match="adapter must be"):
        sched.submit(wb.Request(prompt="The ", max_tokens=4, adapter=3))
    assert (sched.queue, len(sched.events), sched.state.next_uid) == before
    plain = wb.Scheduler(model, tok, max_batch=2)
    with pytest.raises(ValueError, match="loaded no adapters"):
        plain.submit(wb.Request(prompt="The ", max_tokens=4, adapter="prose"))


def _broken_copy(tmp_path, name="numbers", config=None, weights=None):
    folder = tmp_path / name
    shutil.copytree(ADAPTERS["numbers"], folder, ignore=shutil.ignore_patterns("train"))
    if config:
        cfg = json.loads((folder / "adapter_config.json").read_text())
        cfg.update(config(cfg) or {})
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
    if weights:
        w = dict(mx.load(str(folder / "adapters.safetensors")))
        mx.save_safetensors(str(folder / "adapters.safetensors"), weights(w))
    return str(folder)


def _rank(cfg):
    cfg["lora_parameters"]["rank"] = 8


def _layer7(w):
    w["model.layers.7.self_attn.q_proj.lora_a"] = mx.zeros((128, 4))
    w["model.layers.7.self_attn.q_proj.lora_b"] = mx.zeros((4, 128))
    return w


def _wide(w):
    return {k: mx.zeros((256, 4)) if k.endswith("q_proj.lora_a") else v for k, v in w.items()}


@pytest.mark.parametrize(
    "config, weights, message",
    [
        (_rank, None, r"lora_parameters.rank is 8 but .*lora_a has shape \(\d+, 4\).*rank mismatch"),
        (lambda c: {"fine_tune_type": "dora"}, None, "fine_tune_type is 'dora'"),
        (lambda c: {"lora_parameters": {"rank": 4}}, None, "lora_parameters.scale must be a number"),
        (None, _layer7, "model.layers.7.self_attn.q_proj.lora_a.*a layer this model does not have"),
        (None, _wide, r"q_proj.lora_a \(256, 4\).*another architecture"),
        (
            None,
            lambda w: {k: v for k, v in w.items() if not k.endswith("v_proj.lora_b")},
            "has no .*v_proj.lora_b",
        ),
    ],
)
def test_a_bad_adapter_folder_is_refused_at_construction_naming_the_field(tmp_path, config, weights, message):
    model, tok = wb.load(MODEL)  # unwrapped: a failed load must leave it so
    path = _broken_copy(tmp_path, config=config, weights=weights)
    names_before = [n for n, _ in model.named_modules()]
    with pytest.raises(ValueError, match=message):
        wb.Scheduler(model, tok, adapters={"prose": ADAPTERS["prose"], "bad": path})
    assert [n for n, _ in model.named_modules()] == names_before  # nothing wrapped by the failed load
    assert not any(isinstance(m, lora.RowLoRALinear) for _, m in model.named_modules())


def test_missing_files_are_refused(loaded, tmp_path):
    model, tok = loaded
    with pytest.raises(ValueError, match=r"missing \['adapter_config.json', 'adapters.safetensors'\]"):
        wb.Scheduler(model, tok, adapters={"none": str(tmp_path)})
    with pytest.raises(ValueError, match="adapters must be a mapping"):
        wb.Scheduler(model, tok, adapters=["prose"])


def test_available_adapters_lists_the_folders_that_fit(loaded, tmp_path):
    model, _ = loaded
    shutil.copytree(ADAPTERS["prose"], tmp_path / "prose", ignore=shutil.ignore_patterns("train"))
    _broken_copy(tmp_path, "broken", config=_rank)
    found = lora.available_adapters(tmp_path, model)
    assert [(a.name, a.rank) for a in found] == [("broken", 0), ("prose", 8)]
    assert "rank mismatch" in found[0].problem and found[1].problem == ""
    real = lora.available_adapters(ROOT / "data/adapters", model)
    assert [(a.name, a.rank, a.problem) for a in real] == [("numbers", 4, ""), ("prose", 8, "")]


def test_two_schedulers_with_different_adapters_share_one_model(loaded, references):
    model, tok = loaded
    first = wb.Scheduler(model, tok, max_batch=2, adapters={"prose": ADAPTERS["prose"]})
    second = wb.Scheduler(model, tok, max_batch=2, adapters={"numbers": ADAPTERS["numbers"]})
    _submit_all(first, [("The ", "prose"), ("12 + 3 =", None)])
    _submit_all(second, [("The ", "numbers"), ("12 + 3 =", None)])
    for _ in range(6):  # interleaved: each forward selects from its own scheduler's bank
        for sched in (first, second):
            sched.admit()
            sched.step()
            sched.filter()
    first.run()
    second.run()
    for sched in (first, second):
        report = adapter_check(MODEL, sched, models=references)
        assert report.ok and report.n_match == 2, report.text()


@pytest.mark.quantized_kv
def test_adapters_with_a_quantized_kv_cache_match_mlx_lm_at_the_same_bits(loaded, references):
    model, tok = loaded
    sched = wb.Scheduler(model, tok, max_batch=4, kv_bits=8, kv_group_size=32, adapters=ADAPTERS)
    _submit_all(sched)
    sched.run()
    report = adapter_check(MODEL, sched, models=references)
    assert report.ok and report.n_match == 4, report.text()


def test_one_verify_forward_runs_each_rows_adapter_over_all_its_positions(loaded, references):
    """Speculative decoding with adapters: a verify forward feeds each row its pending token and
    drafts (``[B, 1 + K]``), and each row's LoRA delta applies at all of its positions. Rows of
    two adapters (and none) draft in the same verify forwards; every row equals mlx-lm alone
    with its adapter, its run alone with the same settings, and its run without speculation."""
    model, tok = loaded
    prompts = [
        ("def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return", "prose"),
        ("import os\nimport sys\nimport os\nimport", "numbers"),
        ("x = 1\ny = 2\nx = 1\ny =", None),
    ]
    spec = dict(max_batch=3, adapters=ADAPTERS, speculative="prompt-lookup", num_draft_tokens=3)
    sched = wb.Scheduler(model, tok, **spec)
    uids = _submit_all(sched, prompts, max_tokens=16)
    sched.run()
    adapter_of = {u: a for u, (_, a) in zip(uids, prompts)}
    drafted = {}
    for e in sched.events:
        if e.kind == "draft" and e.n_tokens:
            drafted.setdefault(e.step, set()).add(adapter_of[e.uid])
    assert any({"prose", "numbers"} <= names for names in drafted.values()), drafted
    assert sum(e.n_accepted for e in sched.events if e.kind == "draft") > 0
    report = adapter_check(MODEL, sched, uids, models=references)
    assert report.ok and report.n_match == 3, report.text()
    exact = 0.0 if mx.default_device() == mx.cpu else 1e-4
    for settings, atol in (
        (spec, exact),
        (dict(max_batch=3, adapters=ADAPTERS), 1e-4),
    ):  # alone; unspeculated
        for uid, (p, a) in zip(uids, prompts):
            alone = wb.Scheduler(model, tok, **settings)
            (solo,) = _submit_all(alone, [(p, a)], max_tokens=16)
            alone.run()
            assert alone.tokens(solo) == sched.tokens(uid), (settings, a)
            np.testing.assert_allclose(alone.logprobs(solo), sched.logprobs(uid), rtol=0, atol=atol)


def test_adapter_bytes_are_what_loading_adds_to_mlx_active_memory():
    import gc

    from workbench.runtime.memory import allocation_bytes

    model, tok = wb.load(MODEL)
    wb.Scheduler(model, tok)  # the probe's arrays, once
    mx.synchronize()  # on CUDA a finished kernel's temporaries are freed when its stream completes
    gc.collect()
    mx.clear_cache()
    before = mx.get_active_memory()
    sched = wb.Scheduler(model, tok, adapters=ADAPTERS)
    mx.synchronize()
    gc.collect()
    mx.clear_cache()
    grown = mx.get_active_memory() - before
    dims = [
        (128, 128),
        (128, 64),
        (128, 64),
        (128, 128),
        (128, 352),
        (128, 352),
        (352, 128),
    ]  # q k v o gate up down
    assert sched.adapters.nbytes == 5 * 3 * 4 * 8 * sum(
        i + o for i, o in dims
    )  # layers x slots x float32 x rank
    # what the device's allocator takes for the stacks (on the CPU their nbytes; on CUDA whole pages)
    taken = sum(allocation_bytes(x.nbytes) for stacks in sched.adapters.layers.values() for x in stacks)
    assert abs(grown - taken) < 0.05 * taken, (grown, taken)


def test_mask_figure_labels_each_row_with_its_adapter(loaded):
    from workbench.views.mask import render_masks, row_labels

    model, tok = loaded
    sched = wb.Scheduler(model, tok, max_batch=4, adapters=ADAPTERS)
    _submit_all(sched, PROMPTS[:3])
    sched.admit()
    snap = sched.snapshot()
    assert row_labels(snap) == ["uid 0 · prose", "uid 1 · none", "uid 2 · numbers"]
    fig = render_masks(snap)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == row_labels(snap)
    plain = wb.Scheduler(model, tok, max_batch=2)
    plain.submit(wb.Request(prompt="The ", max_tokens=2))
    plain.admit()
    assert row_labels(plain.snapshot()) == ["uid 0"]  # no adapters loaded: labels as before


def test_a_quantized_linear_takes_per_row_adapters_like_mlx_lm():
    mx.random.seed(1)
    base = nn.QuantizedLinear.from_linear(nn.Linear(64, 32), group_size=32, bits=4)
    assert lora._linear_dims(base) == (64, 32)  # inputs from the packed weight, as LoRALinear.from_base
    ref = LoRALinear.from_base(base, r=4, scale=3.0)
    ref.lora_b = mx.random.normal((4, 32))
    adapter = lora.Adapter("q", "", 4, 3.0, {"l": (ref.lora_a, ref.lora_b)}, 0)
    bank = lora.AdapterBank(
        ("q",), {}, {"l": lora._stack([adapter], "l", 4)}, (0.0, 3.0), lora.Selection(), 0
    )
    layer = lora.RowLoRALinear(base, "l", bank.selection)
    x = mx.random.normal((2, 3, 64))  # [B, L, I]
    with lora.selected(bank, [None, "q"]):
        y = layer(x)
    assert mx.array_equal(y[0], base(x[0:1])[0]).item()
    np.testing.assert_allclose(np.array(y[1]), np.array(ref(x[1:2])[0]), atol=1e-5)


def test_paced_prefill_chunks_keep_each_rows_adapter(loaded, references):
    model, tok = loaded
    sched = wb.Scheduler(model, tok, max_batch=2, prefill_step_size=4, pacing=True, adapters=ADAPTERS)
    _submit_all(sched, max_tokens=6)
    sched.run()
    report = adapter_check(MODEL, sched, models=references)
    assert report.ok and report.n_match == 4, report.text()


def test_the_bundled_adapters_are_what_scripts_make_adapters_configures():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_adapters", ROOT / "scripts/make_adapters.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for name, (_, rank, scale, num_layers, keys) in script.ADAPTERS.items():
        config = json.loads((Path(ADAPTERS[name]) / "adapter_config.json").read_text())
        assert (
            config["lora_parameters"]["rank"],
            config["lora_parameters"]["scale"],
            config["num_layers"],
        ) == (rank, scale, num_layers)
        assert config["lora_parameters"].get("keys") == keys and config["fine_tune_type"] == "lora"
        lines = [
            json.loads(line)["text"]
            for line in (Path(ADAPTERS[name]) / "train/train.jsonl").read_text().splitlines()
        ]
        assert lines == script.ADAPTERS[name][0](400, script.random.Random(f"{script.SEED}-{name}"))[:-16]


def test_the_prompt_cache_is_keyed_by_adapter_and_every_row_equals_alone(loaded):
    """A prefix cached under one adapter is fetched only by rows of that adapter: the same
    prompt under another adapter (or none) prefills from scratch, under the same one it hits;
    every row equals the same request alone (a scheduler without a prompt cache)."""
    model, tok = loaded
    sched = wb.Scheduler(model, tok, max_batch=2, adapters=ADAPTERS, prompt_cache=8)
    prompt = "def add(a, b):\n    return a + b\n\ndef mul(a, b):"
    out = {}
    for name in ("prose", "numbers", None, "prose", "numbers"):
        uid = sched.submit(wb.Request(prompt=prompt, max_tokens=6, adapter=name, top_logprobs=2))
        sched.run()
        out.setdefault(name, []).append(uid)
    cached = {name: [sched.requests[u].cached_tokens for u in uids] for name, uids in out.items()}
    assert (
        cached["prose"][0] == cached["numbers"][0] == cached[None][0] == 0
    )  # another adapter's prefix: a miss
    assert cached["prose"][1] > 0 and cached["numbers"][1] > 0  # its own adapter's prefix: a hit
    for name, uids in out.items():
        alone = wb.Scheduler(model, tok, adapters=ADAPTERS)
        solo = alone.submit(wb.Request(prompt=prompt, max_tokens=6, adapter=name, top_logprobs=2))
        alone.run()
        expected = alone.request(solo)
        for uid in uids:
            got = sched.request(uid)
            if on_gpu():  # a hit prefills the suffix alone: CUDA's matmuls round by shape (docs/gpu.md)
                assert got.tokens == expected.tokens, (name, uid)
                np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=DEFAULT_ATOL)
                continue
            assert (got.tokens, got.logprobs, got.top_logprobs) == (
                expected.tokens,
                expected.logprobs,
                expected.top_logprobs,
            ), (name, uid)
    assert sched.tokens(out["prose"][0]) != sched.tokens(out["numbers"][0])  # the adapters differ here


def test_the_docs_first_example_shows_what_it_returns(monkeypatch):
    """docs/adapters.md's first snippet, run: each ``sched.snapshot().<field>  # ...: <shown>`` line
    returns what it shows (a break-it pass, 2026-12-08: it read ``adapters`` after ``run()``, ``()``)."""
    import re

    code = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "adapters.md").read_text(), re.S).group(1)
    shown = re.findall(r"^(sched\.snapshot\(\)\.\w+)  # [^:]*: (.+)$", code, re.M)
    assert [expr for expr, _ in shown] == ["sched.snapshot().adapters", "sched.snapshot().adapter_bytes"]
    for expr, _ in shown:
        code = code.replace(expr + "  #", f"seen.append({expr})  #", 1)
    monkeypatch.chdir(ROOT)  # its adapter folders are relative to the repo
    scope = {"seen": []}
    exec(code, scope)
    assert [repr(v) if isinstance(v, tuple) else f"{v:,}" for v in scope["seen"]] == [v for _, v in shown]
