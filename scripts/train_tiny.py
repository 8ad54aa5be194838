"""Train the bundled default model, ``data/models/tiny-code``, on CPython's stdlib sources.

CPU only, fixed seeds, with MLX (``mlx.nn``, ``mlx.optimizers``) and mlx-lm's own
``llama.Model``, so the folder loads with ``mlx_lm.load`` like any downloaded model.

Steps: (1) the corpus of ``stdlib_corpus.py`` with its held-out files; (2) a byte-level
BPE of ``VOCAB_SIZE`` tokens trained on the training files; (3) each file tokenized and
followed by EOS, the files concatenated into one stream cut into blocks of
``BLOCK_TOKENS + 1`` tokens, visited in a seeded random order, ``BATCH_BLOCKS`` blocks a
step; until the last ``LONG_FRACTION`` of training every block is split into two windows
of ``BLOCK_TOKENS / 2`` (cheaper attention), then whole ``BLOCK_TOKENS`` windows train
every position of the context; (4) AdamW, linear warmup then cosine decay over the
training's *progress*: the step fraction of ``STEPS``, or the fraction of the
``MAX_TRAIN_S`` budget when the machine is too slow (or too busy) for all steps; then the
schedule still anneals, and the run ends in time after fewer steps (the README says
which); (5) held-out perplexity on whole blocks of the held-out files; (6) the model
folder with a README of measured numbers, and the loss curve PNG.

Run with an optimized BLAS: MLX's Linux CPU wheel links a slow reference BLAS, and the
script's first import, ``workbench``, loads OpenBLAS before mlx where it is installed::

    apt-get install -y libopenblas0-pthread
    python scripts/train_tiny.py

Axis letters: ``B`` windows in a batch, ``S`` window length (tokens), ``V`` vocabulary.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from importlib.metadata import version
from pathlib import Path

import workbench  # noqa: F401  first: it loads an optimized BLAS before mlx (workbench/runtime/blas.py)
from model_folder import EOS, train_bpe, write_model_folder
from stdlib_corpus import HELD_OUT_EVERY, Corpus, stdlib_corpus

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parent.parent
SEED = 0
VOCAB_SIZE = 4096
BLOCK_TOKENS = 512
BATCH_BLOCKS = 2
LONG_FRACTION = 0.15
STEPS = 4000
WARMUP_STEPS = 50
PEAK_LR = 3e-3
FINAL_LR = 3e-4
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
EVAL_EVERY_STEPS = 250
EVAL_BLOCKS_DURING = 16
MAX_TRAIN_S = 24 * 60

# Sized for little compute: a narrow body (few FLOPs per token) and an untied input
# embedding (parameters that cost a lookup, not a matmul). Measured on 410k training tokens
# (same seed, lr 3e-3): this shape with 1024-token steps reached held-out loss 4.84 with
# 182 CPU-seconds, a tied hidden-192 4-layer model (2.4 M parameters) 4.86 with 262, and the
# same with 2048-token steps 4.97; so small steps, and fewer FLOPs per token, win here.
TINY_CODE = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_hidden_layers": 5,
    "intermediate_size": 352,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-5,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": BLOCK_TOKENS,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def token_stream(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """``[N]`` int32 ids: each text's tokens followed by EOS, texts in order."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids += enc.ids + [eos]
    return np.array(ids, dtype=np.int32)


def blocks_of(stream: np.ndarray) -> np.ndarray:
    """``[N_blocks, BLOCK_TOKENS + 1]``: block ``i`` is ``stream[i*BLOCK_TOKENS :][:BLOCK_TOKENS + 1]``
    (consecutive blocks share one token: the last target of one is the first input of the next)."""
    n = (len(stream) - 1) // BLOCK_TOKENS
    return np.stack([stream[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS + 1] for i in range(n)])


def windows(blocks: np.ndarray, long: bool) -> np.ndarray:
    """The batch of a step from ``[b, BLOCK_TOKENS + 1]`` blocks: the blocks themselves when
    ``long``, else each block as two windows of ``BLOCK_TOKENS / 2 + 1`` -> ``[2b, 257]``."""
    if long:
        return blocks
    half = BLOCK_TOKENS // 2
    return np.concatenate([blocks[:, : half + 1], blocks[:, half:]])


