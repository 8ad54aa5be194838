"""What per-row LoRA adapters cost per decode step, against the same batch without adapters.

Runs the same ``B`` greedy requests (``B`` in ``--rows``) through ``workbench.Scheduler`` on
the bundled ``tiny-code`` model in five set-ups and times ``step()`` (the ``[B, 1]`` decode
forward and its bookkeeping; ``pipeline=False`` so each step waits for its own forward):

- ``base``: no adapters loaded (the plain model).
- ``loaded, rows base``: ``prose`` and ``numbers`` loaded, every row ``adapter=None``
  (the wrapped layers see no selection: the plain ``Linear`` only).
- ``mixed``: rows cycle ``prose``, ``numbers``, ``None`` (gathered per-row ``A``, ``B``).
- ``all prose``: every row ``adapter="prose"`` (still gathered per row).
- ``mlx-lm LoRALinear``: the model from ``mlx_lm.load(..., adapter_path=prose)`` (one
  adapter for the whole batch, mlx-lm's ``LoRALinear`` layers), no scheduler adapters:
  what one adapter costs the mlx-lm way, for comparison.

Each set-up runs ``--trials`` times, interleaved with the others (so machine load drifts
evenly); a trial is one run of ``--steps`` decode steps after 4 warm-up steps, each timed
(wall clock). Reported over all trials' steps: the 10th percentile (``p10``: on a machine
shared with other jobs, the steps that waited least for a core, the most repeatable
number) and the median, each with its ratio to ``base``.

Usage::

    python scripts/lab/adapter_cost.py [--rows 1 4 8] [--steps 48] [--trials 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from importlib.metadata import version

import workbench as wb

import mlx_lm

MODEL = str(wb.BUNDLED_MODEL)
ADAPTERS = {"prose": "data/adapters/prose", "numbers": "data/adapters/numbers"}
PROMPT = "def parse(text):\n    "


def step_times(model, tokenizer, rows: int, selection: list, steps: int, adapters=None) -> list[float]:
    """Wall seconds of each of ``steps`` ``step()`` calls (after 4 warm-up steps) for
    ``rows`` rows whose adapters cycle through ``selection``."""
    sched = wb.Scheduler(model, tokenizer, max_batch=rows, pipeline=False, history_size=0, adapters=adapters)
    for b in range(rows):
        sched.submit(
            wb.Request(
                prompt=PROMPT, max_tokens=steps + 8, stop_ids=[], adapter=selection[b % len(selection)]
            )
        )
    sched.admit()
    for _ in range(4):
        sched.step()
    out = []
    for _ in range(steps):
        start = time.perf_counter()
        sched.step()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    """Print one markdown table per row count: p10 and median step time, ratios to ``base``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()
    model, tok = wb.load(MODEL)
    wrapped, _ = wb.load(MODEL)
    bank = wb.Scheduler(wrapped, tok, adapters=ADAPTERS).adapters  # loaded once, shared by the set-ups
    mlx_lora, _ = mlx_lm.load(MODEL, adapter_path=ADAPTERS["prose"])
    setups = {
        "base": (model, [None], None),
        "loaded, rows base": (wrapped, [None], bank),
        "mixed (prose, numbers, none)": (wrapped, ["prose", "numbers", None], bank),
        "all prose": (wrapped, ["prose"], bank),
        "mlx-lm LoRALinear (prose, whole batch)": (mlx_lora, [None], None),
    }
    print(
        f"mlx {version('mlx')}, mlx-lm {version('mlx-lm')}, {platform.system()} {platform.machine()}; "
        f"adapters hold {bank.nbytes:,} bytes ({', '.join(f'{n} rank {a.rank}' for n, a in bank.adapters.items())})"
    )
    for rows in args.rows:
        times = {name: [] for name in setups}
        for _ in range(args.trials):
            for name, (m, selection, adapters) in setups.items():
                times[name] += step_times(m, tok, rows, selection, args.steps, adapters)

        def p10_median(t: list[float]) -> tuple[float, float]:
            return statistics.quantiles(t, n=10)[0], statistics.median(t)

        base_p10, base_med = p10_median(times["base"])
        print(f"\n{rows} row(s), {args.trials} x {args.steps} steps each\n")
        print(
            "| set-up | p10 ms / step | vs base | median ms / step | vs base |\n| --- | ---: | ---: | ---: | ---: |"
        )
        for name, t in times.items():
            p10, med = p10_median(t)
            print(
                f"| {name} | {1e3 * p10:.2f} | {p10 / base_p10:.2f}x | {1e3 * med:.2f} | {med / base_med:.2f}x |"
            )


if __name__ == "__main__":
    main()
