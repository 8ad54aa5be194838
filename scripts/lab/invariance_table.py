"""Rows equal to the same request alone, per engine: the workbench's default path,
``fast_decode=False`` (mlx-lm's forward), mlx-lm's ``BatchGenerator`` and
``batch_invariant=True`` — greedy chat questions all at once and staggered (one arrival
every ``--every`` steps into ``--staggered-batch`` rows). Issue 24's table.

    python scripts/lab/invariance_table.py --model smollm2-135m --dtype bfloat16 --device gpu
    python scripts/lab/invariance_table.py --model tiny-code --questions 6 --max-tokens 8     # a CPU smoke run

"Alone" is the same engine with one row (``Scheduler(max_batch=1, <same settings>)``,
a one-request ``BatchGenerator``); the default engines compare tokens, the invariant one
tokens and log-probs bit for bit. Prints the table and writes JSON lines to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

QUESTIONS = [
    "What is the capital of France?",
    "Name the three primary colors.",
    "What is 2 + 2?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water?",
    "How many legs does a spider have?",
    "What is the largest planet?",
    "Translate 'hello' into Spanish.",
    "What gas do plants breathe in?",
    "Name a famous painting by Leonardo da Vinci.",
    "What is the square root of 81?",
    "What is H2O?",
    "Which ocean is the largest?",
    "How many days are in a leap year?",
    "What is the opposite of hot?",
    "Give me a synonym for happy.",
    "What language is spoken in Brazil?",
    "What is the freezing point of water?",
    "Who painted the Starry Night?",
    "What is the chemical symbol for gold?",
    "How many continents are there?",
    "What is the fastest land animal?",
    "Name a prime number greater than 10.",
    "What does a thermometer measure?",
    "What is the tallest mountain on Earth?",
    "Which planet is called the Red Planet?",
    "What is 10 times 12?",
    "Name an instrument with keys.",
    "What do bees make?",
    "What is the main ingredient of guacamole?",
    "How many hours are in a day?",
    "Write one word that rhymes with cat.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="model name or path")
    ap.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float32", "native"],
        help="weights dtype (a quantized model is dequantized first unless native)",
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"], help="MLX device")
    ap.add_argument("--questions", type=int, default=32, help="how many questions (<= 32)")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens per answer")
    ap.add_argument("--staggered-batch", type=int, default=8, help="max_batch of the staggered schedule")
    ap.add_argument("--every", type=int, default=3, help="steps between staggered arrivals")
    ap.add_argument("--prefill-step-size", type=int, default=2048, help="prefill chunk (tokens)")
    ap.add_argument("--out", default="workbench-out/invariance_table.jsonl", help="JSON lines file")
    ap.add_argument(
        "--skip-probe",
        action="store_true",
        help="batch even where the construction probe would choose the serial lane (diagnosis)",
    )
    args = ap.parse_args()

    import workbench as wb

    import mlx.core as mx

    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    if args.skip_probe:
        import workbench.engine.scheduler as scheduler_module

        scheduler_module.probe = lambda *a, **k: ""
    model, tok = wb.load(args.model, dequantize=args.dtype != "native")
    if args.dtype != "native":
        model.set_dtype(getattr(mx, args.dtype))
    chat = getattr(tok, "chat_template", None) is not None
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        if chat
        else tok.encode(q)
        for q in QUESTIONS[: args.questions]
    ]  # a model without a template: the text
    engines = {
        "workbench default": {},
        "workbench fast_decode=False": {"fast_decode": False},
        "mlx-lm BatchGenerator": None,
        "workbench batch_invariant=True": {"batch_invariant": True},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    probe_says = wb.Scheduler(model, tok, max_batch=2).serial_reason
    print(f"construction probe: {probe_says or 'batches'}", flush=True)
    for name, kw in engines.items():
        t0 = time.perf_counter()
        alone = [_run(model, tok, [p], 1, 0, kw, args)[0] for p in prompts]
        for label, B, every in (
            ("at once", len(prompts), 0),
            ("staggered", args.staggered_batch, args.every),
        ):
            got = _run(model, tok, prompts, B, every, kw, args)
            tokens_eq = sum(g[0] == a[0] for g, a in zip(got, alone))
            bits_eq = sum(g == a for g, a in zip(got, alone)) if kw is not None else None
            line = {
                "engine": name,
                "schedule": label,
                "rows": len(prompts),
                "tokens_equal": tokens_eq,
                "bits_equal": bits_eq,
                "device": args.device,
                "dtype": args.dtype,
                "model": args.model,
                "mlx": mx.__version__,
            }
            rows.append(line)
            print(
                f"{name:32s} {label:9s}: tokens equal to alone {tokens_eq}/{len(prompts)}"
                + (
                    f", tokens and log-probs bit-equal {bits_eq}/{len(prompts)}"
                    if bits_eq is not None
                    else ""
                ),
                flush=True,
            )
            with out.open("a") as f:
                f.write(json.dumps(line) + "\n")
        print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)


def _run(model, tok, prompts, max_batch, every, kw, args):
    """``[(tokens, log-probs)]`` per prompt (log-probs ``None`` for mlx-lm)."""
    import workbench as wb

    if kw is None:
        from workbench.bench.engines import Arrival, MlxLmEngine, drive

        eng = MlxLmEngine(model, max_batch=max_batch, prefill_step_size=args.prefill_step_size)
        drive(
            eng,
            [
                Arrival(tuple(p), args.max_tokens, at_s=0.0, at_iteration=every * i)
                for i, p in enumerate(prompts)
            ],
        )
        eng.close()
        toks: dict = {}
        for e in eng.events:
            if e.kind == "token":
                toks.setdefault(e.uid, []).append(e.token)
        return [(toks[u], None) for u in sorted(toks)]
    sched = wb.Scheduler(model, tok, max_batch=max_batch, prefill_step_size=args.prefill_step_size, **kw)
    reqs = [wb.Request(prompt=list(p), max_tokens=args.max_tokens, stop_ids=[]) for p in prompts]
    sched.run(arrivals=[(every * i, r) for i, r in enumerate(reqs)])
    return [(sched.tokens(u), sched.logprobs(u)) for u in sorted(sched.requests)]


if __name__ == "__main__":
    main()
