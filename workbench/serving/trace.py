"""The Azure 2023 trace as a load client's trace file (AIPerf's ``mooncake_trace``).

Knows: AIPerf's ``mooncake_trace`` JSONL (one request a line: ``timestamp`` in milliseconds
from the start, and either ``input_length`` / ``output_length`` / ``hash_ids`` or a
``payload`` sent verbatim), the workbench's trace windows
(:func:`workbench.workloads.traces.trace_workload`). Must not know: HTTP, the scheduler.

Two modes, one line per request of the window::

    payload  {"timestamp": 0, "payload": {"model": "tiny-code", "prompt": [812, 33, ...],
              "max_tokens": 41, "ignore_eos": true, "temperature": 0, "stream": true,
              "stream_options": {"include_usage": true}}}
    lengths  {"timestamp": 0, "input_length": 97, "output_length": 41, "hash_ids": []}

``payload`` sends the very token ids the workbench's virtual-clock replay of the same window
submits (prompts synthesized to the fitted lengths, :func:`trace_workload`), with
``ignore_eos`` so each request generates exactly its trace output length: the served run and
the simulated run see the same requests. ``lengths`` leaves the prompt text to the client
(its tokenizer), for other servers.

Run: ``python -m workbench.serving.trace --out workbench-out/azure-conv.jsonl`` (the
``conv_window`` defaults: 10:00 + 12 s, arrivals x 0.3, lengths x 0.25); docs/serve.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..engine.request import context_limit
from ..workloads.traces import CONV_LIMITS, CONV_WINDOW, read_azure_trace, trace_path, trace_workload


def mooncake_lines(workload: Any, model_id: str, mode: str = "payload") -> list[dict]:
    """One AIPerf ``mooncake_trace`` record per request of ``workload`` (a
    :class:`~workbench.workloads.workload.Workload` whose prompts are token ids).

    Args:
        workload: ``(arrival_s, Request)`` pairs.
        model_id: the ``model`` field of each payload.
        mode: ``"payload"`` (the request body, token-id prompt, ``ignore_eos``) or
            ``"lengths"`` (``input_length``, ``output_length``, empty ``hash_ids``).

    Returns:
        Records with ``timestamp`` = ``round(arrival_s * 1000)`` (milliseconds).

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in ("payload", "lengths"):
        raise ValueError(f"mode must be 'payload' or 'lengths', got {mode!r}")
    out = []
    for arrival_s, r in workload:
        record: dict[str, Any] = {"timestamp": round(arrival_s * 1000)}
        if mode == "lengths":
            record.update(input_length=len(r.prompt), output_length=r.max_tokens, hash_ids=[])
        else:
            record["payload"] = {
                "model": model_id,
                "prompt": [int(t) for t in r.prompt],
                "max_tokens": r.max_tokens,
                "ignore_eos": True,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        out.append(record)
    return out


def window_workload(model: Any, tokenizer: Any, trace: str = "conv", **window: Any) -> Any:
    """The Azure ``trace`` window as a :class:`~workbench.workloads.workload.Workload` for
    ``model``: :func:`trace_workload` with :data:`CONV_WINDOW` and :data:`CONV_LIMITS` (``window``
    overrides them, or adds ``max_requests``), lengths fitted to the model's context, seed 0.
    The served replay (this module's JSONL) and the virtual-clock replay of the same window
    submit these very requests.

    Raises:
        FileNotFoundError: the trace is absent (:func:`trace_path`).
    """
    settings = {**CONV_WINDOW, **CONV_LIMITS, **window}
    frame = read_azure_trace(trace_path(trace))
    return trace_workload(frame, tokenizer, context_tokens=context_limit(model)[0], seed=0, **settings)


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench.serving.trace``: write a window of the Azure conversation trace as
    AIPerf ``mooncake_trace`` JSONL; prints the file and its request count."""
    p = argparse.ArgumentParser(prog="python -m workbench.serving.trace", description=main.__doc__)
    p.add_argument("--out", default="workbench-out/azure-conv.jsonl", help="the JSONL file to write")
    p.add_argument(
        "--model", default=None, help="the served model (its tokenizer cuts the prompts; default bundled)"
    )
    p.add_argument("--mode", choices=("payload", "lengths"), default="payload")
    p.add_argument("--trace", default="conv", choices=("conv", "code"), help="which Azure 2023 trace")
    for name, default in (*CONV_WINDOW.items(), *CONV_LIMITS.items()):
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    p.add_argument("--max-requests", type=int, default=None)
    args = p.parse_args(argv)
    from ..runtime.loading import BUNDLED_MODEL, load

    model, tokenizer = load(args.model) if args.model else load()
    window = {k: getattr(args, k) for k in (*CONV_WINDOW, *CONV_LIMITS)}
    work = window_workload(model, tokenizer, args.trace, max_requests=args.max_requests, **window)
    lines = mooncake_lines(work, Path(args.model or BUNDLED_MODEL.name).name, args.mode)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(
        f"wrote {out}: {len(lines)} requests over {lines[-1]['timestamp'] / 1000:.2f} s"
        if lines
        else f"{out}: empty"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
