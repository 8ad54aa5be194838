"""A checkpoint file is checked field by field before anything is restored
(``workbench.engine.checkpoint_fields``): a token id outside the vocabulary, a cache array
that does not fit the model or the batch, a duplicated uid, inconsistent offsets or counts
are each refused with a ValueError naming the field and the limit, the loading scheduler
unchanged. ``cp.save`` returns the file it wrote, and a model wrapped for adapters by any
scheduler keeps its checkpoint identity."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

import workbench as wb
from workbench.runtime.loading import DATA_DIR

from .checkpoint_fuzz import SETTINGS, edited, read_parts, saved_checkpoint, scenario

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]
VOCAB = 4096  # the bundled model's


@pytest.fixture(scope="module")
def base(bundled, tmp_path_factory) -> Path:
    """A mid-run checkpoint of the bundled model: rows running (one with top-k), a finished
    row, requests queued."""
    path = saved_checkpoint(*bundled, tmp_path_factory.mktemp("cp"))
    _, _, doc = read_parts(path)
    running = [u for u in doc["batch"]["rows"] if doc["requests"][u]["status"] == "running"]
    assert len(running) >= 2 and doc["queue"], "the save point has running rows and a queue"
    assert doc["requests"][0]["tokens"] and doc["requests"][0]["top_logprobs"][0]
    return path


def _first_running(doc: dict) -> dict:
    return next(doc["requests"][u] for u in doc["batch"]["rows"] if doc["requests"][u]["status"] == "running")


def _set(path: tuple, value) -> callable:
    def change(doc):
        node = doc
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value

    return change


FIELD_EDITS = {  # edit of the JSON document -> what the refusal names
    "pending token outside the vocabulary": (
        _set(("batch", "pending", "tokens", 0), 10**6),
        r"checkpoint field batch\.pending\.tokens\[0\]: 1000000 outside the vocabulary \[0, 4096\)",
    ),
    "negative pending token": (
        _set(("batch", "pending", "tokens", 1), -1),
        r"batch\.pending\.tokens\[1\]: -1 outside the vocabulary",
    ),
    "generated token outside the vocabulary": (
        _set(("requests", 0, "tokens", 0), VOCAB),
        r"requests\[0\]\.tokens\[0\]: 4096 outside the vocabulary \[0, 4096\)",
    ),
    "top-k token outside the vocabulary": (
        _set(("requests", 0, "top_logprobs", 0, 0, 0), 10**9),
        r"requests\[0\]\.top_logprobs\[0\]\[0\]\[0\]: 1000000000 outside the vocabulary",
    ),
    "prompt token outside the vocabulary": (
        _set(("requests", 1, "request", "prompt", 0), 99999),
        r"requests\[1\]\.request: prompt\[0\] = 99999 is outside the vocabulary \[0, 4096\)",
    ),
    "duplicated uid": (_set(("requests", 1, "uid"), 0), r"requests\[1\]\.uid: uid 0 appears twice"),
    "uid past next_uid": (_set(("requests", 1, "uid"), 77), r"requests\[1\]\.uid: 77 is above"),
    "a uid in two rows": (
        lambda d: d["batch"]["rows"].__setitem__(1, d["batch"]["rows"][0]),
        r"batch\.rows: a uid holds two rows",
    ),
    "a running row queued too": (
        lambda d: d["queue"].append(d["batch"]["rows"][0]),
        r"queue\[\d\]: uid \d is running, not waiting",
    ),
    "unknown status": (
        _set(("requests", 0, "status"), "sleeping"),
        r"requests\[0\]\.status: 'sleeping' not one of",
    ),
    "finish reason of a running row": (
        lambda d: _first_running(d).__setitem__("finish_reason", "stop"),
        r"finish_reason: \"stop\" for a running request",
    ),
    "negative fed": (_set(("requests", 0, "fed"), -3), r"requests\[0\]\.fed: -3 is below 0"),
    "fed unlike the tokens of a running row": (
        lambda d: _first_running(d).__setitem__("fed", _first_running(d)["fed"] + 1),
        r"batch\.rows\[\d\] \(uid \d\)\.fed",
    ),
    "more tokens than max_tokens": (
        lambda d: d["requests"][0]["request"].__setitem__("max_tokens", 1),
        r"requests\[0\]\.tokens: \d+ tokens, at most 0 for a running row",
    ),
    "non-finite submit time": (
        _set(("requests", 2, "submitted_s"), math.nan),
        r"requests\[2\]\.submitted_s: NaN is not a finite number",
    ),
    "negative projected bytes": (
        _set(("requests", 2, "projected_bytes"), -5),
        r"requests\[2\]\.projected_bytes: -5 is below 0",
    ),
    "a positive log-probability": (
        _set(("batch", "pending", "logprobs", 0), 3.5),
        r"batch\.pending\.logprobs\[0\]: 3\.5 is not a log-probability",
    ),
    "pending tokens for fewer rows": (
        lambda d: d["batch"]["pending"]["tokens"].pop(),
        r"batch\.pending\.tokens: \d entries, \d expected",
    ),
    "a free slot outside the cache rows": (_set(("batch", "free"), [9]), r"batch\.free\[0\]: 9 is above"),
    "next_uid beyond the requests": (
        lambda d: d["counters"].__setitem__("next_uid", d["counters"]["next_uid"] + 1),
        r"requests: \d entries, \d expected",
    ),
    "a missing field": (lambda d: d["requests"][0].pop("fed"), r"requests\[0\]: fields missing \['fed'\]"),
    "a field not_restored names no callable": (
        _set(("requests", 0, "not_restored"), ["seed"]),
        r"requests\[0\]\.not_restored\[0\]: \"seed\" not one of \['logits_processors', 'sampler', 'on_token'\]",
    ),
    "not_restored naming one twice": (
        _set(("requests", 0, "not_restored"), ["sampler", "sampler"]),
        r"requests\[0\]\.not_restored: a name appears twice",
    ),
    "a seed generator numpy refuses": (_set(("rng", "state"), "x"), r"checkpoint field rng"),
    "an unknown event kind": (
        _set(("events", 0, "kind"), "boom"),
        r"events\[0\]: Event\.kind must be one of",
    ),
    "an event of no saved request": (
        _set(("events", 3, "uid"), 41),
        r"checkpoint field events\[3\]\.uid: 41 is no request's uid",
    ),
    "a lost request": (
        lambda d: d["queue"].pop(),
        r"requests\[uid \d\]\.status: queued but not in the queue",
    ),
}


def assert_refused(bundled, base: Path, out: Path, message: str, **change) -> None:
    """``base`` edited by ``change`` (see ``edited``) is refused with ``message``."""
    path = edited(base, out, **change)
    with pytest.raises(ValueError, match=message):
        wb.Checkpoint.load(path, wb.Scheduler(*bundled, **SETTINGS))


@pytest.mark.parametrize("edit", FIELD_EDITS)
def test_each_bad_field_is_refused_with_a_value_error_naming_it(bundled, base, tmp_path, edit):
    change, message = FIELD_EDITS[edit]
    assert_refused(bundled, base, tmp_path / "bad.safetensors", message, document=change)


def test_a_file_saved_before_not_restored_was_written_loads_with_nothing_lost(bundled, base, tmp_path):
    def drop(doc):
        for record in doc["requests"]:
            assert record.pop("not_restored") == []

    sched = wb.Scheduler(*bundled, **SETTINGS)
    sched.restore(wb.Checkpoint.load(edited(base, tmp_path / "old.safetensors", document=drop), sched))
    assert all(s.not_restored == () for s in sched.requests.values())


def _layer(i: int, j: int, change) -> callable:
    """Change array ``j`` of layer ``i``'s state (a BatchKVCache: keys, values, offset,
    left_padding)."""

    def apply(arrays):
        arrays[f"{i}.{j}"] = change(arrays[f"{i}.{j}"])

    return apply


ARRAY_EDITS = {  # edit of the cache arrays -> what the refusal names
    "keys of another head_dim": (
        _layer(0, 0, lambda a: a[..., :16]),
        r"caches\[0\]\.keys: shape \(\d, 2, \d+, 16\), this model and batch need \dx2x\*x32",
    ),
    "values of another n_kv_heads": (
        _layer(1, 1, lambda a: mx.concatenate([a, a], axis=1)),
        r"caches\[1\]\.values: shape \(\d, 4, \d+, 32\)",
    ),
    "keys of another dtype": (
        _layer(2, 0, lambda a: a.astype(mx.float16)),
        r"caches\[2\]\.keys: dtype mlx\.core\.float16, this model's is mlx\.core\.float32",
    ),
    "a row missing from the keys": (_layer(3, 0, lambda a: a[1:]), r"caches\[3\]\.keys: shape"),
    "an offset unlike the row's tokens": (
        _layer(0, 2, lambda a: a + 1),
        r"caches\[0\]\.offset\[0\]: \d+, its row holds \d+ tokens",
    ),
    "left padding unlike the KV width": (
        _layer(4, 3, lambda a: a + 2),
        r"caches\[4\]\.left_padding\[0\]: \d+ \+ offset \d+ != KV width \d+",
    ),
    "a write index past the capacity": (
        _layer(1, 4, lambda a: a + 100_000),
        r"caches\[1\]\._idx: \d+ is above \d+",
    ),
}


@pytest.mark.parametrize("edit", ARRAY_EDITS)
def test_cache_arrays_that_do_not_fit_the_model_or_the_batch_are_refused(bundled, base, tmp_path, edit):
    change, message = ARRAY_EDITS[edit]
    assert_refused(bundled, base, tmp_path / "bad.safetensors", message, arrays=change)


def test_a_ring_whose_counters_are_out_of_step_is_refused_not_restored_to_raise_at_every_step(tmp_path):
    """tiny-gemma3's sliding-window layers (``BatchRotatingKVCache``): a rotated ring's
    ``_offset`` below its window used to load with ``check()`` ok, then every step raised."""
    model, tok = wb.load(DATA_DIR / "models" / "tiny-gemma3")
    base = saved_checkpoint(model, tok, tmp_path)
    _, _, doc = read_parts(base)
    ring = _layer(
        0, 5, lambda a: mx.zeros_like(a)
    )  # layer 0 is a ring: keys, values, offset, lp, max_size, _offset
    assert_refused(
        (model, tok),
        base,
        tmp_path / "bad.safetensors",
        r"caches\[0\]\._offset: 0 in a rotated ring",
        arrays=ring,
    )


def test_a_refused_load_changes_nothing_and_the_run_continues_as_if_it_never_happened(
    bundled, base, tmp_path
):
    model, tok = bundled
    twin, sched = (wb.Scheduler(model, tok, **SETTINGS) for _ in range(2))
    for s in (twin, sched):
        scenario(s, tok)
        s.admit(), s.step(), s.filter()
    before = (sched.state, sched.recorder, sched.step_index, len(sched.events))
    for edit in ("pending token outside the vocabulary", "duplicated uid"):
        path = edited(base, tmp_path / "bad.safetensors", document=FIELD_EDITS[edit][0])
        with pytest.raises(ValueError):
            wb.Checkpoint.load(path, sched)
    assert (sched.state, sched.recorder, sched.step_index, len(sched.events)) == before
    sched.run(), twin.run()
    assert {u: sched.tokens(u) for u in sched.requests} == {u: twin.tokens(u) for u in twin.requests}


KILLER = """
import sys
import workbench as wb
from workbench.runtime.loading import DATA_DIR
from tests.engine.checkpoint_fuzz import SETTINGS
model, tok = wb.load()
sched = wb.Scheduler(model, tok, **SETTINGS)
try:
    sched.restore(wb.Checkpoint.load(sys.argv[1], sched))
