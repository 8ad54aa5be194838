"""A small load client: replay a ``mooncake_trace`` JSONL against a server at its timestamps.

Knows: the JSONL :mod:`workbench.serving.trace` writes (``payload`` lines), OpenAI's streamed
``/v1/completions`` (server-sent events, ``data: [DONE]``), httpx with asyncio. Must not know:
the scheduler (it talks HTTP only, so it runs in its own process).

What AIPerf's ``--fixed-schedule`` does, in a hundred lines, for CI and the notebooks (AIPerf,
the standard client, is 138 packages; docs/serve.md gives its command): each request is sent
at its ``timestamp`` (ms from the start) whatever the others are doing, streamed, and timed on
the client's wall clock::

    python -m workbench.serving.replay workbench-out/azure-conv.jsonl --url http://127.0.0.1:8000/v1 \\
        --out workbench-out/replay.json

writes one record per request: ``ttft_s`` (send to the first chunk with text), ``itl_s`` (the
gaps between chunks with text), ``completion_tokens`` (from the last chunk's ``usage``),
``finish_reason`` and ``error`` (``""`` when none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any


async def one(client: Any, url: str, payload: dict, start: float, at_s: float) -> dict:
    """Send ``payload`` (streamed) at ``start + at_s`` (``time.perf_counter`` seconds); return its record."""
    await asyncio.sleep(max(0.0, start + at_s - time.perf_counter()))
    sent = time.perf_counter()
    times, tokens, reason, error = [], 0, "", ""
    try:
        async with client.stream("POST", f"{url}/completions", json={**payload, "stream": True}) as response:
            if response.status_code != 200:
                error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    for choice in chunk.get("choices", []):
                        if choice.get("text"):
                            times.append(time.perf_counter())
                        reason = choice.get("finish_reason") or reason
    except Exception as exc:  # noqa: BLE001 - recorded per request: one failure ends only its row
        error = f"{type(exc).__name__}: {exc}"
    return {
        "at_s": at_s,
        "ttft_s": times[0] - sent if times else None,
        "itl_s": [b - a for a, b in zip(times, times[1:])],
        "completion_tokens": tokens,
        "finish_reason": reason,
        "error": error,
    }


async def replay(lines: list[dict], url: str, timeout_s: float = 300.0) -> list[dict]:
    """Send every ``payload`` of ``lines`` (``mooncake_trace`` records) to ``url`` (a
    ``base_url`` ending in ``/v1``) at its ``timestamp``; the records, in the lines' order.

    Raises:
        ValueError: a line without a ``payload`` (``lengths`` mode leaves the prompt to the client).
    """
    for i, line in enumerate(lines):
        if "payload" not in line:
            raise ValueError(f"line {i + 1}: no payload (write the trace with --mode payload)")
    import httpx

    limits = httpx.Limits(max_connections=len(lines) or 1)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        start = time.perf_counter()
        return list(
            await asyncio.gather(
                *(one(client, url, line["payload"], start, line["timestamp"] / 1000) for line in lines)
            )
        )


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench.serving.replay TRACE --url URL --out OUT``: replay, write the records
    as JSON, print how many finished and how many failed; exit 1 when one failed."""
    p = argparse.ArgumentParser(prog="python -m workbench.serving.replay", description=main.__doc__)
    p.add_argument(
        "trace", help="a mooncake_trace JSONL with payload lines (python -m workbench.serving.trace)"
    )
    p.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's base_url")
    p.add_argument("--out", default="workbench-out/replay.json")
    args = p.parse_args(argv)
    lines = [json.loads(s) for s in Path(args.trace).read_text().splitlines() if s.strip()]
    records = asyncio.run(replay(lines, args.url))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records))
    failed = sum(bool(r["error"]) for r in records)
    print(f"replayed {len(records)} requests: {len(records) - failed} finished, {failed} failed; wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
