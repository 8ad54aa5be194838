"""The README's chat request, timed: seconds from ``submit`` to the first streamed piece and to the
whole answer, on the fetched SmolLM2-135M (``workbench models fetch smollm2-135m`` first).

Usage: ``python scripts/lab/chat_first_piece.py [--4bit]``; ``--4bit`` loads with ``dequantize=False``
(the CPU default dequantizes). Prints one line: load seconds (``import workbench`` included), the
first ``Scheduler(...)`` (its batching probe, :mod:`workbench.engine.probe`), first piece, whole
answer, the text, the 1-minute load average.
"""

import argparse
import os
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--4bit", dest="four_bit", action="store_true", help="keep the 4-bit layers (dequantize=False)"
)
args = parser.parse_args()

started = time.perf_counter()
import workbench as wb  # noqa: E402  timed with the load

model, tokenizer = wb.load("smollm2-135m", **({"dequantize": False} if args.four_bit else {}))
load_s = time.perf_counter() - started
built = time.perf_counter()
sched = wb.Scheduler(model, tokenizer, max_batch=4)
scheduler_s = time.perf_counter() - built
uid = sched.submit(
    wb.Request(messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=32)
)
submitted, first_s, pieces = time.perf_counter(), None, []
for piece in sched.stream(uid):
    first_s = time.perf_counter() - submitted if first_s is None else first_s
    pieces.append(piece)
print(
    f"load {load_s:.1f} s; Scheduler() {scheduler_s:.1f} s; "
    f"first piece {first_s:.2f} s after submit; all {time.perf_counter() - submitted:.2f} s; "
    f"text {''.join(pieces)!r}; load average {os.getloadavg()[0]:.2f}"
)
