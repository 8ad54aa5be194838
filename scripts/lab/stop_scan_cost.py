"""What stop strings cost: the stop-string check and the stream's hold-back
(``workbench.engine.text.RowText.feed`` then ``.ready``) with K never-matching stop strings, and
a 4-row batch streamed to the end with one row holding K of them, against none.

Usage: ``python scripts/lab/stop_scan_cost.py [--counts K ...] [--length L] [--tokens N] [--rounds R]``
(defaults: K = 1 16 64 256 20000, stop strings of L = 64 characters, N = 400 tokens of the
bundled prompt set, R = 5 rounds). Prints, per K:

- ``build``: the automaton of the stop list, built once per list (``stop_automaton``, cached);
- ``feed + ready``: CPU microseconds per token (best of 3; CPU time, which other processes'
  load does not add to);
- for each K the scheduler accepts (``MAX_STOP_STRINGS``), in the streamed batch: the CPU time
  spent inside the text code (``RowText``'s feed, close and ready, timed in the same runs) and its
  share of the run's CPU time, which the machine's load barely skews; and the run's wall time over
  the run without stop strings, rounds alternating (none, K, none, K, ...), median and range over
  the rounds: on a loaded machine that ratio is mostly noise (read the share).
"""

import argparse
import statistics
import time

import workbench as wb
from workbench.engine import request as request_module
from workbench.engine import text as text_module
from workbench.engine.text import RowText
from workbench.workloads.workload import prompt_of_length

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument(
    "--counts", type=int, nargs="+", default=[1, 16, 64, 256, 20000], help="stop-string counts K"
)
parser.add_argument("--length", type=int, default=64, help="characters per stop string (default 64)")
parser.add_argument("--tokens", type=int, default=400, help="tokens fed per measurement (default 400)")
parser.add_argument(
    "--rounds", type=int, default=5, help="batch runs per K, alternating with none (default 5)"
)
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
        start = time.process_time()
        for t in tokens:
            row.feed(t)
            _ = row.ready  # the property's scan is what is timed
        best = min(best, time.process_time() - start)
    return best / len(tokens) * 1e6


spent = [0.0]  # CPU seconds of this thread inside RowText's feed / close / ready during a batch run


def timed(f):
    def wrapper(*a, **kw):
        start = time.thread_time()
        try:
            return f(*a, **kw)
        finally:
            spent[0] += time.thread_time() - start

    return wrapper


for name in ("feed", "close"):
    setattr(RowText, name, timed(getattr(RowText, name)))
RowText.ready = property(timed(RowText.ready.fget))


def batch_s(k: int) -> tuple[float, float, float]:
    """(the streamed run's wall seconds, its CPU seconds, CPU seconds of it inside the text code)."""
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
    spent[0] = 0.0
    start, cpu = time.perf_counter(), time.process_time()
    for _ in sched.stream_all():
        pass
    return time.perf_counter() - start, time.process_time() - cpu, spent[0]


print(f"stop strings of {args.length} characters, {len(tokens)} tokens; MAX_STOP_STRINGS = {limit}")
for k in args.counts:
    text_module.stop_automaton.cache_clear()
    start = time.perf_counter()
    text_module.stop_automaton(tuple(stops(k)))  # what the rows below then share
    build_ms = (time.perf_counter() - start) * 1e3
    print(f"K = {k:6d}: build {build_ms:9.1f} ms once; feed + ready {per_token_us(k):8.1f} us CPU/token")
batch_s(0)  # warm-up
for k in args.counts:
    if limit is not None and k > limit:
        print(f"K = {k:6d}: refused at submit (MAX_STOP_STRINGS = {limit})")
        continue
    text_module.stop_automaton.cache_clear()
    batch_s(k)  # builds the list's automaton once (cached per list, as in a session)
    ratios, shares, text_ms = [], [], []
    for _ in range(args.rounds):
        base, _, _ = batch_s(0)
        run, run_cpu, inside = batch_s(k)
        ratios.append(run / base)
        shares.append(inside / run_cpu)
        text_ms.append(inside * 1e3)
    print(
        f"K = {k:6d} on one row of 4 (48 tokens each): text code {statistics.median(text_ms):5.2f} ms CPU "
        f"= {statistics.median(shares):6.2%} of the run's CPU; run / run without stop strings "
        f"{statistics.median(ratios):.2f} x (range {min(ratios):.2f}-{max(ratios):.2f}, {args.rounds} rounds)"
    )