except ValueError as exc:
    print("refused:", exc)
else:
    sched.run()
    print("ran")
"""


def test_a_pending_token_outside_the_vocabulary_never_kills_the_process(base, tmp_path):
    """Before the fields were checked this file loaded and the next step's embedding
    lookup read outside the table: SIGSEGV (exit -11)."""
    path = edited(
        base, tmp_path / "bad.safetensors", document=FIELD_EDITS["pending token outside the vocabulary"][0]
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    )
    out = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", KILLER, str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    assert "refused: checkpoint field batch.pending.tokens[0]: 1000000 outside the vocabulary" in out.stdout


# -- save returns what it wrote --------------------------------------------------------------
def test_save_returns_the_file_it_wrote_and_load_takes_it_or_the_name_given(bundled, tmp_path):
    model, tok = bundled
    sched = wb.Scheduler(model, tok, **SETTINGS)
    scenario(sched, tok)
    sched.admit(), sched.step()
    cp = sched.checkpoint()
    written = cp.save(tmp_path / "run1" / "batch")
    assert written == tmp_path / "run1" / "batch.safetensors" and written.is_file()
    assert sorted(p.name for p in (tmp_path / "run1").iterdir()) == ["batch.safetensors"], "no stray file"
    other = wb.Scheduler(model, tok, **SETTINGS)
    for name in (written, tmp_path / "run1" / "batch", str(written)):
        loaded = wb.Checkpoint.load(name, other)
        assert loaded.step == cp.step and sorted(loaded.state.requests) == sorted(cp.state.requests)
    assert cp.save(tmp_path / "b.safetensors") == tmp_path / "b.safetensors"


def test_saving_onto_a_folder_is_refused_and_writes_nothing(bundled, tmp_path):
    sched = wb.Scheduler(*bundled, **SETTINGS)
    cp = sched.checkpoint()
    (tmp_path / "run1").mkdir()
    (tmp_path / "x.safetensors").mkdir()
    for target in ("run1", "x", "x.safetensors"):
        with pytest.raises(ValueError, match=r"is a folder; give a file name"):
            cp.save(tmp_path / target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run1", "x.safetensors"]
    assert not any((tmp_path / "run1").iterdir()) and not any((tmp_path / "x.safetensors").iterdir())
    with pytest.raises(ValueError, match="Checkpoint.load: .* is a folder; give a file name"):
        wb.Checkpoint.load(tmp_path / "x.safetensors", sched)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux's /proc: a folder that takes no new file")
def test_saving_into_a_folder_that_takes_no_file_names_the_path_not_mlxs_temporary(bundled):
    cp = wb.Scheduler(*bundled, **SETTINGS).checkpoint()
    with pytest.raises(
        PermissionError, match=r"Checkpoint.save: cannot write /proc/x.safetensors: its folder /proc"
    ):
        cp.save("/proc/x")


# -- identity and adapters ---------------------------------------------------------------------
ADAPTERS = {"prose": str(ROOT / "data/adapters/prose"), "numbers": str(ROOT / "data/adapters/numbers")}


def test_a_model_wrapped_for_adapters_by_another_scheduler_keeps_its_checkpoint_identity(tmp_path):
    model, tok = wb.load(wb.BUNDLED_MODEL)  # a private copy: adapters wrap its layers in place
    plain = wb.Scheduler(model, tok, **SETTINGS)
    plain.submit(wb.Request(prompt=[5, 6, 7, 8], max_tokens=6))
    plain.admit(), plain.step()
    path = plain.checkpoint().save(tmp_path / "plain.safetensors")
    wb.Scheduler(model, tok, adapters=ADAPTERS)  # wraps the q/v projections of the shared model
    again = wb.Scheduler(model, tok, **SETTINGS)
    again.restore(wb.Checkpoint.load(path, again))
    again.run()
    plain.run()
    assert again.tokens(0) == plain.tokens(0)


def test_adapter_sets_with_other_weights_are_told_apart(tmp_path):
    import shutil

    model, tok = wb.load(wb.BUNDLED_MODEL)
    one = wb.Scheduler(model, tok, **SETTINGS, adapters={"a": ADAPTERS["prose"]})
    path = one.checkpoint().save(tmp_path / "one.safetensors")
    same = wb.Scheduler(
        model, tok, **SETTINGS, adapters={"a": shutil.copytree(ADAPTERS["prose"], tmp_path / "p")}
    )
    assert wb.Checkpoint.load(path, same).state.batch.rows == [], "the same weights under another folder load"
    other = wb.Scheduler(model, tok, **SETTINGS, adapters={"a": ADAPTERS["numbers"]})
    with pytest.raises(ValueError, match=r"model\.adapters_blake2b: .* saved, .* here"):
        wb.Checkpoint.load(path, other)


# -- the import circle -------------------------------------------------------------------------
def test_no_import_circle_runs_through_the_checkpoint_modules():
    """``checkpoint.py`` imports ``checkpoint_io`` (which imports ``checkpoint_fields``) and
    ``integrity``; none of them imports ``checkpoint.py`` back, not even inside a function."""
    from tests.architecture.test_layers import ENGINE, engine_imports

    graph = {
        p.relative_to(ENGINE).with_suffix("").as_posix(): engine_imports(p) for p in ENGINE.rglob("*.py")
    }

    def reaches(start: str, goal: str) -> list[str] | None:
        stack, seen = [[start]], {start}
        while stack:
            path = stack.pop()
            for nxt in sorted(graph.get(path[-1], ())):
                if nxt == goal:
                    return path + [nxt]
                if nxt not in seen:
                    seen.add(nxt), stack.append(path + [nxt])
        return None

    for module in ("checkpoint", "checkpoint_io", "checkpoint_fields", "integrity"):
        assert reaches(module, module) is None, f"import circle: {' -> '.join(reaches(module, module))}"


def test_weights_changed_in_place_go_unseen_by_the_scheduler_that_saved_and_a_fork_sees_them(tmp_path):
    """The documented limit (``checkpoint_io.identity_of``): a scheduler's identity is computed
    once; after weights change in place, a fork (or a new scheduler) computes it anew and
    refuses a file saved under the old weights."""
    from mlx.utils import tree_map

    model, tok = wb.load(wb.BUNDLED_MODEL)  # a private copy: its weights change below
    sched = wb.Scheduler(model, tok, **SETTINGS)
    path = sched.checkpoint().save(tmp_path / "before.safetensors")
    model.update(tree_map(lambda a: a * 2 if mx.issubdtype(a.dtype, mx.floating) else a, model.parameters()))
    wb.Checkpoint.load(path, sched)  # its identity was computed before the change: still loads
    with pytest.raises(ValueError, match=r"model\.weights_blake2b: .* saved, .* here"):
        wb.Checkpoint.load(path, sched.fork())
