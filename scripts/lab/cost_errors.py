"""The cost model's error per operation, against the forwards a paced engine measured, and
what the pacer's correction leaves of it (issue 17).

Usage: ``python scripts/lab/cost_errors.py [N_REQUESTS]`` (default 25). Replays the first
N requests of the Azure conversation trace window that ``docs/policies.md`` uses (the real
tiny-llama, ``max_batch`` 8, chunks of at most 32 tokens, arrival times kept) on the wall
clock through a Scheduler paced with the bundled cost model
(``data/costmodels/tiny-llama-linux-x86_64.json``) as its prior. Prints, per operation
(a prefill chunk; a decode iteration: everything between two ``admit()`` calls that is not
prefill), the median and 90th-percentile relative error of the prior alone and of the
corrected predictions the pacer planned with (predicted / measured - 1; negative =
optimistic).
"""

import sys

import workbench as wb
from workbench.bench.engines import Arrival, WorkbenchEngine, drive
from workbench.engine.levers.pacing import Pacing
from workbench.runtime.blas import STATUS as BLAS
from workbench.workloads.traces import conv_window

n = int(sys.argv[1]) if len(sys.argv) > 1 else 25
model, tokenizer = wb.load("tiny-llama")
cost = wb.CostModel.load(wb.BUNDLED_MODEL.parent.parent / "costmodels" / "tiny-llama-linux-x86_64.json")
work = conv_window(tokenizer).head(n)
arrivals = [Arrival(tuple(r.prompt), r.max_tokens, at_s=t) for t, r in work]
engine = WorkbenchEngine(model, tokenizer, 8, 32, pacing=Pacing(cost_model=cost), history_size=0)
drive(engine, arrivals)
errors = engine.sched.pacer.prediction_errors()
print(
    f"{len(work)} trace requests on tiny-llama, BLAS {BLAS.library or 'MLX bundled'}; "
    f"{len(errors)} predictions ({engine.sched.pacer.text()})"
)
print(
    f"{'operation':<10} {'n':>5}  {'prior median':>12} {'prior p90 |e|':>13}  "
    f"{'corrected median':>16} {'corrected p90 |e|':>17}"
)
for kind, e in errors.groupby("kind"):
    print(
        f"{kind:<10} {len(e):>5}  {e.prior_error.median():>+12.1%} {e.prior_error.abs().quantile(0.9):>13.1%}  "
        f"{e.error.median():>+16.1%} {e.error.abs().quantile(0.9):>17.1%}"
    )
