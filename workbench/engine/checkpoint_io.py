"""A checkpoint on disk: ``cp.save(path)`` and ``Checkpoint.load(path, sched)``, so a
batch saved in one process resumes in another with the same tokens (llama.cpp's slot
save / restore, for a whole batch).

Knows: a :class:`~workbench.engine.checkpoint.Checkpoint`'s parts (request states, queue,
batch with its pending next tokens, events, counters, the seed generator) and mlx-lm's
``save_prompt_cache`` / ``load_prompt_cache`` (``mlx_lm.models.cache``: every layer's
``state`` into one ``.safetensors`` file through ``mx.save_safetensors``, classes rebuilt by
``from_state``). Must not know: the scheduler's loop, admission, views.

The file is one ``.safetensors``: the batch caches' arrays (free slots included) as mlx-lm
writes a prompt cache, and in its metadata (key ``"workbench"``) one JSON document::

    {"format": "workbench-checkpoint", "version": 1,
     "identity": {"model": {...}, "tokenizer": {...}, "settings": {...}},
     "counters": {...}, "rng": {...}, "requests": [...], "queue": [uids],
     "batch": {"rows": [uids], "free": [...], "pending": {...}, ...}, "events": [...]}

What is not saved: the prompt cache's entries (the loading scheduler keeps its own), the
snapshot history and the checkpoints kept with it, and a prefilling group's partial
prefill: its members are saved as queued and prefill again after loading (their tokens
are the same; the events then show a second ``admit``). A request with a callable
(``logits_processors``, ``sampler``, ``on_token``) cannot be saved while it runs (refused,
naming the uid and the field), nor one with a structured-output constraint (its grammar
state is not saved); a finished one is saved without them. A quantized KV cache
(``kv_bits``) is refused: mlx-lm's loader does not know its class; so is the packed layout's
(its pages are not in the file format yet: its checkpoints restore in memory).

Loading refuses (``ValueError`` naming what differs) a file of another format or version,
or one saved by a scheduler whose model (class, config, a digest of every weight's bytes),
tokenizer (vocabulary size, EOS ids) or settings (every :class:`SchedulerConfig` field,
the loaded adapters) differ from the loading scheduler's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

from ..observe.events import Event
from ..observe.recorder import Recorder
from .batch import Batch
from .checkpoint import Checkpoint, EngineState
from .decode import Pending
from .kv.cache_internals import complete_loaded_cache
from .request import Request, validate
from .sampling import RowSampler
from .state import RequestState, Status

FORMAT, VERSION = "workbench-checkpoint", 1
CALLABLE_FIELDS = ("logits_processors", "sampler", "on_token")
_STATE_FIELDS = (
    "uid",
    "seed",
    "projected_bytes",
    "submitted_s",
    "finish_reason",
    "message",
    "tokens",
    "logprobs",
    "fed",
    "cached_tokens",
    "join_order",
    "evicted",
    "sample_group",
)


def identity_of(sched: Any) -> dict:
    """What a checkpoint on disk records of the scheduler that saved it, and loading
    compares: the model (class, ``model.args``, a BLAKE2b digest of every parameter's
    bytes), the tokenizer (vocabulary size, EOS ids), the settings (every
    ``SchedulerConfig`` field, ``repr`` where not JSON) and the loaded adapters' names."""
    model, tokenizer = sched.model, sched.tokenizer
    digest = hashlib.blake2b(digest_size=16)
    for name, p in tree_flatten(model.parameters()):
        mx.eval(p)
        digest.update(f"{name}:{p.dtype}:{tuple(p.shape)}".encode())
        digest.update(memoryview(np.array(p if p.dtype == mx.uint8 else mx.view(p, mx.uint8))))
    args = getattr(model, "args", None)
    args = {k: _plain(v) for k, v in sorted(vars(args).items())} if args is not None else {}
    settings = {f.name: _plain(getattr(sched.config, f.name)) for f in dataclasses.fields(sched.config)}
    settings["adapters"] = sorted(sched.adapters.names) if sched.adapters else []
    return {
        "model": {
            "class": f"{type(model).__module__}.{type(model).__name__}",
            "args": args,
            "weights_blake2b": digest.hexdigest(),
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
    for key in sorted(set(saved) | set(here)):
        a, b, name = saved.get(key), here.get(key), f"{where}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, name + ".")
        elif a != b:
            out.append(f"{name}: {_short(a)} saved, {_short(b)} here")
    return out


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- saving ---------------------------------------------------------------------------
def save(checkpoint: Checkpoint, path: str | Path) -> Path:
    """Write ``checkpoint`` to ``path`` (a ``.safetensors`` file; parent folders created).
    Returns the path.

    Raises:
        ValueError: a running request with a callable field (naming the uid and the
            field), a quantized KV cache, the packed layout, or a checkpoint without its
            scheduler's identity.
    """
    if checkpoint.identity is None:
        raise ValueError("this checkpoint does not know its scheduler (take it with Scheduler.checkpoint())")
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_prompt_cache(str(path), st.batch.caches or [], {"workbench": json.dumps(document)})
    return path


def _request_record(s: RequestState, live: bool) -> dict:
    """One request state as JSON data (its request's fields without callables)."""
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
    record = {name: _plain(getattr(s, name)) for name in _STATE_FIELDS}
    record.update(
        request=fields,
        prompt_ids=list(s.valid.prompt_ids),
        status=s.status.value,
        top_logprobs=[[list(p) for p in pairs] for pairs in s.top_logprobs],
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
def load(path: str | Path, sched: Any) -> Checkpoint:
    """Read a checkpoint written by :func:`save` for ``sched`` (give it to
    ``sched.restore``). The scheduler is not changed.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not a workbench checkpoint, another format version, or a model,
            tokenizer or setting that differs from ``sched``'s (each difference named), or
            a prompt that tokenizes differently here.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        caches, metadata = load_prompt_cache(str(path), return_metadata=True)
        document = json.loads(metadata.get("workbench", "null") or "null")
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError) as exc:
        raise ValueError(
            f"{path} is not a workbench checkpoint (mlx-lm's load_prompt_cache: {exc})"
        ) from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"{path} is not a workbench checkpoint (no '{FORMAT}' metadata)")
    if document.get("version") != VERSION:
        raise ValueError(
            f"{path} is format version {document.get('version')}; this workbench reads version {VERSION}"
        )
    differ = differences(document["identity"], sched._identity())
    if differ:
        raise ValueError(
            f"checkpoint {path} was saved by a scheduler unlike this one: "
            + "; ".join(differ)
            + ". Load it into a scheduler with the same model, tokenizer and settings."
        )
    requests = {r["uid"]: _request_state(r, sched) for r in document["requests"]}
    for c in caches:
        complete_loaded_cache(c)
    state = EngineState(
        _batch_of(document["batch"], caches, requests),
        np.random.default_rng(),
        prompt_cache=sched.state.prompt_cache,
        requests=requests,
        queue=[requests[u] for u in document["queue"]],
        **document["counters"],
    )
    state.rng.bit_generator.state = document["rng"]
    recorder = Recorder(sched.clock, sched.config.history_size)
    recorder.events = [_event(e) for e in document["events"]]
    return Checkpoint(
        sched.id, id(sched.model), state.step_index, len(recorder.events), state, recorder, sched._identity
    )


def _request_state(record: dict, sched: Any) -> RequestState:
    """A request state from its JSON record, validated again by ``sched``'s tokenizer."""
    fields = dict(record["request"])
    if fields["logit_bias"] is not None:
        fields["logit_bias"] = {int(t): b for t, b in fields["logit_bias"]}
    request = Request(**fields)
    valid = validate(request, sched.tokenizer, sched.vocab_size, sched.context_tokens, sched.context_field)
    if list(valid.prompt_ids) != record["prompt_ids"]:
        raise ValueError(f"uid {record['uid']}'s prompt tokenizes differently here than where it was saved")
    state = RequestState(
        record["uid"],
        valid,
        record["seed"],
        RowSampler(request, record["seed"], sched.vocab_size),
        record["projected_bytes"],
        record["submitted_s"],
        Status(record["status"]),
    )
    for name in _STATE_FIELDS[4:]:
        setattr(state, name, record[name])
    state.top_logprobs = [tuple(tuple(p) for p in pairs) for pairs in record["top_logprobs"]]
    return state


def _batch_of(record: dict, caches: list[Any], requests: dict[int, RequestState]) -> Batch:
    """The batch of a JSON record, its caches those loaded by mlx-lm."""
    batch = Batch(record["reuse_slots"])
    batch.rows = [requests[u] for u in record["rows"]]
    batch.caches = caches if record["has_caches"] else None
    batch.free, batch.fast_path = list(record["free"]), record["fast_path"]
    p = record["pending"]
    if p is not None:
        top = {
            int(b): (
                mx.array([t for t, _ in pairs], dtype=mx.int32),
                mx.array([v for _, v in pairs], dtype=mx.float32),
            )
            for b, pairs in p["top"].items()
        }
        batch.pending = Pending(
            mx.array(p["tokens"], dtype=mx.uint32),
            mx.array(p["logprobs"], dtype=mx.float32),
            mx.array(p["finite"], dtype=mx.bool_),
            {int(b): m for b, m in p["errors"].items()},
            top,
        )
    return batch


def _event(record: dict) -> Event:
    """An event from its JSON record (``top_logprobs`` back to tuples)."""
    record = dict(record, top_logprobs=tuple(tuple(p) for p in record.get("top_logprobs", ())))
    if record["logprob"] is None or (isinstance(record["logprob"], float) and math.isnan(record["logprob"])):
        record["logprob"] = float("nan")
    return Event(**record)
