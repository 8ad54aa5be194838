"""What stop strings cost per token: the stop-string check and the stream's hold-back
(``workbench.engine.text.RowText.feed`` then ``.ready``) with K never-matching stop strings,
and a 4-row batch streamed to the end with one row holding K of them, against none.

Usage: ``python scripts/stop_scan_cost.py [--counts K ...] [--length L] [--tokens N]``
(defaults: K = 1 16 64 256 20000, stop strings of L = 64 characters, N = 400 tokens of
the bundled prompt set). Prints, per K, microseconds per token of ``feed`` + ``ready``
(best of 3), and, for each K the scheduler accepts (``MAX_STOP_STRINGS``), the batch's
streamed run time over the run without stop strings (best of 3).
"""

import argparse
import time

import workbench as wb
from workbench.engine import request as request_module
from workbench.engine.text import RowText
from workbench.workloads.workload import prompt_of_length

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument(
    "--counts", type=int, nargs="+", default=[1, 16, 64, 256, 20000], help="stop-string counts K"
)
parser.add_argument("--length", type=int, default=64, help="characters per stop string (default 64)")
parser.add_argument("--tokens", type=int, default=400, help="tokens fed per measurement (default 400)")
args = parser.parse_args()

model, tokenizer = wb.load()
tokens = prompt_of_length(tokenizer, args.tokens, 0)
limit = getattr(request_module, "MAX_STOP_STRINGS", None)


def stops(k: int) -> list[str]:
    """``k`` distinct strings that never occur in code text (each ``args.length`` long)."""
    return [(f"\x07{i:06d}" * args.length)[: args.length] for i in range(k)]


def per_token_us(k: int) -> float:
    best = float("inf")
    for _ in range(3):
        row = RowText(tokenizer, stops(k))
        start = time.perf_counter()
        for t in tokens:
            row.feed(t)
            _ = row.ready  # the property's scan is what is timed
        best = min(best, time.perf_counter() - start)
    return best / len(tokens) * 1e6


def batch_s(k: int) -> float:
    best = float("inf")
    for _ in range(3):
        sched = wb.Scheduler(model, tokenizer, max_batch=4)
        for i in range(4):
            sched.submit(
                wb.Request(
                    prompt=prompt_of_length(tokenizer, 12, 50 * i),
                    max_tokens=48,
                    stop_ids=[],
                    stop=stops(k) if (i == 0 and k) else None,
                )
            )
        start = time.perf_counter()
        for _ in sched.stream_all():
            pass
        best = min(best, time.perf_counter() - start)
    return best


print(f"stop strings of {args.length} characters, {len(tokens)} tokens; MAX_STOP_STRINGS = {limit}")
for k in args.counts:
    print(f"K = {k:6d}: feed + ready {per_token_us(k):10.1f} us/token")
base_s = batch_s(0)
print(f"4-row batch, 48 tokens each, streamed, no stop strings: {base_s * 1e3:.0f} ms")
for k in args.counts:
    if limit is not None and k > limit:
        print(f"K = {k:6d}: refused at submit (MAX_STOP_STRINGS = {limit})")
        continue
    print(f"K = {k:6d} on one row: {batch_s(k) / base_s:.2f} x")
