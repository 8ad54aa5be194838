"""``/metrics`` against independent counts: the tokens and requests the clients received, and
the engine's report (pandas over the event log) for TTFT, ITL and preemptions."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import workbench as wb
from workbench.observe.events import events_frame
from workbench.observe.metrics import token_gaps

from .conftest import wait_until


def scrape(server) -> dict[str, float]:
    """``/metrics`` as ``{sample name{labels}: value}``."""
    text = httpx.get(server.url.removesuffix("/v1") + "/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
            if "le" not in s.labels:
                out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


async def _load(server) -> list:
    """Two long low-priority streams, then (once one decodes) an urgent long request that the KV
    budget can only hold by preempting it, then three short ones; returns every completion's
    (generated tokens, finish reason) as the client counted them."""
    client = openai.AsyncOpenAI(base_url=server.url, api_key="-", max_retries=0, timeout=120)

    async def streamed(prompt, max_tokens, priority=0):
        stream = await client.completions.create(
            model="m",
            prompt=prompt,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"priority": priority},
        )
        chunks = [c async for c in stream]
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return chunks[-1].usage.completion_tokens, reasons[0]

    low = [asyncio.create_task(streamed(f"def f{i}(x):", 200)) for i in range(2)]
    sched = server.sched
    await asyncio.to_thread(wait_until, lambda: any(len(s.tokens) > 3 for s in list(sched.requests.values())))
    urgent = asyncio.create_task(streamed("def urgent():", 200, priority=5))
    short = [asyncio.create_task(streamed(f"import m{i}", 5)) for i in range(3)]
    return await asyncio.gather(*low, urgent, *short)


@pytest.mark.slow
def test_metrics_match_the_clients_counts_and_the_engines_report(bundled):
    sched = wb.Scheduler(
        *bundled, max_batch=8, kv_budget_bytes=1_400_000, policy="priority"
    )  # two 256-token rows
    with wb.serve(sched, port=0) as server:
        received = asyncio.run(_load(server))
        wait_until(lambda: sched.idle, what="the engine to go idle")
        m = scrape(server)
        tokens = sum(n for n, _ in received)
        assert m["workbench_generated_tokens_total"] == tokens == 3 * 200 + 3 * 5
        assert m["workbench_requests_finished_total{finish_reason=length}"] == len(received) == 6
        assert m["workbench_ttft_seconds_count"] == 6 and m["workbench_itl_seconds_count"] == tokens - 6
        report = sched.report()
        assert m["workbench_ttft_seconds_sum"] == pytest.approx(report.requests.ttft_s.sum(), rel=1e-9)
        gaps = token_gaps(events_frame(sched.events))
        assert m["workbench_itl_seconds_sum"] == pytest.approx(gaps.gap_s.sum(), rel=1e-9)
        preempted = int((report.events.kind == "preempt").sum())
        assert preempted >= 1 and m["workbench_preemptions_total"] == preempted
        assert m["workbench_requests_running"] == m["workbench_requests_queued"] == 0
        assert m["workbench_kv_bytes"] == sched.snapshot().kv_bytes
        assert np.isfinite(m["workbench_ttft_seconds_sum"])
