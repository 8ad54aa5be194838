"""The Azure conversation window predicted on the virtual clock and measured by AIPerf against
`workbench serve`: TTFT and ITL p50 / p95 / p99 and output throughput, per layout.

Predicted: `wb.replay(work, ..., mode="measured")` (virtual time advanced by each engine call's
measured duration). Measured: `workbench serve --layout L` in a subprocess, AIPerf replaying the
same requests (`python -m workbench.serving.trace`, payload mode: the same token ids, `ignore_eos`)
with `--fixed-schedule`. Needs AIPerf in its own venv (`--aiperf PATH`; it needs no PyTorch,
GuideLLM does) and the trace (`$WORKBENCH_TRACE_DIR`). Writes a Markdown table to stdout.

    python scripts/lab/serve_sim_vs_real.py --aiperf /tmp/lc-venv/bin/aiperf
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import workbench as wb
from workbench.observe.metrics import token_gaps
from workbench.serving.trace import mooncake_lines, window_workload

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def predicted(work, model, tokenizer, layout: str, max_batch: int) -> dict:
    rep = wb.replay(work, model, tokenizer, {"max_batch": max_batch, "layout": layout}, mode="measured")
    ttft = rep.report.requests.ttft_s.to_numpy() * 1000
    itl = token_gaps(rep.report.events).gap_s.to_numpy() * 1000
    return {
        "ttft": np.percentile(ttft, [50, 95, 99]),
        "itl": np.percentile(itl, [50, 95, 99]),
        "tok_s": rep.report.throughput_tok_per_s,
        "n": len(ttft),
    }


def measured(aiperf: str, trace: Path, layout: str, max_batch: int, port: int, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "serve", "--port", str(port), "--max-batch", str(max_batch)]
        + ["--layout", layout],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.5)
        cmd = [aiperf, "profile", "--model", "tiny-code", "--url", f"http://127.0.0.1:{port}"]
        cmd += ["--endpoint-type", "completions", "--streaming", "--input-file", str(trace)]
        cmd += ["--custom-dataset-type", "mooncake_trace", "--fixed-schedule", "--use-server-token-count"]
        cmd += ["--tokenizer", str(wb.BUNDLED_MODEL), "--artifact-dir", str(out)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)
    d = json.loads((out / "profile_export_aiperf.json").read_text())
    pick = lambda tag: np.array([d[tag][p] for p in ("p50", "p95", "p99")])  # noqa: E731
    return {
        "ttft": pick("time_to_first_token"),
        "itl": pick("inter_token_latency"),
        "tok_s": d["output_token_throughput"]["avg"],
        "n": d["request_count"]["avg"],
        "errors": d.get("error_request_count", {}).get("avg", 0),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--aiperf", required=True, help="the aiperf executable (its own venv)")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--layouts", nargs="+", default=["padded", "packed"])
    p.add_argument("--port", type=int, default=8123)
    args = p.parse_args()
    model, tokenizer = wb.load()
    work = window_workload(model, tokenizer)
    tmp = Path(tempfile.mkdtemp(prefix="serve-sim-vs-real-"))
    trace = tmp / "azure-conv.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in mooncake_lines(work, "tiny-code")))
    print("| layout | source | requests | TTFT p50 / p95 / p99 ms | ITL p50 / p95 / p99 ms | output tok/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    fmt = lambda a: " / ".join(f"{x:,.1f}" for x in a)  # noqa: E731
    for layout in args.layouts:
        rows = {
            "predicted (virtual clock, measured mode)": predicted(
                work, model, tokenizer, layout, args.max_batch
            ),
            "measured (AIPerf vs workbench serve)": measured(
                args.aiperf, trace, layout, args.max_batch, args.port, tmp / layout
            ),
        }
        for source, r in rows.items():
            n = f"{int(r['n'])}" + (f" ({int(r['errors'])} errors)" if r.get("errors") else "")
            print(f"| {layout} | {source} | {n} | {fmt(r['ttft'])} | {fmt(r['itl'])} | {r['tok_s']:,.1f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
