"""A checkpoint-file fuzzer: random byte edits and random field edits to real checkpoint
files, each loaded with ``wb.Checkpoint.load``; a load may only raise ``ValueError`` (naming
what it refuses) or succeed, and then the restored scheduler runs to completion and passes
``check()``. Never another exception, a signal or a wedge; a refused load leaves the
scheduler as it was.

Run by ``tests/engine/test_checkpoint_fuzz.py`` (bounded, in a subprocess, so a segfault
fails the test naming the edit); longer by the command::

    python -m tests.engine.checkpoint_fuzz --family tiny-llama,tiny-mamba2+budget --examples 5000 --seed 7

(``--family`` bundled model folders under ``data/models``; every edit is printed before it
is tried, so the last line names the one that killed or hung the process; the same
``--seed`` repeats the same edits). ``pytest tests/engine/test_checkpoint_fuzz.py --long``
runs 2,000 edits per family. Files are
padded-layout checkpoints: a packed scheduler's checkpoints restore in memory only
(``Checkpoint.save`` refuses them).

The edits (``EDITS``): bytes flipped, inserted, deleted, the file truncated or extended;
a JSON field of the document replaced by a value of another type or an extreme value (ids
at and past the vocabulary, negative, huge, NaN, inf), removed, or a list entry duplicated;
a cache array sliced, widened, cast to another dtype, its values shifted, one entry (a ring's
counter or flag) set, the array removed or duplicated under another key; a layer's class
or a scalar's type changed.
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import workbench as wb  # isort: skip  (first: the BLAS start-up, workbench.runtime.blas, before mlx)

import mlx.core as mx  # noqa: E402  after workbench, as every lab script

from workbench.runtime.loading import DATA_DIR  # noqa: E402
from workbench.workloads.workload import prompt_of_length  # noqa: E402

KEY = "0.workbench"  # mlx-lm's save_prompt_cache flattens [metadata, classes, scalars]
SETTINGS = dict(max_batch=3, prompt_concurrency=2, prefill_step_size=8, history_size=2)
SLACK_STEPS = 50  # steps a restored scheduler may take beyond its requests' tokens and prefill chunks


# -- reading and writing a checkpoint file's parts ---------------------------------------
def read_parts(path: str | Path) -> tuple[dict, dict, dict]:
    """``(arrays, metadata, document)`` of a checkpoint file (its safetensors arrays by key,
    its string metadata, the parsed workbench document)."""
    arrays, metadata = mx.load(str(path), return_metadata=True)
    return dict(arrays), dict(metadata), json.loads(metadata[KEY])


def write_parts(path: str | Path, arrays: dict, metadata: dict, document: dict | None) -> Path:
    """Write a checkpoint file from its parts (``document`` replaces the metadata's JSON)."""
    metadata = dict(metadata)
    if document is not None:
        metadata[KEY] = json.dumps(document)
    mx.save_safetensors(str(path), arrays, metadata)
    return Path(path)


def edited(path: Path, out: Path, document=None, arrays=None, metadata=None) -> Path:
    """A copy of the checkpoint at ``path`` written to ``out`` after the callables
    ``document(doc)``, ``arrays(arrays)``, ``metadata(metadata)`` changed its parts in place."""
    a, m, d = read_parts(path)
    for change, part in ((document, d), (arrays, a), (metadata, m)):
        if change is not None:
            change(part)
    return write_parts(out, a, m, d)


# -- a real checkpoint ---------------------------------------------------------------------
def scenario(sched: wb.Scheduler, tok: Any) -> None:
    """Greedy, sampled and top-k rows, a submit_n group, requests left queued."""
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 12, 0), max_tokens=14, top_logprobs=3, stop_ids=[]))
    sched.submit_n(
        wb.Request(prompt=prompt_of_length(tok, 20, 50), max_tokens=9, temperature=0.8, seed=4, stop_ids=[]),
        2,
    )
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 30, 90), max_tokens=6, stop_ids=[]))
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 5, 130), max_tokens=3, stop_ids=[]))


def budget_settings(model: Any, tok: Any) -> dict:
    """:data:`SETTINGS` with a KV budget of two of :func:`scenario`'s requests alone (so
    admission waits on it)."""
    alone = wb.Scheduler(model, tok, **SETTINGS).ledger.alone_bytes(30, 14)
    return dict(SETTINGS, kv_budget_bytes=2 * alone)


def saved_checkpoint(model: Any, tok: Any, folder: Path, steps: int = 7, settings: dict = SETTINGS) -> Path:
    """A checkpoint file of :func:`scenario` after ``steps`` engine iterations (rows running,
    some finished, some queued, free slots) of a scheduler with ``settings``, saved under
    ``folder``."""
    sched = wb.Scheduler(model, tok, **settings)
    scenario(sched, tok)
    for _ in range(steps):
        sched.admit(), sched.step(), sched.filter()
    return sched.checkpoint().save(folder / "base.safetensors")


