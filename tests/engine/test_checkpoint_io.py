"""A checkpoint on disk (``cp.save(path)`` / ``wb.Checkpoint.load(path, sched)``): a batch
saved mid-run resumes in a new process with the tokens, log-probs and top-k log-probs of the
uninterrupted run; every bundled family's caches round-trip; a scheduler whose model or
settings differ, another format version and unsavable requests are refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

import workbench as wb
from workbench.engine import checkpoint_io
from workbench.runtime.loading import DATA_DIR
from workbench.workloads.workload import prompt_of_length

from .alone import row_record

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]
SETTINGS = dict(max_batch=4, prompt_concurrency=3, prefill_step_size=8, history_size=4)


def scenario(sched: wb.Scheduler, tok) -> None:
    """Greedy and sampled rows, top-k rows, a submit_n group, a queued request."""
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 12, 0), max_tokens=14, top_logprobs=3, stop_ids=[]))
    sched.submit_n(
        wb.Request(
            prompt=prompt_of_length(tok, 20, 50),
            max_tokens=9,
            temperature=0.8,
            seed=4,
            top_logprobs=2,
            stop_ids=[],
        ),
        2,
    )
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 30, 90), max_tokens=6, stop_ids=[]))
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 5, 130), max_tokens=3, stop_ids=[]))


def records(sched) -> dict:
    return {
        str(u): [list(x) if isinstance(x, tuple) else x for x in row_record(sched, u)] for u in sched.requests
    }


def drive_to_save_point(sched, steps: int) -> None:
    for _ in range(steps):
        sched.admit(), sched.step(), sched.filter()


SAVE_POINTS = {  # what the batch holds when it is saved
    "prefilling": lambda s: s.state.prefilling is not None and bool(s.batch.rows),  # saved as queued
    "free slots": lambda s: bool(s.batch.free) and bool(s.batch.rows),  # rows ended, others running
}


def drive_until(sched, point: str, limit: int = 40) -> None:
    """Steps ``sched`` until the batch is at the save point ``point`` (at most ``limit`` steps)."""
    for _ in range(limit):
        if SAVE_POINTS[point](sched):
            return
        sched.admit(), sched.step(), sched.filter()
    raise AssertionError(f"no {point!r} save point in {limit} steps")


RESUME = """
import json, sys
import workbench as wb
model, tok = wb.load({model!r})
sched = wb.Scheduler(model, tok, **{settings!r})
sched.restore(wb.Checkpoint.load(sys.argv[1], sched))
assert sched.check().ok, str(sched.check())
sched.run()
top = lambda u: [[list(p) for p in t] for t in sched.top_logprobs(u)]
print(json.dumps({{str(u): [list(sched.tokens(u)), sched.logprobs(u), top(u), sched.finish_reason(u)]
                  for u in sched.requests}}))
