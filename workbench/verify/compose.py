"""Which engine features compose: every pair of twelve, built and run against each row alone.

Knows: the twelve features of issue 38 as Scheduler settings (:data:`FEATURES`), a mixed
workload (greedy, seeded, stop-string, top-k, JSON-schema and ``submit_n`` rows), the "same
request alone in the same settings" oracle. Must not know: why the engine refuses a pair
(the refusal is the engine's own message, read from the ``ValueError`` of its construction).

For each pair (:func:`check_pair`): build the Scheduler with both features; a refusal at
construction is recorded with its message; else the workload runs in one batch and every row
is compared with the same request run alone on a fresh Scheduler of the same settings
(tokens, log-probs, top-k log-probs, finish reason: bit-equal on the CPU, log-probs within
:data:`GPU_LOGPROB_ATOL` on a GPU). A row its pair refuses at ``submit`` (a ``ValueError``
naming its field) must be refused alone too. ``workbench compose --out docs`` writes
``docs/compose.md`` (:func:`compose_markdown`)::

    pair                        result
    packed × pacing             runs, 7 rows equal alone
    packed × no_reuse_slots     refused: reuse_slots=False has no effect with layout='packed': ...
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..engine.request import Request
from ..engine.scheduler import Scheduler
from .invariance import run_alone

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = {"prose": str(ROOT / "data/adapters/prose"), "numbers": str(ROOT / "data/adapters/numbers")}
GPU_LOGPROB_ATOL = 1e-4  # nats: a [B, ...] and a [1, ...] forward's kernels differ in the last bits on a GPU
MAX_BATCH = 4

# name -> (what it is, the Scheduler keywords that turn it on)
FEATURES: dict[str, tuple[str, dict[str, Any]]] = {
    "packed": ("packed layout", dict(layout="packed")),
    "batch_invariant": ("batch-invariant mode", dict(batch_invariant=True)),
    "speculative": ("speculative decoding (prompt lookup)", dict(speculative="prompt-lookup")),
    "kv_bits": ("8-bit KV cache", dict(kv_bits=8, kv_group_size=32)),
    "pacing": ("pacing (default time budget)", dict(pacing=True)),
    "kv_budget": ("a KV budget of about two requests (preemption)", dict(kv_budget_bytes="2 requests")),
    "no_reuse_slots": ("reuse_slots=False", dict(reuse_slots=False)),
    "no_pipeline": ("pipeline=False", dict(pipeline=False)),
    "small_chunks": ("prefill chunks of 4 tokens", dict(prefill_step_size=4)),
    "prompt_cache": ("the prompt cache", dict(prompt_cache=8)),
    "adapters": ("LoRA adapters, one per row", dict(adapters=ADAPTERS)),
    "policy": ("the priority policy", dict(policy="priority")),
}

# name -> the words a refusal of it must name (its setting)
NAMED_BY = {
    "packed": "layout='packed'",
    "batch_invariant": "batch_invariant",
    "speculative": "speculative",
    "kv_bits": "kv_bits",
    "pacing": "pacing",
    "kv_budget": "kv_budget_bytes",
    "no_reuse_slots": "reuse_slots",
    "no_pipeline": "pipeline",
    "small_chunks": "prefill_step_size",
    "prompt_cache": "prompt_cache",
    "adapters": "adapters",
    "policy": "policy",
}

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def workload(adapters: bool) -> list[tuple[str, Request, int]]:
    """The mixed rows: ``(kind, request, n)`` (``n > 1``: ``submit_n``); the last repeats the
    first's prompt (admitted after it finished: a prompt-cache hit where there is one); with
    ``adapters`` the rows select an adapter in turn (``None``, prose, numbers)."""
    names = [None, "prose", "numbers"] if adapters else [None]
    rows = [
        ("greedy", dict(prompt="def add(a, b):", max_tokens=10, top_logprobs=2)),
        ("seeded", dict(prompt="import os\n", max_tokens=9, temperature=0.8, seed=7)),
        ("stop-string", dict(prompt="for i in range(10):", max_tokens=12, stop="\n")),
        ("top-k", dict(prompt="class Stack:", max_tokens=8, temperature=1.0, top_k=5, seed=3, priority=2)),
        ("json-schema", dict(prompt="data = ", max_tokens=12, json_schema=SCHEMA)),
        ("submit_n", dict(prompt="def fib(n):", max_tokens=7, temperature=0.9, seed=11, priority=1)),
        ("repeat", dict(prompt="def add(a, b):", max_tokens=10, top_logprobs=2)),  # a prompt-cache hit
    ]
    return [
        (kind, Request(adapter=names[i % len(names)], **fields), 2 if kind == "submit_n" else 1)
        for i, (kind, fields) in enumerate(rows)
    ]


@dataclass
class PairResult:
    """One pair's outcome: ``refused`` (the construction's message), else the rows run
    (``equal`` of ``rows``), the rows refused at submit (by kind, with the message) and the
    wrong rows (kind: why)."""

    pair: tuple[str, str]
    refused: str = ""
    rows: int = 0
    equal: int = 0
    submit_refused: dict[str, str] = field(default_factory=dict)
    wrong: dict[str, str] = field(default_factory=dict)

    @property
    def result(self) -> str:
        """``"refused"``, ``"wrong"`` or ``"runs"``."""
        return "refused" if self.refused else "wrong" if self.wrong or self.equal < self.rows else "runs"


def settings_of(names: Iterable[str]) -> dict[str, Any]:
    """The Scheduler keywords of the features ``names`` (merged; ``max_batch`` 4, no history)."""
    out: dict[str, Any] = dict(max_batch=MAX_BATCH, history_size=0)
    for name in names:
        out.update(FEATURES[name][1])
    return out


def _record(sched: Scheduler, uid: int) -> tuple:
    view = sched.request(uid)
    return tuple(view.tokens), tuple(view.logprobs), tuple(view.top_logprobs), view.finish_reason


def _close(a: float, b: float) -> bool:
    return a == b or (mx.default_device() != mx.cpu and abs(a - b) <= GPU_LOGPROB_ATOL)


def difference(ours: tuple, alone: tuple) -> str:
    """Why a row's record differs from its run alone (``""``: equal)."""
    (t, lp, top, reason), (t2, lp2, top2, reason2) = ours, alone
    if list(t) != list(t2):
        return f"tokens {list(t)} alone {list(t2)}"
    if reason != reason2:
        return f"finish {reason!r} alone {reason2!r}"
    if len(lp) != len(lp2) or not all(_close(a, b) for a, b in zip(lp, lp2)):
        return "log-probs differ"
    same = len(top) == len(top2) and all(
        len(x) == len(y) and all(int(p[0]) == int(q[0]) and _close(p[1], q[1]) for p, q in zip(x, y))
        for x, y in zip(top, top2)
    )
    return "" if same else "top-k log-probs differ"