# -- edits ----------------------------------------------------------------------------------
def _leaves(node: Any, path: tuple = ()) -> list[tuple]:
    """Every path into the JSON document (dict keys and list indices), containers included."""
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _leaves(v, path + (i,))
    return out


def _value(rng: random.Random, vocab: int) -> Any:
    """A value of a random kind: an extreme or boundary number, another type, a container."""
    return rng.choice(
        [
            -1,
            0,
            1,
            2,
            vocab - 1,
            vocab,
            vocab + 50_000,
            2**31,
            2**63,
            -(2**63),
            10**30,
            0.5,
            -0.5,
            float("nan"),
            float("inf"),
            float("-inf"),
            1e308,
            True,
            False,
            None,
            "",
            "running",
            "finished",
            "queued",
            "stop",
            [],
            [0],
            [vocab],
            {},
            {"0": 1},
        ]
    )


def edit_field(rng: random.Random, document: dict, vocab: int) -> str:
    """Change one field of the document: replace, remove, duplicate a list entry, or nudge
    an int. Returns what it did."""
    paths = [p for p in _leaves(document) if p and p[0] != "identity"] or [()]
    path = rng.choice(paths)
    parent = document
    for k in path[:-1]:
        parent = parent[k]
    key, old = path[-1], parent[path[-1]]
    action = rng.choice(["replace", "replace", "remove", "duplicate", "nudge"])
    if action == "remove":
        del parent[key]
    elif action == "duplicate" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(old))
    elif action == "nudge" and isinstance(old, int) and not isinstance(old, bool):
        parent[key] = old + rng.choice([-2, -1, 1, 2, vocab])
    else:
        action, parent[key] = "replace", _value(rng, vocab)
    new = "removed" if action == "remove" else json.dumps(parent[key])[:40]
    return f"field {'.'.join(map(str, path))}: {action} ({json.dumps(old)[:40]} -> {new})"


def edit_array(rng: random.Random, arrays: dict, metadata: dict) -> str:
    """Change one cache array (shape, dtype, values, presence) or a layer's class name."""
    key = rng.choice(sorted(arrays))
    a = arrays[key]
    action = rng.choice(["slice", "widen", "dtype", "shift", "set", "remove", "duplicate", "class", "scalar"])
    if action == "set":  # a counter or flag (a 0-d array: _idx, _offset, rotated, max_size) or one entry
        if a.dtype == mx.bool_:
            arrays[key] = mx.logical_not(a)
        else:
            flat = a.reshape(-1)
            if flat.size:
                i = rng.randrange(flat.size)
                flat[i] = rng.choice([0, 1, -1, 2, 255, 10**6])
                arrays[key] = flat.reshape(a.shape)
    elif action == "slice" and a.ndim:
        axis = rng.randrange(a.ndim)
        arrays[key] = mx.take(a, mx.arange(max(0, a.shape[axis] - rng.choice([1, a.shape[axis]]))), axis=axis)
    elif action == "widen" and a.ndim:
        axis = rng.randrange(a.ndim)
        arrays[key] = (
            mx.concatenate([a, mx.take(a, mx.array([0]), axis=axis)], axis=axis) if a.shape[axis] else a
        )
    elif action == "dtype":
        arrays[key] = a.astype(
            rng.choice([mx.float16, mx.bfloat16, mx.int32, mx.uint32, mx.float32, mx.int64])
        )
    elif action == "shift":
        arrays[key] = a + rng.choice([-300, -1, 1, 7, 2**20])
    elif action == "remove":
        del arrays[key]
    elif action == "duplicate":
        arrays[key.rsplit(".", 1)[0] + ".9"] = a
    elif action == "class":
        classes = [k for k in metadata if k.startswith("1.")]
        if classes:
            name = rng.choice(classes)
            metadata[name] = rng.choice(
                ["KVCache", "BatchKVCache", "BatchRotatingKVCache", "ArraysCache", "CacheList", "mx", "Nope"]
            )
            return f"array metadata {name}: class -> {metadata[name]}"
    elif action == "scalar":
        scalars = [k for k in metadata if k.startswith("2.") and k.endswith(".1")]
        if scalars:
            name = rng.choice(scalars)
            metadata[name] = rng.choice(["scalar", "string", "none", "other"])
            return f"array metadata {name}: type -> {metadata[name]}"
    return f"array {key} {tuple(a.shape)} {a.dtype}: {action}"


