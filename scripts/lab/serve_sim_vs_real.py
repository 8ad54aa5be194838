"""The Azure conversation window predicted on the virtual clock by the calibrated cost model and
measured by the repo's replay client against `workbench serve` (per layout) and against
`mlx_lm.server` on the same model (the baseline): TTFT and ITL p50 / p95 / p99, output
throughput, and the sim-to-real error per layout (predicted / measured).

Predicted: `wb.replay(work, ..., cost_model=cost)` (``cost`` mode: virtual time advanced by the
cost model `workbench calibrate` fits; `--cost PATH` loads one, else it is calibrated here first).
Measured: `workbench serve --layout L` in a subprocess, `workbench.serving.replay` (httpx +
asyncio, each request sent at its trace timestamp, streamed, timed on the client's wall clock)
sending the same token ids with ``ignore_eos``. Baseline: `python -m mlx_lm.server` on the same
model folder, the same client and schedule; mlx_lm.server takes a text prompt and has no
``ignore_eos``, so each prompt is the decoded token ids and a request may stop early at EOS (the
table's ``tokens`` column says how many were generated of how many asked). Needs the trace
(`$WORKBENCH_TRACE_DIR`). Writes a Markdown table to stdout.

    python scripts/lab/serve_sim_vs_real.py --max-requests 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import workbench as wb
from workbench.observe.metrics import token_gaps
from workbench.serving.replay import replay as client_replay
from workbench.serving.trace import mooncake_lines, window_workload
from workbench.sim.calibrate import calibrate
from workbench.sim.costmodel import CostModel

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PCTS = [50, 95, 99]


def predicted(work, model, tokenizer, layout: str, max_batch: int, cost: CostModel) -> dict:
    """The cost-mode virtual-clock replay of ``work``: percentiles in ms, output tok/s."""
    rep = wb.replay(work, model, tokenizer, {"max_batch": max_batch, "layout": layout}, cost_model=cost)
    ttft = rep.report.requests.ttft_s.to_numpy() * 1000
    itl = token_gaps(rep.report.events).gap_s.to_numpy() * 1000
    out = int(sum(r.max_tokens for _, r in work))
    return {
        "ttft": np.percentile(ttft, PCTS),
        "itl": np.percentile(itl, PCTS),
        "tok_s": rep.report.throughput_tok_per_s,
        "n": len(ttft),
        "tokens": f"{out} / {out}",
    }


def served(cmd: list[str], lines: list[dict], port: int, log: Path) -> dict:
    """Start ``cmd`` (a server on ``port``), wait for ``/health``, replay ``lines`` with the
    client, stop the server; percentiles in ms and output tok/s over the client's wall clock
    (first send to last token)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("w") as log_file:
        server = subprocess.Popen(
            cmd,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            deadline = time.monotonic() + 180
            while True:
                assert server.poll() is None, f"the server exited ({log})"
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"the server did not start ({log})"
                time.sleep(0.5)
            t0 = time.perf_counter()
            records = asyncio.run(client_replay(lines, f"http://127.0.0.1:{port}/v1"))
            wall_s = time.perf_counter() - t0
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
    ok = [r for r in records if not r["error"]]
    ttft = np.array([r["ttft_s"] for r in ok if r["ttft_s"] is not None] or [np.nan]) * 1000
    itl = np.array([g for r in ok for g in r["itl_s"]] or [np.nan]) * 1000
    done = sum(r["completion_tokens"] for r in ok)
    asked = sum(line["payload"]["max_tokens"] for line in lines)
    return {
        "ttft": np.percentile(ttft, PCTS),
        "itl": np.percentile(itl, PCTS),
        "tok_s": done / wall_s,
        "n": len(ok),
        "errors": len(records) - len(ok),
        "tokens": f"{done} / {asked}",
        "first_error": next((r["error"] for r in records if r["error"]), ""),
    }


def as_text(lines: list[dict], tokenizer) -> list[dict]:
    """The same lines with each prompt decoded to text, no ``ignore_eos`` and no ``model`` (what
    mlx_lm.server takes: a ``model`` other than its ``--model`` is loaded by that name, a 404 here)."""
    out = []
    for line in lines:
        payload = {k: v for k, v in line["payload"].items() if k not in ("ignore_eos", "model")}
        payload["prompt"] = tokenizer.decode(payload["prompt"])
        out.append({**line, "payload": payload})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-requests", type=int, default=32, help="the window's first N requests")
    p.add_argument("--layouts", nargs="+", default=["padded", "packed"])
    p.add_argument("--cost", help="a cost model JSON (`workbench calibrate`); calibrated here if absent")
    p.add_argument("--no-baseline", action="store_true", help="skip the mlx_lm.server row")
    p.add_argument("--port", type=int, default=8123)
    args = p.parse_args()
    model, tokenizer = wb.load()
    work = window_workload(model, tokenizer, max_requests=args.max_requests)
    lines = mooncake_lines(work, "tiny-code")
    tmp = Path(tempfile.mkdtemp(prefix="serve-sim-vs-real-"))
    if args.cost:
        cost = CostModel.load(args.cost)
    else:
        # KV widths and prefill context inside tiny-code's 512-token context (calibrate's defaults reach 520)
        cost = calibrate(
            model,
            tokenizer,
            label="tiny-code, calibrated by serve_sim_vs_real.py",
            kv_widths_tokens=(32, 128, 448),
            prefill_context_tokens=448,
        )
        cost.save(tmp / "cost.json")
    print(f"{cost.text()}\nwindow: {len(lines)} requests; cost model and logs in {tmp}", file=sys.stderr)
    print(
        "| layout | source | requests | tokens out / asked | TTFT p50 / p95 / p99 ms "
        "| ITL p50 / p95 / p99 ms | output tok/s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    fmt = lambda a: " / ".join(f"{x:,.1f}" for x in a)  # noqa: E731

    def row(layout: str, source: str, r: dict) -> None:
        n = f"{int(r['n'])}" + (
            f" ({int(r['errors'])} errors: {r['first_error'][:60]})" if r.get("errors") else ""
        )
        print(
            f"| {layout} | {source} | {n} | {r['tokens']} | {fmt(r['ttft'])} | {fmt(r['itl'])} | {r['tok_s']:,.1f} |"
        )
        sys.stdout.flush()

    errors = []
    wb_cmd = [sys.executable, "-m", "workbench.cli", "serve", "--port", str(args.port)]
    for layout in args.layouts:
        pred = predicted(work, model, tokenizer, layout, args.max_batch, cost)
        meas = served(
            wb_cmd + ["--max-batch", str(args.max_batch), "--layout", layout],
            lines,
            args.port,
            tmp / f"{layout}.log",
        )
        row(layout, "predicted (virtual clock, calibrated cost model)", pred)
        row(layout, "measured (replay client vs workbench serve)", meas)
        errors.append(
            (layout, pred["ttft"] / meas["ttft"], pred["itl"] / meas["itl"], pred["tok_s"] / meas["tok_s"])
        )
    if not args.no_baseline:
        mlx_cmd = [
            sys.executable,
            "-m",
            "mlx_lm.server",
            "--model",
            str(wb.BUNDLED_MODEL),
            "--port",
            str(args.port),
        ]
        mlx_cmd += ["--decode-concurrency", str(args.max_batch), "--temp", "0"]
        base = served(mlx_cmd, as_text(lines, tokenizer), args.port, tmp / "mlx_lm.log")
        row("(baseline)", "measured (replay client vs mlx_lm.server)", base)
    print()
    print(
        "| layout | sim-to-real: predicted / measured | TTFT p50 / p95 / p99 | ITL p50 / p95 / p99 | output tok/s |"
    )
    print("| --- | --- | --- | --- | --- |")
    ratio = lambda a: " / ".join(f"{x:.2f}" for x in a)  # noqa: E731
    for layout, t, i, s in errors:
        print(f"| {layout} | ratio | {ratio(t)} | {ratio(i)} | {s:.2f} |")


if __name__ == "__main__":
    main()