"""


def resume_in_a_new_process(path: Path, model: str, settings: dict) -> dict:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    )
    out = subprocess.run(
        [sys.executable, "-c", RESUME.format(model=model, settings=settings), str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("point", SAVE_POINTS)
def test_a_batch_saved_mid_run_resumes_in_a_new_process_with_the_same_tokens(bundled, tmp_path, point):
    model, tok = bundled
    sched = wb.Scheduler(model, tok, **SETTINGS)
    scenario(sched, tok)
    drive_until(sched, point)
    path = sched.checkpoint().save(tmp_path / "batch.safetensors")
    sched.run()
    expected = {
        u: [list(t), lp, [[list(p) for p in pairs] for pairs in top], reason]
        for u, (t, lp, top, reason) in ((str(u), row_record(sched, u)) for u in sched.requests)
    }
    got = resume_in_a_new_process(path, str(wb.BUNDLED_MODEL), SETTINGS)
    assert got == json.loads(json.dumps(expected))
    assert any(top for _, _, top, _ in got.values()), "top-k rows were in the batch"


FAMILIES = {
    "llama": "tiny-llama",
    "gemma3": "tiny-gemma3",
    "qwen3next": "tiny-qwen3-next",
    "mamba2": "tiny-mamba2",
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_familys_caches_round_trip_and_the_run_continues_as_uninterrupted(tmp_path, family):
    model, tok = wb.load(DATA_DIR / "models" / FAMILIES[family])
    sched = wb.Scheduler(model, tok, **SETTINGS)
    scenario(sched, tok)
    drive_to_save_point(sched, 13)
    path = sched.checkpoint().save(tmp_path / "cp.safetensors")
    since = len(sched.events)
    sched.run()
    facts = [(e.kind, e.uid, e.step, e.row, e.token, e.top_logprobs) for e in sched.events[since:]]
    other = wb.Scheduler(model, tok, **SETTINGS)
    other.restore(wb.Checkpoint.load(path, other))
    assert other.check().ok, str(other.check())
    other.run()
    assert records(other) == records(sched)
    assert [(e.kind, e.uid, e.step, e.row, e.token, e.top_logprobs) for e in other.events[since:]] == facts
    assert len(other.events) == len(sched.events)


def test_loading_into_a_scheduler_with_other_settings_or_another_model_is_refused_naming_what_differs(
    bundled, random_llama, tmp_path
):
    model, tok = bundled
    sched = wb.Scheduler(model, tok, **SETTINGS)
    sched.submit(wb.Request(prompt=[5, 6, 7], max_tokens=4))
    sched.admit()
    path = sched.checkpoint().save(tmp_path / "a.safetensors")
    other = wb.Scheduler(model, tok, **{**SETTINGS, "max_batch": 2})
    with pytest.raises(ValueError, match=r"settings\.max_batch: 4 saved, 2 here"):
        wb.Checkpoint.load(path, other)
    llama = wb.Scheduler(*random_llama, **SETTINGS)
    with pytest.raises(ValueError, match=r"model\.weights_blake2b: .* saved, .* here"):
        wb.Checkpoint.load(path, llama)
    assert other.idle and llama.idle, "a refused load changes nothing"


def test_loading_across_prompt_cache_settings_is_refused_naming_the_prompt_cache(bundled, tmp_path):
    model, tok = bundled
    cached = wb.Scheduler(model, tok, **SETTINGS, prompt_cache=8)
    cached.submit(wb.Request(prompt=[5, 6, 7], max_tokens=4))
    cached.admit()
    path = cached.checkpoint().save(tmp_path / "a.safetensors")
    plain = wb.Scheduler(model, tok, **SETTINGS)
    with pytest.raises(ValueError, match=r"settings\.prompt_cache: true saved, false here"):
        wb.Checkpoint.load(path, plain)
    assert plain.idle
    wb.Checkpoint.load(path, wb.Scheduler(model, tok, **SETTINGS, prompt_cache=4))  # its size is not compared
    arrays, metadata = mx.load(str(path), return_metadata=True)
    document = json.loads(metadata["0.workbench"])
    del document["identity"]["settings"]["prompt_cache"]  # a file saved before it was recorded
    old = tmp_path / "old.safetensors"
    mx.save_safetensors(str(old), arrays, {**metadata, "0.workbench": json.dumps(document)})
    wb.Checkpoint.load(old, wb.Scheduler(model, tok, **SETTINGS, prompt_cache=8))


def test_a_file_of_another_format_or_version_is_refused(bundled, tmp_path):
    model, tok = bundled
    sched = wb.Scheduler(model, tok)
    sched.submit(wb.Request(prompt=[5, 6, 7], max_tokens=4))
    sched.run(max_steps=1)
    path = sched.checkpoint().save(tmp_path / "a.safetensors")
    arrays, metadata = mx.load(str(path), return_metadata=True)
    key = "0.workbench"  # mlx-lm's save_prompt_cache flattens [metadata, classes, scalars]
    document = json.loads(metadata[key])
    document["version"] = checkpoint_io.VERSION + 1
    mx.save_safetensors(str(tmp_path / "b.safetensors"), arrays, {**metadata, key: json.dumps(document)})
    with pytest.raises(
        ValueError, match=f"format version {checkpoint_io.VERSION + 1}; this workbench reads version 1"
    ):
        wb.Checkpoint.load(tmp_path / "b.safetensors", sched)
    mx.save_safetensors(str(tmp_path / "c.safetensors"), {"x": mx.zeros((2,))})
    with pytest.raises(ValueError, match="not a workbench checkpoint"):
        wb.Checkpoint.load(tmp_path / "c.safetensors", sched)
    with pytest.raises(FileNotFoundError):
        wb.Checkpoint.load(tmp_path / "missing.safetensors", sched)


def test_a_running_request_with_a_callable_and_a_quantized_cache_cannot_be_saved(bundled, tmp_path):
    model, tok = bundled
    sched = wb.Scheduler(model, tok)
    sched.submit(wb.Request(prompt=[5, 6, 7], max_tokens=4, on_token=lambda u, t: None))
    sched.admit()
    with pytest.raises(ValueError, match="uid 0 is running and has on_token"):
        sched.checkpoint().save(tmp_path / "a.safetensors")
    sched.run()
    assert sched.checkpoint().save(tmp_path / "a.safetensors").exists(), "finished: saved without it"
    quantized = wb.Scheduler(model, tok, kv_bits=8, kv_group_size=32)
    with pytest.raises(ValueError, match=r"quantized KV cache \(kv_bits=8\)"):
        quantized.checkpoint().save(tmp_path / "q.safetensors")
    packed = wb.Scheduler(model, tok, layout="packed")
    packed.submit(wb.Request(prompt=[5, 6, 7], max_tokens=3))
    packed.admit()
    packed.step()
    with pytest.raises(ValueError, match=r"layout='packed' keeps its KV in pages.*restore in memory"):
        packed.checkpoint().save(tmp_path / "p.safetensors")
    assert not (tmp_path / "p.safetensors").exists()


def test_an_idle_scheduler_saves_and_loads(bundled, tmp_path):
    model, tok = bundled
    sched = wb.Scheduler(model, tok)
    path = sched.checkpoint().save(tmp_path / "idle.safetensors")
    loaded = wb.Checkpoint.load(path, sched)
    sched.restore(loaded)
    assert sched.idle and sched.check().ok
    uid = sched.submit(wb.Request(prompt=[5, 6, 7], max_tokens=3))
    sched.run()
    assert len(sched.tokens(uid)) == 3


def test_a_running_constrained_row_cannot_be_saved(bundled, tmp_path):
    pytest.importorskip("llguidance", reason="structured output needs the `structured` extra (llguidance)")
    model, tok = bundled
    sched = wb.Scheduler(model, tok)
    sched.submit(wb.Request(prompt=[5, 6, 7], max_tokens=4, regex="[0-9]+"))
    sched.admit()
    with pytest.raises(ValueError, match="uid 0 is running and has a structured-output constraint"):
        sched.checkpoint().save(tmp_path / "a.safetensors")


@pytest.mark.realmodel
def test_a_real_chat_batch_saved_mid_run_resumes_in_a_new_process_with_the_same_tokens(tmp_path):
    """SmolLM2-135M (as ``wb.load`` gives it on the CPU): three chat rows, one with top-k
    log-probs and one sampled, saved after a few steps; the new process's rows equal the
    uninterrupted run's tokens, log-probs, top-k and finish reasons."""
    from tests.real_model import NAME, chat_ids, dense_real_model

    model, tok = dense_real_model()
    settings = dict(max_batch=3, history_size=4)
    sched = wb.Scheduler(model, tok, **settings)
    questions = ["What is the capital of France?", "Name a primary colour.", "Say hello."]
    sched.submit(wb.Request(prompt=chat_ids(tok, questions[0]), max_tokens=6, top_logprobs=3))
    sched.submit(wb.Request(prompt=chat_ids(tok, questions[1]), max_tokens=5, temperature=0.7, seed=3))
    sched.submit(wb.Request(prompt=chat_ids(tok, questions[2]), max_tokens=4))
    drive_to_save_point(sched, 3)
    assert sched.batch.rows
    path = sched.checkpoint().save(tmp_path / "chat.safetensors")
    sched.run()
    expected = {
        u: [list(t), lp, [[list(p) for p in pairs] for pairs in top], reason]
        for u, (t, lp, top, reason) in ((str(u), row_record(sched, u)) for u in sched.requests)
    }
    assert resume_in_a_new_process(path, NAME, settings) == json.loads(json.dumps(expected))


