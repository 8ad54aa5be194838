"""Make the two bundled LoRA adapters of ``data/models/tiny-code``: ``prose`` and ``numbers``.

Each is a few steps of mlx-lm's own LoRA training (``python -m mlx_lm lora --train``, the
``mlx_lm.lora`` trainer, unchanged) on a small text set this script writes from a seed:

- ``prose``: English sentences from templates (``The quiet river carries the old map
  past the harbour.``); rank 8, every Linear of all 5 layers (mlx-lm's default keys).
- ``numbers``: lines of numbers (counting runs, sums, products: ``12 + 7 = 19``); rank 4,
  only ``self_attn.q_proj``, ``self_attn.v_proj`` and ``mlp.down_proj`` of the last 3
  layers.

So the two differ in what they write (English vs digits) and in their shapes (rank, target
layers), which is what per-row adapters in one batch must handle. The base model writes
Python-like text. Each adapter folder holds mlx-lm's ``adapter_config.json`` and
``adapters.safetensors`` (the format ``mlx_lm.load(..., adapter_path=...)`` reads) and the
``train/`` text it learned (``train.jsonl``, ``valid.jsonl``).

Usage (from the repository root; 79 s of CPU time for both, 3 min 12 s of wall time on 2
cores shared with other jobs)::

    python scripts/make_adapters.py [--iters 100] [--out data/adapters]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

MODEL = "data/models/tiny-code"
SEED = 0

ADJECTIVES = ["quiet", "old", "bright", "small", "green", "tired", "gentle", "cold", "busy", "golden"]
NOUNS = ["river", "teacher", "garden", "village", "child", "boat", "letter", "forest", "baker", "window"]
OBJECTS = [
    "the old map",
    "a warm loaf",
    "the morning light",
    "a long song",
    "the last letter",
    "a basket of apples",
    "the open door",
    "a quiet story",
]
VERBS = ["carries", "finds", "remembers", "watches", "follows", "keeps", "brings", "shares"]
PLACES = [
    "past the harbour",
    "under the bridge",
    "across the field",
    "into the evening",
    "along the road",
    "beside the hill",
    "through the town",
    "before the rain",
]


def prose_lines(n: int, rng: random.Random) -> list[str]:
    """``n`` short English paragraphs of two or three template sentences each."""

    def sentence() -> str:
        return (
            f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} "
            f"{rng.choice(OBJECTS)} {rng.choice(PLACES)}."
        )

    return [" ".join(sentence() for _ in range(rng.randint(2, 3))) for _ in range(n)]


def number_lines(n: int, rng: random.Random) -> list[str]:
    """``n`` lines of numbers: a counting run, a sum, or a product table row."""
    out = []
    for _ in range(n):
        kind = rng.randrange(3)
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        if kind == 0:
            step = rng.randint(1, 5)
            out.append(" ".join(str(a + step * i) for i in range(10)))
        elif kind == 1:
            out.append(" ".join(f"{a + i} + {b} = {a + i + b}" for i in range(4)))
        else:
            out.append(" ".join(f"{a} x {i} = {a * i}" for i in range(1, 6)))
    return out


ADAPTERS = {
    # name: (lines, rank, scale, num_layers, keys or None for mlx-lm's default: every Linear)
    "prose": (prose_lines, 8, 10.0, 5, None),
    "numbers": (number_lines, 4, 10.0, 3, ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"]),
}


def write_data(folder: Path, lines: list[str]) -> None:
    """``train.jsonl`` (all but the last 16 lines) and ``valid.jsonl`` (the last 16) of
    ``{"text": line}`` records, the layout ``mlx_lm lora --data`` reads."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", lines[:-16]), ("valid", lines[-16:])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part))


def train(name: str, out: Path, iters: int) -> float:
    """Write ``name``'s text set and run mlx-lm's LoRA trainer on it. Returns seconds."""
    make_lines, rank, scale, num_layers, keys = ADAPTERS[name]
    folder = out / name
    write_data(folder / "train", make_lines(400, random.Random(f"{SEED}-{name}")))
    lora = {"rank": rank, "scale": scale, "dropout": 0.0}
    if keys is not None:
        lora["keys"] = keys
    config = folder / "train" / "lora.json"  # YAML is a superset of JSON: mlx_lm's -c reads it
    config.write_text(json.dumps({"lora_parameters": lora}, indent=2) + "\n")
    cmd = [
        sys.executable,
        "-m",
        "mlx_lm",
        "lora",
        "--model",
        MODEL,
        "--train",
        "--data",
        str(folder / "train"),
        "--adapter-path",
        str(folder),
        "--num-layers",
        str(num_layers),
        "--batch-size",
        "8",
        "--iters",
        str(iters),
        "--learning-rate",
        "2e-3",
        "--steps-per-report",
        "25",
        "--steps-per-eval",
        str(iters),
        "--val-batches",
        "2",
        "--save-every",
        str(iters + 1),
        "--max-seq-length",
        "128",
        "--seed",
        str(SEED),
        "-c",
        str(config),
    ]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def main() -> None:
    """Train both adapters and print each one's training time and file size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=100, help="training steps per adapter")
    parser.add_argument("--out", default="data/adapters", help="folder of the adapter folders")
    args = parser.parse_args()
    for name in ADAPTERS:
        seconds = train(name, Path(args.out), args.iters)
        size = (Path(args.out) / name / "adapters.safetensors").stat().st_size
        print(f"{name}: {args.iters} steps in {seconds:.1f} s, adapters.safetensors {size:,} bytes")


if __name__ == "__main__":
    main()
