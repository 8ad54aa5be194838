"""Goldens: reference trajectories written from mlx-lm by a command, read by tests.

Knows: the golden scenarios (requests), the oracle, the JSON format. Must not know: the
scheduler. A golden file records the mlx and mlx-lm versions, the model folder, each
request (prompt ids, max_tokens, stop ids) and mlx-lm's solo tokens and per-token
logprobs, plus mlx-lm ``BatchGenerator`` tokens for the same requests.

Write with ``workbench goldens`` (see ``workbench goldens --help``).
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

from ..workloads.workload import prompt_of_length
from .oracle import RefRequest, batch_reference, solo_reference

GOLDEN_PROMPT_TOKENS = (1, 5, 17, 40, 3, 96)
GOLDEN_MAX_TOKENS = (12, 20, 16, 24, 10, 18)
GOLDEN_MAX_BATCH = 4


def golden_requests(tokenizer: Any) -> list[RefRequest]:
    """The golden scenario: six greedy requests with prompts of 1..96 tokens."""
    return [
        RefRequest(tuple(prompt_of_length(tokenizer, n, start=53 * i)), m, frozenset(tokenizer.eos_token_ids))
        for i, (n, m) in enumerate(zip(GOLDEN_PROMPT_TOKENS, GOLDEN_MAX_TOKENS))
    ]


def make_goldens(model: Any, tokenizer: Any, model_name: str) -> dict:
    """Run the golden requests through mlx-lm (solo and batch) and return the JSON dict."""
    reqs = golden_requests(tokenizer)
    batch = batch_reference(model, reqs, GOLDEN_MAX_BATCH)
    rows = []
    for r, b in zip(reqs, batch):
        solo = solo_reference(model, r)
        rows.append(
            {
                "prompt_ids": list(r.prompt_ids),
                "max_tokens": r.max_tokens,
                "stop_ids": sorted(r.stop_ids),
                "solo_tokens": solo.tokens,
                "solo_logprobs": [round(x, 6) for x in solo.logprobs],
                "solo_top2_margins": [round(x, 6) for x in solo.margins],
                "batch_tokens": b.tokens,
            }
        )
    return {
        "model": model_name,
        "mlx_version": version("mlx"),
        "mlx_lm_version": version("mlx-lm"),
        "max_batch": GOLDEN_MAX_BATCH,
        "requests": rows,
    }


def write_goldens(golden: dict, path: Path) -> None:
    """Write ``golden`` as JSON with one field per line (each list on its own line), so
    a change shows in a diff as the fields that changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {k: v for k, v in golden.items() if k != "requests"}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()] + [' "requests": [']
    for i, req in enumerate(golden["requests"]):
        fields = [f"   {json.dumps(k)}: {json.dumps(v)}" for k, v in req.items()]
        lines += ["  {", ",\n".join(fields), "  }" + ("," if i < len(golden["requests"]) - 1 else "")]
    lines += [" ]", "}"]
    path.write_text("\n".join(lines) + "\n")


def read_goldens(path: Path) -> dict:
    """Read a golden file written by :func:`write_goldens`."""
    return json.loads(Path(path).read_text())
