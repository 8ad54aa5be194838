"""How many graph nodes one decode step hands MLX, per layout (issue 40: on an H100 the step is
host-bound at every B, so its cost is the nodes MLX dispatches and the Python that builds them).

A node is one primitive of the step's lazy graph (``mx.export_to_dot``'s labelled boxes: a
matmul, a gather, a reshape); MLX visits each once per step, and each one that runs launches
a kernel on the GPU. The count does not depend on the model's width, so a 16-layer llama of
tiny width (:data:`TINY_16`, the 1B-shaped llama's depth, head dim and GQA) counts what the
1B-shaped one does.

Knows: MLX's two evaluation calls, a benchmark engine's ``submit`` / ``iterate`` / ``idle``
(:mod:`workbench.bench.engines`), and for :func:`cuda_stand_in` which functions of
:mod:`workbench.engine.packed.cuda_attention` launch the packed CUDA kernel.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx

from .engines import Arrival
from .gpu import GPU_QUICK_CONFIG, GpuBenchConfig, prompt_lengths
from .host_time import wrapped_evals
from .model import ModelShape

# The 1B-shaped llama (workbench.bench.gpu.LLAMA_1B: 16 layers, 8 KV heads of dim 64, tied
# read-out) at 1/4 of its width: 8 query heads (the 1B's 32 share each KV head by 4; the graph
# is the same), MLP 2x, a small vocabulary. Its KV heads are the 1B's: the CUDA kernel's split
# plan counts rows x KV heads, and MLX's scatter treats a one-KV-head update otherwise.
TINY_16 = ModelShape.from_proportions(
    "llama-1b-tiny", 512, 16, 8, 4096, mlp_ratio=2, gqa=1, tie_word_embeddings=True
)
# The GPU benchmark's quick sizes (prompts of 16-64 tokens, prefill chunks of 128) on TINY_16.
STEP_CONFIG: GpuBenchConfig = dataclasses.replace(GPU_QUICK_CONFIG, name="step-nodes", shape=TINY_16)
_LABEL = re.compile(r'\[label ="([^"]+)"')
_EVAL = mx.eval  # MLX's own, whatever a caller wraps later


def graph_nodes(arrays: Sequence[mx.array]) -> collections.Counter:
    """Primitive name -> how many nodes of that kind the unevaluated graph of ``arrays`` holds
    (``mx.export_to_dot``; an evaluated array is a leaf and counts nothing)."""
    arrays = [a for a in arrays if isinstance(a, mx.array)]
    if not arrays:
        return collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.dot"
        mx.export_to_dot(str(path), *arrays)
        return collections.Counter(_LABEL.findall(path.read_text()))


@contextlib.contextmanager
def counted_evals(counts: collections.Counter) -> Iterator[collections.Counter]:
    """Within the block, each ``mx.async_eval`` / ``mx.eval`` call first waits for the work in
    flight (``mx.synchronize``: what it ran is then evaluated, and leaves) and adds its
    arguments' graph nodes to ``counts`` (:func:`graph_nodes`); MLX's functions are put back
    on exit. A graph evaluated implicitly (``tolist`` of an array no eval call started) is
    not counted."""

    def wrap(_: str, real: Any) -> Any:
        def call(*args: Any) -> Any:
            mx.synchronize()
            flat = [a for x in args for a in (x if isinstance(x, (list, tuple)) else [x])]
            counts.update(graph_nodes(flat))
            return real(*args)

        return call

    with wrapped_evals(wrap):
        yield counts


def step_nodes(engine: Any, arrivals: Sequence[Arrival], skip: int = 2) -> collections.Counter:
    """Submit ``arrivals`` to ``engine`` and iterate it until idle; returns the graph nodes
    (:func:`counted_evals`) of the full-batch decode iteration that follows ``skip`` others
    (an iteration that made ``len(arrivals)`` tokens after one that did), or an empty
    counter when there are not that many."""
    for a in arrivals:
        engine.submit(a.prompt, a.max_tokens)
    full, last, out = 0, 0, collections.Counter()
    while not engine.idle:
        if full == skip and last == len(arrivals):  # the next one should be full too
            counts: collections.Counter = collections.Counter()
            with counted_evals(counts):
                made = engine.iterate()
            if made == len(arrivals):
                out = counts
            full += 1
        else:
            made = engine.iterate()
            full += made == len(arrivals) and last == len(arrivals)
        last = made
    return out


def step_arrivals(
    tokenizer: Any, rows: int, new_tokens: int, cfg: GpuBenchConfig = STEP_CONFIG
) -> list[Arrival]:
    """``rows`` prompts of the GPU benchmark's lengths (``cfg``), ``new_tokens`` each."""
    from ..workloads.workload import prompt_of_length

    return [
        Arrival(tuple(prompt_of_length(tokenizer, n, start=97 * b)), new_tokens)
        for b, n in enumerate(prompt_lengths(cfg, rows))
    ]