def progress(step: int, steps: int, elapsed_s: float, max_train_s: float) -> float:
    """How far training is, in [0, 1]: the larger of the step and the time fraction.

    On a machine fast enough to do ``steps`` steps within ``max_train_s`` it is the step
    fraction, so the run is deterministic; on a slower (or shared) machine the clock takes
    over and the schedule still anneals and ends within the budget, after fewer steps.
    """
    return min(1.0, max(step / steps, elapsed_s / max_train_s))


def learning_rate(step: int, done: float) -> float:
    """Linear warmup to ``PEAK_LR`` over the first ``WARMUP_STEPS`` steps, then cosine
    from ``PEAK_LR`` to ``FINAL_LR`` as progress ``done`` goes from 0 to 1."""
    if step < WARMUP_STEPS:
        return PEAK_LR * (step + 1) / WARMUP_STEPS
    return FINAL_LR + 0.5 * (PEAK_LR - FINAL_LR) * (1 + math.cos(math.pi * done))


def loss_fn(model: nn.Module, batch: mx.array) -> mx.array:
    """Mean next-token cross entropy (nats/token) of a ``[B, S + 1]`` batch."""
    logits = model(batch[:, :-1])  # [B, S, V]
    return nn.losses.cross_entropy(logits, batch[:, 1:], reduction="mean")


def held_out_loss(model: nn.Module, blocks: np.ndarray, batch_blocks: int = 8) -> float:
    """Mean cross entropy (nats/token) over ``[n, BLOCK_TOKENS + 1]`` blocks, whole windows."""
    total, n = 0.0, 0
    for i in range(0, len(blocks), batch_blocks):
        chunk = mx.array(blocks[i : i + batch_blocks])
        total += loss_fn(model, chunk).item() * chunk.shape[0]
        n += chunk.shape[0]
    return total / n


@dataclass
class History:
    """Per-step train loss (nats/token), the held-out evaluations ``(step, loss)`` and the
    first step on whole ``BLOCK_TOKENS`` windows (``None`` if never reached)."""

    train_loss: list[float] = field(default_factory=list)
    held_out: list[tuple[int, float]] = field(default_factory=list)
    long_from_step: int | None = None


