"""The packed layout against the padded one in one process, alternating: a prompt alone (TTFT)
and the full-batch decode step, on ``workbench bench``'s llama-155m (float32, random weights).

Usage: ``python scripts/lab/packed_speed.py [--pairs N] [--lengths L ...] [--batches B ...]
[--model tiny-llama]`` (defaults: 15 pairs, prompts of 8 64 128 300 512 tokens, decode at B = 1 8
32, llama-155m; ``tiny-llama``, the bundled model ``workbench bench --packed`` runs, shows the
layouts' own costs, which llama-155m's matmuls hide).

- **prefill**: per pair and length, a fresh scheduler of each layout (``max_batch`` 8,
  ``prefill_step_size`` and ``max_num_batched_tokens`` 512, pages of 16, ``history_size`` 64: the
  bench's settings) gets the prompt alone, ``max_tokens=1``; the time from ``submit`` to its
  first token. The layouts alternate, the first of each pair swapped every pair.
- **decode**: per pair and ``B``, a fresh scheduler of each layout (``max_batch`` ``B``) gets ``B``
  prompts of 16 tokens, 28 new tokens each; the median iteration once every row decodes (the
  steps of ``B`` one-token rows), alternating the same way.

Prints per length / ``B`` the median of the per-pair ratios packed / padded (and their
interquartile range) on the wall clock and on the process's CPU time (all threads: less moved by
other sessions on the shared cores), the median and lowest wall times, and the load average
before and after (``os.getloadavg``); the machine's 2 cores are shared, so read the medians of
the pairs' ratios. ``--unpipelined`` adds the packed layout with ``pipeline=False``.
"""

import argparse
import os
import time

from workbench.bench.model import FULL, make_model
from workbench.engine.request import Request
from workbench.engine.scheduler import Scheduler
from workbench.engine.state import Status
from workbench.runtime.loading import load

import numpy as np

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--pairs", type=int, default=15)
parser.add_argument("--lengths", type=int, nargs="*", default=[8, 64, 128, 300, 512])
parser.add_argument("--batches", type=int, nargs="*", default=[1, 8, 32])
parser.add_argument("--unpipelined", action="store_true", help="also the packed layout with pipeline=False")
parser.add_argument(
    "--model", default="llama-155m", help="llama-155m (default) or tiny-llama (the bundled one)"
)
args = parser.parse_args()

model, tok = load("tiny-llama") if args.model == "tiny-llama" else (make_model(FULL), load()[1])
VOCAB = model.args.vocab_size
LAYOUTS = {
    "padded": {},
    "packed": dict(layout="packed", page_size=16, max_num_batched_tokens=512),
}
if args.unpipelined:  # the packed layout without building the next forward before the read
    LAYOUTS["packed, pipeline=False"] = dict(LAYOUTS["packed"], pipeline=False)
rng = np.random.default_rng(0)


def scheduler(layout: str, max_batch: int) -> Scheduler:
    return Scheduler(
        model, tok, max_batch=max_batch, prefill_step_size=512, history_size=64, **LAYOUTS[layout]
    )


def clocks() -> np.ndarray:
    """``[wall, process CPU]`` seconds now (CPU: every thread of this process, MLX's included;
    less moved by other sessions on the shared cores than the wall clock)."""
    return np.array([time.perf_counter(), time.process_time()])


def ttft_s(layout: str, n: int) -> np.ndarray:
    sched = scheduler(layout, 8)
    prompt = rng.integers(1, VOCAB, n).tolist()
    start = clocks()
    sched.submit(Request(prompt=prompt, max_tokens=1, stop_ids=[]))
    while not any(e.kind == "token" for e in (sched.admit(), sched.step())[1]):
        sched.filter()
    return clocks() - start


def decode_step_s(layout: str, B: int, new: int = 28) -> np.ndarray:
    sched = scheduler(layout, B)
    for _ in range(B):
        sched.submit(Request(prompt=rng.integers(1, VOCAB, 16).tolist(), max_tokens=new, stop_ids=[]))
    steps = []
    while not sched.idle:
        running = sum(r.status is Status.RUNNING for r in sched.state.requests.values()) == B
        start = clocks()
        sched.admit()
        sched.step()
        sched.filter()
        if running:
            steps.append(clocks() - start)
    return np.median(np.array(steps[2:-2]), axis=0)


def compare(label: str, measure, keys) -> None:
    for key in keys:
        loads = [os.getloadavg()[0]]
        for layout in LAYOUTS:
            measure(layout, key)  # warm-up
        got = {layout: [] for layout in LAYOUTS}
        for p in range(args.pairs):
            order = list(LAYOUTS) if p % 2 == 0 else list(reversed(LAYOUTS))  # each first in turn
            for layout in order:
                got[layout].append(measure(layout, key))
        loads.append(os.getloadavg()[0])
        base = np.array(got["padded"])  # [pairs, 2]: wall, CPU
        for other in [layout for layout in LAYOUTS if layout != "padded"]:
            o = np.array(got[other])
            r = o / base
            print(
                f"{label} {key}: {other} / padded per pair median wall {np.median(r[:, 0]):.3f} "
                f"(IQR {np.quantile(r[:, 0], 0.25):.3f}..{np.quantile(r[:, 0], 0.75):.3f}), CPU "
                f"{np.median(r[:, 1]):.3f} (IQR {np.quantile(r[:, 1], 0.25):.3f}..{np.quantile(r[:, 1], 0.75):.3f}); "
                f"{other} wall median {1e3 * np.median(o[:, 0]):.2f} ms (lowest {1e3 * o[:, 0].min():.2f}), "
                f"padded {1e3 * np.median(base[:, 0]):.2f} ms (lowest {1e3 * base[:, 0].min():.2f}); "
                f"{args.pairs} pairs; load {min(loads):.2f}-{max(loads):.2f}",
                flush=True,
            )


compare("prefill tokens", ttft_s, args.lengths)
compare("decode B", decode_step_s, args.batches)
