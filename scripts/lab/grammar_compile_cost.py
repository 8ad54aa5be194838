"""What compiling a structured-output grammar costs, and what the cache of compiled grammars
saves per row (``workbench.engine.levers.constrained.compiled``).

Usage: ``python scripts/lab/grammar_compile_cost.py [--model NAME] [--repeats N]`` (default: the
bundled model, best of 5). Prints, per constraint, the compile at ``submit`` (validation,
matcher, first mask, the first-token probes), and a row's start without the cache (validation, a
new matcher and its first mask: what every row did before) against with it (a copy of the
compiled matcher and its first mask); then the time ``submit`` takes to refuse
``regex="a{1000000}"`` the first time and from the cache.
"""

import argparse
import time

import workbench as wb
from workbench.engine.levers import constrained

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--model", default=None, help="model name or folder (default: the bundled one)")
parser.add_argument("--repeats", type=int, default=5, help="best of N (default 5)")
args = parser.parse_args()

model, tokenizer = wb.load(args.model) if args.model else wb.load()
sched = wb.Scheduler(model, tokenizer)
llg = constrained._llguidance().LLMatcher
ll_tok = constrained.ll_tokenizer(tokenizer, sched.vocab_size)
CITY = {  # the schema of docs/structured-output.md's example
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "population_millions": {"type": "integer"}},
    "required": ["city", "population_millions"],
    "additionalProperties": False,
}
CASES = {
    "json_schema (2 fields)": dict(json_schema=CITY),
    "json_schema {type: string}": dict(json_schema={"type": "string"}),
    r"regex [a-z]{2,6}\(\d\)": dict(regex=r"[a-z]{2,6}\(\d\)"),
    "regex .*": dict(regex=".*"),
    "regex a{5000}": dict(regex="a{5000}"),
    "regex a{100000}": dict(regex="a{100000}"),
    "choices (3)": dict(choices=["yes", "no", "maybe so"]),
}


def best_ms(f) -> float:
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def uncached(grammar: str) -> None:
    llg.validate_grammar(grammar, ll_tok)
    llg(ll_tok, grammar, log_level=0).compute_bitmask()


def cached(grammar: str) -> None:
    constrained.compiled(grammar, ll_tok).deep_copy().compute_bitmask()


print(f"vocabulary {sched.vocab_size}; best of {args.repeats}; ms")
print(f"{'constraint':28s} {'compile':>9s} {'row, no cache':>14s} {'row, cached':>12s}")
for name, fields in CASES.items():
    request = wb.Request(prompt=[1], **fields)
    field = constrained.requested(request)[0]
    _, grammar = constrained._source(field, getattr(request, field))

    def compile_once(grammar=grammar) -> None:
        constrained._COMPILED.clear()
        constrained.compiled(grammar, ll_tok)

    compile_ms = best_ms(compile_once)
    print(
        f"{name:28s} {compile_ms:9.2f} {best_ms(lambda g=grammar: uncached(g)):14.2f} "
        f"{best_ms(lambda g=grammar: cached(g)):12.2f}"
    )
for when in ("first", "cached"):
    start = time.perf_counter()
    try:
        sched.submit(wb.Request(prompt=[1, 2, 3], regex="a{1000000}"))
    except ValueError as exc:
        message = str(exc)
    print(f'submit(regex="a{{1000000}}") refused ({when}): {(time.perf_counter() - start) * 1e3:.0f} ms')
print(message)