def train(
    model: nn.Module,
    train_blocks: np.ndarray,
    eval_blocks: np.ndarray,
    steps: int,
    max_train_s: float,
    log=print,
) -> tuple[History, float]:
    """Train ``model`` in place until :func:`progress` reaches 1: after ``steps`` steps, or
    earlier when the training time (held-out evaluations included) reaches ``max_train_s``.

    Returns the history (its ``train_loss`` has one entry per step done) and the training
    wall time in seconds.
    """
    rng = np.random.default_rng(SEED)
    epochs = -(-steps * BATCH_BLOCKS // len(train_blocks))  # a fresh permutation per epoch
    order = np.concatenate([rng.permutation(len(train_blocks)) for _ in range(epochs)])
    opt = optim.AdamW(learning_rate=learning_rate(0, 0.0), betas=[0.9, 0.95], weight_decay=WEIGHT_DECAY)
    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(batch):
        loss, grads = loss_and_grad(model, batch)
        grads, _ = optim.clip_grad_norm(grads, GRAD_CLIP)
        opt.update(model, grads)
        return loss

    hist = History()
    t0 = time.perf_counter()
    done = 0.0
    for s in range(steps):
        long = done >= 1 - LONG_FRACTION
        if long and hist.long_from_step is None:
            hist.long_from_step = s
        opt.learning_rate = learning_rate(s, done)
        idx = order[s * BATCH_BLOCKS : (s + 1) * BATCH_BLOCKS]
        loss = step(mx.array(windows(train_blocks[idx], long)))
        mx.eval(state, loss)
        hist.train_loss.append(loss.item())
        if (s + 1) % EVAL_EVERY_STEPS == 0:
            hist.held_out.append((s + 1, held_out_loss(model, eval_blocks)))
            log(
                f"step {s + 1}/{steps}  train {np.mean(hist.train_loss[-20:]):.3f}  held-out "
                f"{hist.held_out[-1][1]:.3f}  lr {opt.learning_rate.item():.2e}  "
                f"{time.perf_counter() - t0:.0f} s"
            )
        done = progress(s + 1, steps, time.perf_counter() - t0, max_train_s)
        if done >= 1.0:
            break
    n = len(hist.train_loss)
    if not hist.held_out or hist.held_out[-1][0] != n:
        hist.held_out.append((n, held_out_loss(model, eval_blocks)))
    train_s = time.perf_counter() - t0
    log(
        f"trained {n} of {steps} steps in {train_s:.0f} s "
        f"({'all steps' if n == steps else 'time budget reached'})"
    )
    return hist, train_s


def plot_loss(hist: History, path: Path) -> None:
    """Train loss (raw and 20-step mean) and held-out loss against step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    loss = np.array(hist.train_loss)
    ax.plot(np.arange(1, len(loss) + 1), loss, color="0.8", lw=0.8, label="train (per step)")
    smooth = np.convolve(loss, np.ones(20) / 20, mode="valid")
    ax.plot(np.arange(20, len(loss) + 1), smooth, color="C0", label="train (20-step mean)")
    steps, held = zip(*hist.held_out)
    ax.plot(steps, held, "o-", color="C3", label="held-out")
    if hist.long_from_step is not None:
        ax.axvline(hist.long_from_step, color="0.5", ls=":", lw=1)
        ax.text(
            hist.long_from_step,
            ax.get_ylim()[1],
            f" {BLOCK_TOKENS}-token windows",
            va="top",
            fontsize=8,
            color="0.4",
        )
    ax.set(xlabel="step", ylabel="cross entropy (nats/token)", title="tiny-code training loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def write_readme(out: Path, facts: dict) -> None:
    """The model card: what the model is, how it was made, and its measured numbers."""
    f = facts
    c = TINY_CODE
    stop = (
        "all steps of the schedule"
        if f["steps_done"] == f["steps_max"]
        else f"of at most {f['steps_max']}: the {f['max_train_s'] / 60:.0f}-minute training budget ended the schedule"
    )
    text = f"""# tiny-code

The batching workbench's default model: mlx-lm's `llama` architecture trained from scratch on
CPython {f["python"]}'s standard-library sources. Small enough to bundle and to train on a
laptop CPU; big enough that greedy decoding is legible Python-like text and rarely ties.
Made by `python scripts/train_tiny.py` (see its docstring); every number below is measured
by that run.

| | |
| --- | --- |
| parameters | {f["n_params"]:,} (float32, {f["weights_bytes"] / 1e6:.1f} MB; input embedding and output projection {"tied" if c["tie_word_embeddings"] else "untied"}) |
| shape | {c["num_hidden_layers"]} layers, hidden {c["hidden_size"]}, MLP {c["intermediate_size"]}, {c["num_attention_heads"]} heads of {c["head_dim"]} ({c["num_key_value_heads"]} KV heads), RoPE |
| context | {c["max_position_embeddings"]} tokens (`max_position_embeddings`) |
| tokenizer | byte-level BPE, {VOCAB_SIZE} tokens, EOS `{EOS}` (id 0), trained on the training files |
| corpus | {f["n_train_files"]} stdlib `*.py` files, {f["train_bytes"]:,} bytes, {f["train_tokens"]:,} tokens (see `scripts/stdlib_corpus.py`) |
| held out | every {HELD_OUT_EVERY}th file of the sorted list: {f["n_held_files"]} files, {f["held_tokens"]:,} tokens |
| training | {f["steps_done"]} steps of {BATCH_BLOCKS * BLOCK_TOKENS} tokens ({f["tokens_seen"]:,} tokens, {f["epochs"]:.2f} epochs; {stop}); AdamW, lr {PEAK_LR} after {WARMUP_STEPS} warmup steps, cosine to {FINAL_LR}; {BLOCK_TOKENS // 2}-token windows, {BLOCK_TOKENS}-token windows from step {f["long_from_step"]} |
| training time | {f["train_s"] / 60:.1f} min on {f["machine"]} (whole script {f["total_s"] / 60:.1f} min) |
| final train loss | {f["final_train_loss"]:.3f} nats/token (mean of the last 20 steps) |
| held-out perplexity | **{f["held_ppl"]:.2f}** (cross entropy {f["held_loss"]:.3f} nats/token over {f["held_eval_tokens"]:,} tokens, {BLOCK_TOKENS}-token windows) |
| near-ties | {f["margins"]} — greedy, demo workload (`workbench margins`) |
| versions | Python {f["python"]}, mlx {version("mlx")}, mlx-lm {version("mlx-lm")}, tokenizers {version("tokenizers")}; seed {SEED} |

Loss curve: `docs/tiny-code-loss.png`. The corpus differs between CPython versions, so
another Python rebuilds a slightly different model; the bundled one is the one above.
"""
    (out / "README.md").write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "data" / "models" / "tiny-code")
    parser.add_argument("--plot", type=Path, default=REPO / "docs" / "tiny-code-loss.png")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument(
        "--max-train-s",
        type=float,
        default=MAX_TRAIN_S,
        help="stop early when training has run this long (seconds)",
    )
    args = parser.parse_args()
    t_start = time.perf_counter()
    mx.set_default_device(mx.cpu)
    mx.random.seed(SEED)
    corpus: Corpus = stdlib_corpus()
    train_texts = corpus.texts(corpus.train_files)
    tok = train_bpe(train_texts, VOCAB_SIZE)
    train_stream = token_stream(tok, train_texts)
    held_stream = token_stream(tok, corpus.texts(corpus.held_out_files))
    train_blocks, held_blocks = blocks_of(train_stream), blocks_of(held_stream)
    pick = np.linspace(0, len(held_blocks) - 1, EVAL_BLOCKS_DURING).round().astype(int)
    print(
        f"corpus: {len(corpus.train_files)} train files, {len(train_stream):,} tokens; "
        f"{len(corpus.held_out_files)} held-out files, {len(held_stream):,} tokens",
        flush=True,
    )

    model = llama.Model(llama.ModelArgs.from_dict(TINY_CODE))
    mx.eval(model.parameters())
    hist, train_s = train(
        model,
        train_blocks,
        held_blocks[pick],
        args.steps,
        args.max_train_s,
        log=lambda s: print(s, flush=True),
    )
    held_loss = held_out_loss(model, held_blocks)

    weights = dict(tree_flatten(model.parameters()))
    n_params = write_model_folder(args.out, TINY_CODE, weights, tok)
    plot_loss(hist, args.plot)
    steps_done = len(hist.train_loss)

    sys.path.insert(0, str(REPO))
    from workbench import load
    from workbench.verify.margins import demo_margins

    margins = demo_margins(*load(args.out))
    facts = dict(
        python=platform.python_version(),
        n_params=n_params,
        weights_bytes=(args.out / "model.safetensors").stat().st_size,
        n_train_files=len(corpus.train_files),
        train_bytes=corpus.n_bytes(corpus.train_files),
        train_tokens=len(train_stream),
        n_held_files=len(corpus.held_out_files),
        held_tokens=len(held_stream),
        steps_done=steps_done,
        steps_max=args.steps,
        long_from_step=hist.long_from_step,
        max_train_s=args.max_train_s,
        tokens_seen=steps_done * BATCH_BLOCKS * BLOCK_TOKENS,
        epochs=steps_done * BATCH_BLOCKS / len(train_blocks),
        train_s=train_s,
        machine=f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores",
        final_train_loss=float(np.mean(hist.train_loss[-20:])),
        held_loss=held_loss,
        held_ppl=math.exp(held_loss),
        held_eval_tokens=len(held_blocks) * BLOCK_TOKENS,
        margins=margins.text(),
        total_s=time.perf_counter() - t_start,
    )
    write_readme(args.out, facts)
    print(f"held-out perplexity {facts['held_ppl']:.2f}; {margins.text()}")
    print(f"wrote {args.out} and {args.plot} in {facts['total_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