def _build(model: Any, tokenizer: Any, settings: dict[str, Any]) -> Scheduler:
    """The Scheduler of ``settings``; a ``kv_budget_bytes`` of ``"2 requests"`` becomes
    twice the bytes the largest workload request holds alone in these settings."""
    if settings.get("kv_budget_bytes") == "2 requests":
        probe = Scheduler(model, tokenizer, **{**settings, "kv_budget_bytes": None})
        unit = probe.ledger.alone_bytes(len(tokenizer.encode("for i in range(10):")) + 8, 12)
        settings = {**settings, "kv_budget_bytes": 2 * unit}
    return Scheduler(model, tokenizer, **settings)


def refusal(model: Any, tokenizer: Any, names: Sequence[str]) -> str:
    """The engine's refusal of the features ``names`` at construction (``""``: it builds)."""
    try:
        _build(model, tokenizer, settings_of(names))
    except ValueError as refused:
        return str(refused)
    return ""


def refused_in(markdown: str) -> set[frozenset]:
    """The pairs a :func:`compose_markdown` table lists as refused (its ``## Refusals``)."""
    out = set()
    for line in markdown.split("## Refusals", 1)[-1].splitlines():
        if line.startswith("- **R"):
            for pair in line.split("(", 1)[1].split(")", 1)[0].split(", "):
                out.add(frozenset(pair.split(" × ")))
    return out


def check_pair(model: Any, tokenizer: Any, names: Sequence[str]) -> PairResult:
    """Build the Scheduler with the features ``names`` (one, two or more), run the workload in
    one batch and compare every row with the same request alone (see the module docstring)."""
    result = PairResult(tuple(names))  # type: ignore[arg-type]
    settings = settings_of(names)
    try:
        sched = _build(model, tokenizer, settings)
    except ValueError as refusal:
        result.refused = str(refusal)
        return result
    rows: list[tuple[str, int]] = []
    for kind, request, n in workload("adapters" in names):
        try:
            uids = sched.submit_n(request, n) if n > 1 else [sched.submit(request)]
        except ValueError as refusal:
            result.submit_refused[kind] = str(refusal)
            continue
        rows += [(kind, uid) for uid in uids]
    sched.run()
    for kind, uid in rows:
        # The same settings (max_batch and speculation too: docs/compose.md's "alone in the same
        # settings"; outside the mode speculation need not keep a row's bits), the seed the row drew.
        # That speculation changes no bit in the mode is bit_check's (its run alone does not speculate).
        alone, solo = run_alone(sched, uid)
        why = difference(_record(sched, uid), _record(alone, solo))
        result.rows += 1
        if why:
            result.wrong[f"{kind} (uid {uid})"] = why
        else:
            result.equal += 1
    for kind, message in result.submit_refused.items():  # refused in the batch: refused alone too
        request = next(r for k, r, _ in workload("adapters" in names) if k == kind)
        try:
            _build(model, tokenizer, settings).submit(request)
        except ValueError:
            continue
        result.wrong[kind] = f"refused at submit in the batch ({message}), accepted alone"
    return result


