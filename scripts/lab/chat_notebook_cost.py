"""Which weights notebook 10 loads: SmolLM2-135M's forwards on this CPU, 4-bit weights (as
converted) against the same weights dequantized to float32 (``dequantize=True``). With MLX's
reference BLAS (the test suite's ``WORKBENCH_BLAS=off``) float32 does not pay; with an
optimized BLAS (``WORKBENCH_BLAS=/path/to/libopenblas.so.0``) float32 prefills over 10 times
faster. So notebook 10 loads the float32 form (``wb.load``'s default on the CPU) and runs,
under nbval too, with the optimized BLAS (its metadata: ``notebooks/conftest.py``). Notebook 10
points here rather than quoting numbers of another run.

Usage: ``python scripts/lab/chat_notebook_cost.py`` (needs ``workbench models fetch smollm2-135m``).
With the test suite's numerics (``WORKBENCH_BLAS=off`` unless set;
the script restarts itself with it, since the BLAS is chosen at interpreter start),
it times the forwards notebook 10 is made of: a 37-token prefill (one chat prompt), and one
decode step at B = 1 and B = 3 over a 40-token cache. Each number is the fastest of ``REPS``
runs (ms), the two forms alternating, so a busy machine's neighbours inflate it least.
"""

from __future__ import annotations

import os
import sys
import time

if "WORKBENCH_BLAS" not in os.environ:  # the start-up hook reads it at interpreter start: restart with it
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "WORKBENCH_BLAS": "off"})

import workbench as wb  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

REPS = 3
PROMPT_TOKENS = 37  # notebook 10's chat prompts: 35 to 37 tokens with the template
CACHE_TOKENS = 40


def prefill_ms(model, tokens: int = PROMPT_TOKENS) -> float:
    """One ``[1, tokens]`` forward into a fresh cache, in ms."""
    cache = make_prompt_cache(model)
    start = time.perf_counter()
    mx.eval(model(mx.zeros((1, tokens), dtype=mx.int32), cache=cache))
    return (time.perf_counter() - start) * 1e3


def decode_ms(model, rows: int, cache_tokens: int = CACHE_TOKENS) -> float:
    """One ``[rows, 1]`` forward over a ``cache_tokens``-token cache, in ms."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.zeros((rows, cache_tokens), dtype=mx.int32), cache=cache))
    start = time.perf_counter()
    mx.eval(model(mx.zeros((rows, 1), dtype=mx.int32), cache=cache))
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    forms = {"4-bit": wb.load("smollm2-135m")[0], "float32": wb.load("smollm2-135m", dequantize=True)[0]}
    tasks = {
        f"prefill {PROMPT_TOKENS} tok": prefill_ms,
        "decode B=1": lambda m: decode_ms(m, 1),
        "decode B=3": lambda m: decode_ms(m, 3),
    }
    best = {(f, t): float("inf") for f in forms for t in tasks}
    for _ in range(REPS):
        for task, run in tasks.items():
            for form, model in forms.items():
                best[form, task] = min(best[form, task], run(model))
    print(f"SmolLM2-135M forwards, WORKBENCH_BLAS={os.environ['WORKBENCH_BLAS']}, fastest of {REPS} (ms)")
    print(f"{'weights':<8}" + "".join(f"{t:>18}" for t in tasks))
    for form in forms:
        print(f"{form:<8}" + "".join(f"{best[form, t]:>18.1f}" for t in tasks))


if __name__ == "__main__":
    main()
