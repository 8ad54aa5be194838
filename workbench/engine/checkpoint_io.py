"""A checkpoint on disk: ``cp.save(path)`` and ``Checkpoint.load(path, sched)``, so a
batch saved in one process resumes in another with the same tokens (llama.cpp's slot
save / restore, for a whole batch).

The file is one ``.safetensors`` (:func:`file_of` appends the suffix): the batch caches'
arrays (free slots included) as mlx-lm's ``save_prompt_cache`` writes a prompt cache, and in
its metadata (key ``"workbench"``) one JSON document::

    {"format": "workbench-checkpoint", "version": 1,
     "identity": {"model": {...}, "tokenizer": {...}, "settings": {...}},
     "counters": {...}, "rng": {...}, "requests": [...], "queue": [uids],
     "batch": {"rows": [uids], "free": [...], "pending": {...}, ...}, "events": [...]}

Loading trusts nothing in the file (:mod:`workbench.engine.checkpoint_fields`) and never
changes the loading scheduler. What is not saved, what is refused and why:
``docs/lab/engine-notes.md``, "checkpoint_io.py".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import secrets
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import (
    load_prompt_cache,
    save_prompt_cache,
)

from .batch import Batch
from .checkpoint_fields import (
    CALLABLE_FIELDS,
    DOCUMENT_FIELDS,
    STATE_FIELDS,
    FieldReader,
    Loaded,
    fields_differ,
    is_int,
    need,
    short,
)
from .state import RequestState, Status

FORMAT, VERSION = "workbench-checkpoint", 1
SUFFIX = ".safetensors"
MAX_HEADER_BYTES = 100_000_000  # the safetensors reference reader's limit on the JSON header


def identity_of(
    sched: Any, parameters: Iterable[tuple[str, mx.array]] | None = None, adapters_digest: str | None = None
) -> dict:
    """What a checkpoint on disk records of the scheduler that saved it, and loading compares:
    the model (class, ``model.args``, a BLAKE2b digest of every weight), the tokenizer
    (vocabulary size, EOS ids), the settings, whether a prompt cache is on (``prompt_cache``:
    it changes the KV bytes each request projects) and the loaded adapters.

    A scheduler computes it once, at its first checkpoint save or load (``Scheduler._identity``),
    and keeps it: the digest is a pass over every weight's bytes, too slow to repeat at every save
    of a large model. So weights changed in place afterwards (``model.load_weights``,
    ``model.update``, an array's item assignment) are not seen by that scheduler, whose files then
    claim the old weights; after changing them, save and load with a new scheduler
    (``Scheduler(...)``, ``sched.fresh()`` or ``sched.fork()``: each computes it anew).
    mlx-lm: none.

    Args:
        parameters: ``(name, array)`` of every base weight
            (:func:`workbench.engine.levers.lora.base_parameters`; ``None``: the model's own).
        adapters_digest: :func:`workbench.engine.levers.lora.weights_digest`, ``None`` without.
    """
    model, tokenizer = sched.model, sched.tokenizer
    digest = hashlib.blake2b(digest_size=16)
    for name, p in tree_flatten(model.parameters()) if parameters is None else parameters:
        mx.eval(p)
        digest.update(f"{name}:{p.dtype}:{tuple(p.shape)}".encode())
        digest.update(memoryview(np.array(p if p.dtype == mx.uint8 else mx.view(p, mx.uint8))))
    args = getattr(model, "args", None)
    args = {k: _plain(v) for k, v in sorted(vars(args).items())} if args is not None else {}
    settings = {f.name: _plain(getattr(sched.config, f.name)) for f in dataclasses.fields(sched.config)}
    settings["adapters"] = sorted(sched.adapters.names) if sched.adapters else []
    # not a config field, but it changes the KV bytes each request projects
    settings["prompt_cache"] = sched.prompt_cache is not None
    return {
        "model": {
            "class": f"{type(model).__module__}.{type(model).__name__}",
            "args": args,
            "weights_blake2b": digest.hexdigest(),
            "adapters_blake2b": adapters_digest,
        },
        "tokenizer": {"vocab_size": int(sched.vocab_size), "eos_token_ids": sorted(tokenizer.eos_token_ids)},
        "settings": settings,
    }


def _plain(value: Any) -> Any:
    """``value`` as JSON data (tuples as lists, other objects as their ``repr``)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


def differences(saved: dict, here: dict, where: str = "") -> list[str]:
    """Where two :func:`identity_of` documents differ: ``"settings.max_batch: 4 saved, 2
    here"`` per differing leaf (dicts walked)."""
    out = []
    for key in sorted(set(saved) | set(here), key=str):
        a, b, name = saved.get(key), here.get(key), f"{where}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, name + ".")
        elif a != b:
            out.append(f"{name}: {short(a)} saved, {short(b)} here")
    return out


def file_of(path: str | Path) -> Path:
    """The file a checkpoint at ``path`` lives in (``.safetensors`` appended where missing, ``~``
    expanded): ``file_of("run1/batch") == Path("run1/batch.safetensors")``.

    Raises:
        ValueError: a ``path`` that names no file: empty, ending in a path separator
            (``"newdir/"``: a folder), or whose last part is ``.`` or ``..``.
    """
    text = os.fspath(path)
    name = Path(text).expanduser().name
    if not text or text.endswith(tuple(filter(None, (os.sep, os.altsep)))) or name in ("", ".", ".."):
        raise ValueError(
            f"checkpoint path {text!r} names no file (empty, a folder ending in a separator, '.' or '..'); "
            f"give a file name, e.g. {os.path.join(text or '.', 'checkpoint' + SUFFIX)!r}"
        )
    path = Path(text).expanduser()
    return path if path.name.endswith(SUFFIX) else path.with_name(path.name + SUFFIX)


# -- saving ---------------------------------------------------------------------------
def save(checkpoint: Any, path: str | Path) -> Path:
    """Write ``checkpoint`` to :func:`file_of` ``(path)`` atomically (temporary file, rename);
    returns the path written.

    Raises:
        ValueError: a running request's callable field (naming uid and field), a quantized KV
            cache, the packed layout, no identity, or a ``path`` that is or is under no file.
        PermissionError: ``path``'s folder takes no new file (read-only, or ``/proc``), naming ``path``.
    """
    if checkpoint.identity is None:
        raise ValueError("this checkpoint does not know its scheduler (take it with Scheduler.checkpoint())")
    target = file_of(path)
    for p in dict.fromkeys((Path(os.fspath(path)).expanduser(), target)):
        if p.is_dir():
            raise ValueError(
                f"Checkpoint.save: {p} is a folder; give a file name, e.g. {p / ('checkpoint' + SUFFIX)}"
            )
    for parent in target.parents:  # the nearest that exists must be a folder to write into
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"Checkpoint.save: cannot write {target}: {parent} is a file, not a folder")
            break
    identity = checkpoint.identity()
    if identity["settings"].get("kv_bits") is not None:
        raise ValueError(
            f"Checkpoint.save: a quantized KV cache (kv_bits={identity['settings']['kv_bits']}) cannot "
            "be saved (mlx-lm's load_prompt_cache does not know its class)"
        )
    if identity["settings"].get("layout") == "packed":
        raise ValueError(
            "Checkpoint.save: layout='packed' keeps its KV in pages, which the file format does not hold yet; "
            "its checkpoints restore in memory (Scheduler.restore(cp)), or save from layout='padded'"
        )
    document = _document(checkpoint, identity)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(
        f".{secrets.token_hex(6)}.partial{SUFFIX}"
    )  # short: any legal target name fits
    try:
        _write(temporary, target, checkpoint.state.batch.caches or [], document)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    return target


def _write(temporary: Path, target: Path, caches: list, document: dict) -> None:
    """mlx-lm's ``save_prompt_cache`` of ``caches`` and ``document`` into ``temporary``.

    Raises:
        PermissionError: the folder takes no new file, naming ``target`` (MLX names only its
            temporary file: ``Failed to open file ...``)."""
    try:
        save_prompt_cache(str(temporary), caches, {"workbench": json.dumps(document)})
    except RuntimeError as exc:
        if "Failed to open" not in str(exc):
            raise
        raise PermissionError(
            f"Checkpoint.save: cannot write {target}: its folder {target.parent} does not take a new file ({exc})"
        ) from None


def _document(checkpoint: Any, identity: dict) -> dict:
    """The checkpoint's JSON document (see the module docstring)."""
    st = checkpoint.state
    live = {s.uid for s in st.live}
    document = {
        "format": FORMAT,
        "version": VERSION,
        "identity": identity,
        "counters": {"step_index": st.step_index, "next_uid": st.next_uid, "joins": st.joins},
        "rng": st.rng.bit_generator.state,
        "requests": [_request_record(s, s.uid in live) for s in st.requests.values()],
        "queue": sorted(
            s.uid for s in st.queue + (st.prefilling.states if st.prefilling else []) if not s.finished
        ),
        "batch": _batch_record(st.batch),
        "events": [dataclasses.asdict(e) for e in checkpoint.recorder.events[: checkpoint.n_events]],
    }
    prefilling = {s.uid for s in st.prefilling.states} if st.prefilling else set()
    for record in document["requests"]:
        if record["uid"] in prefilling:  # saved as queued: it prefills again after loading
            record["status"] = (
                (Status.PREEMPTED if record["tokens"] else Status.QUEUED).value
                if record["status"] != Status.FINISHED.value
                else record["status"]
            )
            record["evicted"] = record["evicted"] or record["status"] == Status.FINISHED.value
    return document


def _request_record(s: RequestState, live: bool) -> dict:
    """One request state as JSON data (its request's fields without callables; ``not_restored``
    names those it had)."""
    r = s.valid.request
    for name in CALLABLE_FIELDS:
        if live and getattr(r, name):
            raise ValueError(
                f"Checkpoint.save: uid {s.uid} is {s.status.value} and has {name} (a callable), "
                "which cannot be saved; save once it finished, or submit it without"
            )
    if live and getattr(r, "constrained", False):
        raise ValueError(
            f"Checkpoint.save: uid {s.uid} is {s.status.value} and has a structured-output constraint "
            "(json_schema / regex / choices), whose grammar state is not saved; save once it finished"
        )
    fields = {
        f.name: _plain(getattr(r, f.name)) for f in dataclasses.fields(r) if f.name not in CALLABLE_FIELDS
    }
    fields["logit_bias"] = (
        None if r.logit_bias is None else [[int(t), float(b)] for t, b in r.logit_bias.items()]
    )
    record = {name: _plain(getattr(s, name)) for name in STATE_FIELDS}
    record.update(
        request=fields,
        prompt_ids=list(s.valid.prompt_ids),
        status=s.status.value,
        top_logprobs=[[list(p) for p in pairs] for pairs in s.top_logprobs],
        # a finished row's callables are not saved: the file says which it had (and a loaded row lost)
        not_restored=[n for n in CALLABLE_FIELDS if n in s.not_restored or getattr(r, n)],
    )
    return record


def _batch_record(batch: Batch) -> dict:
    """The batch's rows, free slots and pending next tokens (evaluated) as JSON data."""
    record = {
        "rows": [r.uid for r in batch.rows],
        "free": list(batch.free),
        "reuse_slots": batch.reuse_slots,
        "fast_path": batch.fast_path,
        "has_caches": batch.caches is not None,
        "pending": None,
    }
    pending = batch.pending
    if pending is not None:
        tokens, logprobs, finite = pending.read()
        record["pending"] = {
            "tokens": tokens,
            "logprobs": logprobs,
            "finite": finite,
            "errors": {str(b): m for b, m in pending.errors.items()},
            "top": {str(b): [list(p) for p in pairs] for b, pairs in pending.read_top().items()},
        }
    return record


# -- loading --------------------------------------------------------------------------
def read(path: str | Path, sched: Any) -> Loaded:
    """Read and check a checkpoint written by :func:`save` for ``sched`` (one probe forward;
    ``sched`` unchanged).

    Raises:
        FileNotFoundError: no file at :func:`file_of` ``(path)``.
        ValueError: a folder (``path``, where no checkpoint file is beside it, or its
            ``.safetensors`` name), said as :func:`save` says it; a damaged or foreign file, another
            version, a differing model / tokenizer / setting (each named), or a field out of range
            (``checkpoint field <where>: <what>``).
    """
    given, path = Path(os.fspath(path)).expanduser(), file_of(path)
    for p in dict.fromkeys((given, path)):
        if p.is_dir() and not path.is_file():
            raise ValueError(
                f"Checkpoint.load: {p} is a folder; give a file name, e.g. {p / ('checkpoint' + SUFFIX)}"
            )
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    _check_safetensors(path)
    try:
        caches, metadata = load_prompt_cache(str(path), return_metadata=True)
        document = json.loads(metadata.get("workbench", "null") or "null")
    except Exception as exc:  # a damaged file can fail anywhere in mlx-lm's loader or json  # noqa: BLE001
        raise ValueError(
            f"{path} is not a workbench checkpoint (mlx-lm's load_prompt_cache: {type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"{path} is not a workbench checkpoint (no '{FORMAT}' metadata)")
    if document.get("version") != VERSION:
        raise ValueError(
            f"{path} is format version {short(document.get('version'))}; this workbench reads version {VERSION}"
        )
    need(set(document) == DOCUMENT_FIELDS, "(document)", f"fields {fields_differ(document, DOCUMENT_FIELDS)}")
    need(isinstance(document["identity"], dict), "identity", "not an object")
    differ = differences(document["identity"], _identity_here(document["identity"], sched))
    if differ:
        raise ValueError(
            f"checkpoint {path} was saved by a scheduler unlike this one: "
            + "; ".join(differ)
            + ". Load it into a scheduler with the same model, tokenizer and settings."
        )
    settings = document["identity"]["settings"]
    if settings.get("layout") == "packed" or settings.get("kv_bits") is not None:
        raise ValueError(
            f"checkpoint {path}: a scheduler with layout='packed' or kv_bits does not load checkpoint "
            "files (Checkpoint.save refuses them); its checkpoints restore in memory"
        )
    return FieldReader(sched).read(document, caches)


def _identity_here(saved: dict, sched: Any) -> dict:
    """``sched``'s identity to compare with a file's ``saved`` one: without
    ``settings.prompt_cache`` where the file records none (saved before it was recorded; a
    differing prompt cache is then refused by the requests' ``projected_bytes``)."""
    here = sched._identity()
    if isinstance(saved.get("settings"), dict) and "prompt_cache" not in saved["settings"]:
        here = {**here, "settings": {k: v for k, v in here["settings"].items() if k != "prompt_cache"}}
    return here


def _check_safetensors(path: Path) -> None:
    """Refuse a file whose safetensors header does not describe its bytes, before MLX reads it."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < n <= min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{path} is not a workbench checkpoint (no safetensors header: {size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError):
            header = None
    if not isinstance(header, dict):
        raise ValueError(
            f"{path} is not a workbench checkpoint (its safetensors header is not a JSON object)"
        )
    data = size - 8 - n
    widths = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8, "BOOL": 1}
    widths.update({"I8": 1, "U8": 1, "I16": 2, "U16": 2, "F64": 8})
    for name, entry in header.items():
        if name == "__metadata__":
            ok = isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())
        else:
            ok = (
                isinstance(entry, dict)
                and entry.get("dtype") in widths
                and isinstance(entry.get("shape"), list)
                and all(is_int(d) and d >= 0 for d in entry["shape"])
                and isinstance(entry.get("data_offsets"), list)
                and len(entry["data_offsets"]) == 2
                and all(is_int(o) for o in entry["data_offsets"])
                and 0 <= entry["data_offsets"][0] <= entry["data_offsets"][1] <= data
                and entry["data_offsets"][1] - entry["data_offsets"][0]
                == math.prod(entry["shape"]) * widths[entry["dtype"]]
            )
        if not ok:
            raise ValueError(
                f"{path} is not a workbench checkpoint (safetensors entry {name!r}: {short(entry)})"
            )
    spans = sorted(tuple(e["data_offsets"]) for k, e in header.items() if k != "__metadata__")
    ends = [0] + [end for _, end in spans]
    if any(start != ends[i] for i, (start, _) in enumerate(spans)) or ends[-1] != data:
        raise ValueError(
            f"{path} is not a workbench checkpoint (its safetensors arrays do not cover its {data} data bytes "
            "exactly, without gaps or overlaps)"
        )