def all_pairs(names: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """Every pair of :data:`FEATURES` (66 of twelve), in table order."""
    return list(itertools.combinations(names or list(FEATURES), 2))


def check_pairs(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[tuple[str, str]] | None = None,
    progress: Callable[[tuple[str, str]], None] | None = None,
) -> list[PairResult]:
    """:func:`check_pair` over ``pairs`` (default :func:`all_pairs`)."""
    out = []
    for pair in pairs or all_pairs():
        if progress is not None:
            progress(pair)
        out.append(check_pair(model, tokenizer, pair))
    return out


def short_reason(message: str) -> str:
    """A refusal's reason for the table's list: the message up to its first ``;``, without
    the markdown table's ``|``."""
    return message.split(";")[0].replace("|", "/").replace("\n", " ")


def counts(results: Sequence[PairResult]) -> dict[str, int]:
    """How many pairs run (every row equal alone), are refused, or give a wrong row."""
    out = {"runs": 0, "refused": 0, "wrong": 0}
    for r in results:
        out[r.result] += 1
    return out


def _setting_text(kw: dict[str, Any]) -> str:
    shown = {"adapters": "{prose, numbers}", "kv_budget_bytes": "2 x (bytes the largest row holds alone)"}
    return ", ".join(f"{k}={shown.get(k, repr(v))}" for k, v in kw.items())


def compose_markdown(results: Sequence[PairResult], where: str) -> str:
    """``docs/compose.md``: the 12 × 12 table (✓ runs with every row equal alone, R<i> a
    refusal whose reason is listed below, ✗ a wrong row), the refusals and wrong rows, the
    counts, and ``where`` it ran."""
    names = list(FEATURES)
    cell: dict[frozenset, str] = {}
    notes: list[str] = []
    reasons: dict[str, str] = {}
    for r in results:
        key = frozenset(r.pair)
        if r.result == "runs":
            cell[key] = "✓"
        elif r.result == "refused":
            reason = short_reason(r.refused)
            tag = reasons.setdefault(reason, f"R{len(reasons) + 1}")
            cell[key] = tag
        else:
            cell[key] = "✗"
            notes.append(
                f"- ✗ {r.pair[0]} × {r.pair[1]}: " + "; ".join(f"{k}: {v}" for k, v in r.wrong.items())
            )
    n = counts(results)
    lines = [
        "# Which features compose",
        "",
        "Written by `workbench compose --out docs` (`workbench/verify/compose.py`) from the engine's",
        "own checks: for each pair of the twelve features below, the Scheduler is built with both;",
        "a refusal at construction is its `ValueError` (R*n*, listed below); else a mixed workload",
        "(greedy with top-2 log-probs, seeded, stop-string, top-k, JSON-schema, `submit_n` of 2, the",
        "greedy prompt again, admitted after it finished; with adapters the rows select none, `prose`",
        "or `numbers` in turn) runs in one batch of 4",
        "and every row is compared with the same request alone in the same settings (tokens,",
        "log-probs, top-k log-probs, finish reason). ✓: runs, every row equal alone; ✗: a wrong row.",
        f"Ran on {where}.",
        "",
        f"**{len(results)} pairs: {n['runs']} run with every row equal alone, {n['refused']} refused "
        f"at construction, {n['wrong']} with a wrong row.**",
        "",
        "| feature | setting |",
        "| --- | --- |",
        *[
            f"| `{name}` | {what}: `"
            + ", ".join(
                f"{k}={v!r}" if k != "adapters" else "adapters={prose, numbers}" for k, v in kw.items()
            )
            + "` |"
            for name, (what, kw) in FEATURES.items()
        ],
        "",
        "| | " + " | ".join(f"`{n}`" for n in names) + " |",
        "| --- |" + " :-: |" * len(names),
    ]
    for a in names:
        row = [("·" if a == b else cell.get(frozenset((a, b)), " ")) for b in names]
        lines.append(f"| `{a}` | " + " | ".join(row) + " |")
    lines += ["", "## Refusals", ""]
    for reason, tag in reasons.items():
        pairs = [" × ".join(r.pair) for r in results if r.refused and short_reason(r.refused) == reason]
        lines.append(f"- **{tag}** ({', '.join(pairs)}): {reason}")
    skipped = [
        f"- {' × '.join(r.pair)}: {kind} refused at submit (alone too): {short_reason(m)}"
        for r in results
        for kind, m in r.submit_refused.items()
    ]
    if skipped:
        lines += ["", "## Rows a pair refuses at submit (and alone)", "", *skipped]
    if notes:
        lines += ["", "## Wrong rows", "", *notes]
    return "\n".join(lines) + "\n"
