"""The batch-invariant mode adds as little host work as its row blocks need: on a GPU a decode
step is host-bound (docs/gpu.md), so every graph node the mode adds costs time. Counted in the
graph MLX would run (``mx.export_to_dot``), with the CUDA bf16 blocks (``RowBlocks(2, ...)``: a
lone row padded to 2) stood in on the CPU."""

import collections
import re

import mlx.core as mx
import mlx.nn as nn
import pytest

from workbench.engine.levers import invariant
from workbench.engine.levers.invariant import RowBlocks, invariant_forward
from workbench.engine.levers.invariant_attention import starts_array


@pytest.fixture(autouse=True)
def _on_the_cpu():
    """These tests stand a GPU's blocks in on the CPU's kernels (on a GPU machine too)."""
    with mx.stream(mx.cpu):
        yield


def _primitives(tmp_path, *outputs) -> collections.Counter:
    path = tmp_path / "graph.dot"
    mx.export_to_dot(str(path), *outputs)
    return collections.Counter(re.findall(r'label ="([^"]+)"', path.read_text()))


class Block(nn.Module):
    """A llama block's projections as mlx-lm calls them: q / k / v read one ``x``, gate / up
    read one ``h``."""

    def __init__(self, K=64):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(K, K, bias=False) for _ in range(4))
        self.gate, self.up, self.down = (
            nn.Linear(K, 2 * K, bias=False),
            nn.Linear(K, 2 * K, bias=False),
            nn.Linear(2 * K, K, bias=False),
        )

    def __call__(self, x):
        a = self.o(self.q(x) + self.k(x) * self.v(x))
        return self.down(nn.silu(self.gate(a)) * self.up(a))


def _cuda_like(model):
    inv = invariant.Invariance(
        "cuda",
        {
            invariant.signature(m): RowBlocks(2, 8)
            for _, m in model.named_modules()
            if isinstance(m, nn.Linear)
        },
    )
    invariant.hooks_of(model, projections=True)
    return inv


def _hooked_forward(tmp_path, rows: int, seed: int):
    """A :class:`Block`'s forward over ``rows`` rows in the mode's hooks with the CUDA-like
    blocks: ``(model, inv, x, primitives of its graph)``."""
    model = Block()
    mx.eval(model.parameters())
    inv = _cuda_like(model)
    x = mx.random.normal((rows, 1, 64), key=mx.random.key(seed))
    mx.eval(x)
    with invariant_forward(model, inv, held=[0] * rows):
        y = model(x)
    return model, inv, x, _primitives(tmp_path, y)


def test_a_lone_row_is_padded_once_per_input_not_once_per_projection(tmp_path):
    model, inv, x, seen = _hooked_forward(tmp_path, 1, 1)
    # four inputs (x, a, the SwiGLU product ... and h read by gate / up): x -> q, k, v; the sum -> o;
    # a -> gate, up; the product -> down. Seven projections, four pads (ebb841a: seven, each with
    # a zeros array made anew)
    assert seen["Concatenate"] == 4, seen
    assert seen["Full"] + seen["Broadcast"] == 0, seen  # the zero rows are a kept constant
    # the bits are those of each projection padded on its own (k reads q's padded input)
    with invariant_forward(model, inv, held=[0]):
        shared = [model.q(x), model.k(x)]
    for got, m in zip(shared, (model.q, model.k)):
        alone = invariant.blocked(lambda b, m=m: nn.Linear.__call__(m, b), x, RowBlocks(2, 8))
        assert mx.array_equal(got, alone).item()


def test_a_call_within_the_blocks_runs_as_it_is(tmp_path):
    seen = _hooked_forward(tmp_path, 5, 2)[3]
    assert seen["Concatenate"] == 0 and seen["Slice"] == 0, seen
    assert seen["Matmul"] == 7


def test_rows_over_the_blocks_still_split_and_pad_the_last_block():
    f = lambda b: b * 2.0  # noqa: E731
    x = mx.arange(22, dtype=mx.float32).reshape(11, 2)
    calls = []
    y = invariant.blocked(lambda b: calls.append(b.shape[0]) or f(b), x, RowBlocks(4, 8))
    assert calls == [8, 4] and mx.array_equal(y, f(x)).item()


def test_every_layer_of_a_forward_attends_from_one_starts_array():
    a, b = starts_array([3, 0, 5]), starts_array([3, 0, 5])
    assert a is b and a.tolist() == [3, 0, 5] and a.dtype == mx.int32
    assert starts_array([3, 0, 6]).tolist() == [3, 0, 6]


def test_zero_rows_are_shared_only_once_evaluated(monkeypatch):
    """A zeros array another thread's forward may take from the shared cache is evaluated
    before it is put there (5421f89 put it there first, then evaluated it: two threads could
    evaluate one array at once)."""
    monkeypatch.setattr(invariant, "_ZERO_ROWS", {})
    real, published_at_eval = mx.eval, []

    def eval_(*args):
        published_at_eval.append(bool(invariant._ZERO_ROWS))
        return real(*args)

    monkeypatch.setattr(mx, "eval", eval_)
    z = invariant.zero_rows(3, 5, mx.bfloat16)
    assert published_at_eval == [False]
    assert invariant.zero_rows(3, 5, mx.bfloat16) is z and published_at_eval == [False]
    assert z.shape == (3, 5) and z.dtype == mx.bfloat16 and not mx.any(z).item()