def edit_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """Flip, insert or delete bytes, truncate, or append garbage."""
    data = bytearray(data)
    action = rng.choice(["flip", "flip", "header", "insert", "delete", "truncate", "append"])
    n = len(data)
    if action == "flip":
        for _ in range(rng.choice([1, 1, 4, 32])):
            data[rng.randrange(n)] ^= 1 << rng.randrange(8)
    elif action == "header":  # the 8-byte length and the JSON header
        i = rng.randrange(min(n, 8 + int.from_bytes(data[:8], "little") if n >= 8 else n))
        data[i] = rng.randrange(256)
    elif action == "insert":
        i = rng.randrange(n)
        data[i:i] = bytes(rng.randrange(256) for _ in range(rng.choice([1, 3, 100])))
    elif action == "delete":
        i = rng.randrange(n)
        del data[i : i + rng.choice([1, 3, 100])]
    elif action == "truncate":
        del data[rng.randrange(n) :]
    else:
        data += bytes(rng.randrange(256) for _ in range(rng.choice([1, 16, 4096])))
    return bytes(data), f"bytes: {action}"


EDITS = ("bytes", "field", "field", "field", "array")


def mutate(rng: random.Random, base: Path, out: Path, vocab: int) -> str:
    """Write a randomly edited copy of the checkpoint ``base`` to ``out``; returns the edit."""
    kind = rng.choice(EDITS)
    if kind == "bytes":
        data, what = edit_bytes(rng, base.read_bytes())
        out.write_bytes(data)
        return what
    arrays, metadata, document = read_parts(base)
    what = edit_field(rng, document, vocab) if kind == "field" else edit_array(rng, arrays, metadata)
    write_parts(out, arrays, metadata, document)
    return what


def steps_needed(sched: wb.Scheduler) -> int:
    """An upper bound on the engine iterations ``sched`` needs to finish every request
    (each unfinished request's remaining tokens, one prefill chunk per ``prefill_step_size``
    inputs, ``SLACK_STEPS``): a scheduler still busy after it is wedged."""
    chunk = sched.config.prefill_step_size
    return SLACK_STEPS + sum(
        s.valid.request.max_tokens - len(s.tokens) + s.n_inputs // chunk + 2
        for s in sched.state.requests.values()
        if not s.finished
    )


# -- one load ----------------------------------------------------------------------------------
def try_load(path: Path, sched: wb.Scheduler) -> str:
    """Load ``path`` into ``sched``: ``"refused: <message>"`` for a ValueError (``sched``
    checked unchanged), else restore, run to idle and check.

    Raises:
        AssertionError: a refused load that changed ``sched``, a restored scheduler that does
            not finish within :func:`steps_needed` or fails ``check()``. Any other exception propagates.
    """
    before = (sched.state, sched.recorder, sched.step_index, len(sched.events))
    try:
        cp = wb.Checkpoint.load(path, sched)
    except ValueError as exc:
        after = (sched.state, sched.recorder, sched.step_index, len(sched.events))
        assert after == before, "a refused load changed the scheduler"
        return f"refused: {str(exc)[:160]}"
    sched.restore(cp)
    report = sched.check()
    assert report.ok, f"loaded, then check() fails: {report}"
    limit = steps_needed(sched)
    for _ in range(limit):
        if sched.idle:
            break
        sched.admit(), sched.step(), sched.filter()
    assert sched.idle, f"loaded, then not idle after {limit} steps (wedged)"
    report = sched.check()
    assert report.ok, f"loaded and ran, then check() fails: {report}"
    return "loaded and ran"


def fuzz(family: str, examples: int, seed: int, seconds: float | None = None) -> dict:
    """Run ``examples`` random edits (or until ``seconds`` pass) on a checkpoint of the
    bundled model ``family`` (``"tiny-gemma3+budget"``: under :func:`budget_settings`);
    prints each edit before it is tried (flushed) and its outcome. Returns counts by outcome."""
    family, _, variant = family.partition("+")
    model, tok = wb.load(DATA_DIR / "models" / family)
    settings = budget_settings(model, tok) if variant == "budget" else SETTINGS
    rng = random.Random(seed)
    counts = {"refused": 0, "loaded and ran": 0}
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        base = saved_checkpoint(model, tok, Path(folder), settings=settings)
        sched = wb.Scheduler(model, tok, **settings)
        vocab = sched.vocab_size
        assert try_load(base, sched) == "loaded and ran", "the unedited file loads"
        for i in range(examples):
            if seconds is not None and time.monotonic() - start > seconds:
                break
            out = Path(folder) / f"edit{i}.safetensors"
            what = mutate(rng, base, out, vocab)
            print(f"TRY {family} #{i}: {what}", flush=True)
            outcome = try_load(out, sched)
            counts[outcome.split(":")[0]] += 1
            print(f"  {outcome}", flush=True)
            out.unlink()
    return counts


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); prints ``RESULT <json counts>`` last."""
    faulthandler.enable()  # a segfault prints the Python stack of the edit that caused it
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--family",
        default="tiny-llama",
        help="bundled model folder(s), comma-separated; NAME+budget: with a KV budget",
    )
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--seconds", type=float, default=None, help="per family: stop after this long (wall clock)"
    )
    args = p.parse_args(argv)
    counts = {f: fuzz(f, args.examples, args.seed, args.seconds) for f in args.family.split(",")}
    print("RESULT " + json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