FUSED_SDPA_HEAD_DIMS = (64, 96, 128, 256)  # MLX's CUDA sdpa_vector: one query, these head dims


def _leaf(shape: Sequence[int], dtype: mx.Dtype, cache: dict) -> mx.array:
    """Zeros ``shape`` ``dtype``, evaluated once (a leaf: no node in a graph)."""
    key = (tuple(shape), dtype)
    if key not in cache:
        cache[key] = mx.zeros(key[0], dtype)
        _EVAL(cache[key])
    return cache[key]


@contextlib.contextmanager
def cuda_like() -> Iterator[collections.Counter]:
    """Within the block, the engines build the graph they build on CUDA, on any device: the
    device answers ``"cuda"`` (``workbench.runtime.device.backend``: the padded layout's
    padded-rows kernel and the packed layout's paged kernel are chosen), and what MLX runs as
    one fused kernel there is one node (a ``Depends`` on its inputs, output zeros: the
    tokens are meaningless, the graph is CUDA's): the workbench's two CUDA kernels
    (``mx.fast.cuda_kernel`` launches), ``mx.fast.rms_norm``, ``mx.fast.rope``, and
    ``mx.fast.scaled_dot_product_attention`` where MLX's CUDA ``sdpa_vector`` serves it (one
    query, head dim in :data:`FUSED_SDPA_HEAD_DIMS`, no mask array; else MLX's own
    fallback ops, as on CUDA). Yields a counter of the stand-ins made, by name."""
    from ..engine.levers import padded_attention as pa
    from ..engine.packed import cuda_attention as ca
    from ..runtime import device

    made: collections.Counter = collections.Counter()
    zeros: dict = {}

    def one_node(name: str, inputs: Sequence[Any], shapes: Sequence, dtypes: Sequence) -> list[mx.array]:
        made[name] += 1
        outs = [_leaf(s, d, zeros) for s, d in zip(shapes, dtypes, strict=True)]
        return mx.depends(outs, [x for x in inputs if isinstance(x, mx.array)])

    def kernel(*_: Any) -> Any:
        def launch(inputs, output_shapes, output_dtypes, **__: Any) -> list[mx.array]:
            return one_node("cuda_kernel", inputs, output_shapes, output_dtypes)

        return launch

    fast = {k: getattr(mx.fast, k) for k in ("rms_norm", "rope", "scaled_dot_product_attention")}

    def rms_norm(x, weight, eps, **_: Any) -> mx.array:
        return one_node("rms_norm", [x, weight], [x.shape], [x.dtype])[0]

    def rope(x, dims, *, traditional, base, scale, offset, freqs=None, **_: Any) -> mx.array:
        return one_node("rope", [x, offset, freqs], [x.shape], [x.dtype])[0]

    def sdpa(q, k, v, *, scale, mask=None, sinks=None, **kw: Any) -> mx.array:
        D = q.shape[-1]
        if (
            q.shape[2] <= 1
            and D == v.shape[-1]
            and D in FUSED_SDPA_HEAD_DIMS
            and not isinstance(mask, mx.array)
        ):
            return one_node("sdpa", [q, k, v, sinks], [(*q.shape[:-1], D)], [q.dtype])[0]
        return fast["scaled_dot_product_attention"](q, k, v, scale=scale, mask=mask, sinks=sinks, **kw)

    saved = (device.backend, ca._kernel, ca._reduce_kernel, pa._kernel)
    device.backend = lambda: "cuda"
    ca._kernel, ca._reduce_kernel, pa._kernel = kernel, kernel, kernel
    mx.fast.rms_norm, mx.fast.rope, mx.fast.scaled_dot_product_attention = rms_norm, rope, sdpa
    try:
        yield made
    finally:
        device.backend, ca._kernel, ca._reduce_kernel, pa._kernel = saved
        for k, f in fast.items():
            setattr(mx.fast, k, f)