def test_save_paths_name_a_file_or_are_refused_naming_the_path(bundled, tmp_path, monkeypatch):
    """Attack a2: "newdir/" wrote newdir.safetensors, "afile/x" raised FileExistsError, a
    240-character name overflowed through the temporary name, "~" was not expanded."""
    cp = wb.Scheduler(*bundled).checkpoint()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    for path in ("newdir/", "", ".", "sub/.."):
        with pytest.raises(ValueError, match=r"checkpoint path .* names no file"):
            cp.save(path)
    assert not (tmp_path / "newdir.safetensors").exists() and not (tmp_path / "newdir").exists()
    with pytest.raises(ValueError, match=r"cannot write .*afile/x\.safetensors: .*afile is a file"):
        cp.save("afile/x")
    long = "n" * 240
    assert cp.save(long).resolve() == (tmp_path / (long + ".safetensors")).resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", long + ".safetensors"], "no temporary left"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cp.save("~/x") == tmp_path / "home" / "x.safetensors"
    assert wb.Checkpoint.load("~/x", wb.Scheduler(*bundled)) is not None


def test_loading_a_folder_is_refused_as_saving_one_is(bundled, tmp_path, monkeypatch):
    """A new user's run (2026-12-08): ``Checkpoint.load("run1", s)`` on a folder said ``no
    checkpoint at run1.safetensors`` where ``save`` says ``run1 is a folder; give a file name``."""
    sched = wb.Scheduler(*bundled)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2.safetensors").mkdir()
    for path, folder in (
        ("run1", "run1"),
        ("run2", "run2.safetensors"),
        ("run2.safetensors", "run2.safetensors"),
    ):
        words = rf"Checkpoint\.load: {folder} is a folder; give a file name, e\.g\. {folder}/checkpoint\.safetensors"
        with pytest.raises(ValueError, match=words):
            wb.Checkpoint.load(path, sched)
        with pytest.raises(ValueError, match=words.replace("load", "save")):
            sched.checkpoint().save(path)
    sched.checkpoint().save("run1.safetensors")  # a file beside the folder: "run1" loads it
    assert wb.Checkpoint.load("run1", sched) is not None
