"""The packed decode step's graph against the padded step's (issue 40: on an H100 both steps are
host-bound, so a step costs the nodes MLX dispatches). Counted on the 16-layer tiny llama
(``workbench.bench.step_nodes.TINY_16``), one full-batch decode iteration each, as
``scripts/lab/step_nodes.py`` counts them: the graph CUDA gets (:func:`cuda_like`) and the
CPU's own. Deterministic: node counts, no timings.

Counts at 1601965 (the code before this change; equal to ebb841a's): CUDA's graph, packed /
padded 935 / 822 at B = 1 and 1,015 / 790 at B = 8; the CPU's, 2,262 / 2,096 and 2,311 / 2,220.
"""

from __future__ import annotations

import contextlib

import pytest

from workbench.bench.gpu_packed import PACKED, PADDED, engine_makers
from workbench.bench.model import make_model
from workbench.bench.step_nodes import STEP_CONFIG, cuda_like, step_arrivals, step_nodes
from workbench.runtime.loading import load

LAYERS = STEP_CONFIG.shape.num_hidden_layers


@pytest.fixture(scope="module")
def count():
    """``(layout, B, cuda) -> nodes`` of one full-batch decode iteration."""
    model, tokenizer = make_model(STEP_CONFIG.shape), load()[1]
    makers = engine_makers(model, tokenizer, STEP_CONFIG)
    seen = {}

    def nodes(layout: str, B: int, cuda: bool) -> int:
        if (layout, B, cuda) not in seen:
            with cuda_like() if cuda else contextlib.nullcontext():
                engine = makers[layout](B)
                seen[layout, B, cuda] = sum(step_nodes(engine, step_arrivals(tokenizer, B, 6)).values())
                engine.close()
        return seen[layout, B, cuda]

    return nodes


def test_on_cuda_one_packed_row_takes_no_more_nodes_than_one_padded_row(count):
    """B = 1, CUDA's graph: the decode rows attend by the paged kernel with no ``[1, T]``
    transposes, and the one row writes at a scalar slot (was 935 against 822)."""
    assert 0 < count(PACKED, 1, True) <= count(PADDED, 1, True)


def test_on_cuda_eight_packed_rows_take_at_most_three_nodes_a_layer_more_than_padded_ones(count):
    """B = 8, CUDA's graph: 836 against 790 here (was 1,015). What is left, per layer: the
    scatter's two reshapes for each of the key and value writes against the padded layout's
    slice updates, and the split kernel's reduce (rows x KV heads below its block target)."""
    packed, padded = count(PACKED, 8, True), count(PADDED, 8, True)
    assert 0 < packed - padded <= 3 * LAYERS


def test_on_the_cpu_the_packed_step_takes_at_most_seven_nodes_a_layer_more_than_padded(count):
    """The CPU's own graph (MLX's fast ops as their fallback ops, the decode rows' pool gathers):
    B = 1, 2,198 against 2,096 here (was 2,262); B = 8, 2,311 against 2,220 (as it was). Per
    layer the packed step gathers each row's keys and values from the pools (a reshape, a
    gather and a squeeze each) where the padded one slices its buffers."""
    for B in (1, 8):
        packed, padded = count(PACKED, B, False), count(PADDED, B, False)
        assert 0 < packed - padded <= 7 * LAYERS, (B, packed, padded)
