"""The batch-invariant mode's fused projections (``levers/invariant_fuse.py``): siblings that
read one input run as one matmul, every row still bit-equal to its run alone. Fusion is on on
every backend by default (``FUSE_BACKENDS``); these tests turn it on for the CPU explicitly, and
one turns it off."""

import collections
import re

import mlx.core as mx
import mlx.nn as nn
import pytest

from tests.engine.test_invariant import CHUNK, _model, _requests, _run
from workbench.bench.invariance_cost import _prefilled, _scheduler, prompts_of
from workbench.engine.levers import invariant, invariant_fuse, lora
from workbench.engine.levers.invariant import Invariance, RowBlocks, invariant_forward
from workbench.verify import invariance


@pytest.fixture(autouse=True)
def _on_the_cpu():
    """These tests stand a GPU's fusion in with the CPU's kernels (turned on by ``fusing``), on a
    GPU machine too: the CPU device. On CUDA, fusion is checked by ``test_invariant_gpu_range``'s
    96-row test and ``scripts/lab/invariant_fuse_ab.py`` (docs/gpu.md)."""
    with mx.stream(mx.cpu):
        yield


@pytest.fixture
def fusing(monkeypatch):
    """Fusion on for the CPU (off by default)."""
    monkeypatch.setattr(invariant_fuse, "FUSE_BACKENDS", ("cpu",))


class Attn(nn.Module):
    def __init__(self, K, k_first):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(K, K, bias=False) for _ in range(4))
        self.k_first = k_first

    def __call__(self, x):
        if self.k_first:  # a model calling k before q
            k = self.k_proj(x)
            q = self.q_proj(x)
        else:
            q, k = self.q_proj(x), self.k_proj(x)
        return self.o_proj(q * k + self.v_proj(x))  # o_proj: same kind and K, another input


class MLP(nn.Module):
    def __init__(self, K):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(K, 2 * K), nn.Linear(K, 2 * K)
        self.down_proj = nn.Linear(2 * K, K)

    def __call__(self, x):
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Toy(nn.Module):
    """Token ids ``[B, L]`` -> ``[B, L, K]``: an embedding, q / k / v and gate / up."""

    def __init__(self, K=32, k_first=False):
        super().__init__()
        self.embed = nn.Embedding(50, K)
        self.attn, self.mlp = Attn(K, k_first), MLP(K)

    def __call__(self, tokens):
        h = self.embed(tokens)
        return self.mlp(h + self.attn(h))


def _matmuls(tmp_path, out) -> int:
    path = tmp_path / "graph.dot"
    mx.export_to_dot(str(path), out)
    labels = collections.Counter(re.findall(r'label ="([^"]+)"', path.read_text()))
    return sum(n for label, n in labels.items() if "Matmul" in label or label == "AddMM")


def _mode(model, tokens, inv):
    with invariant_forward(model, inv, ()):
        return model(tokens)


@pytest.mark.parametrize("k_first", [False, True])
def test_siblings_reading_one_input_are_found_whatever_their_call_order(fusing, k_first):
    model = Toy(k_first=k_first)
    found = {(type(p).__name__, names) for p, names in invariant_fuse.sibling_groups(model)}
    qkv = ("k_proj", "q_proj", "v_proj") if k_first else ("q_proj", "k_proj", "v_proj")
    assert found == {("Attn", qkv), ("MLP", ("gate_proj", "up_proj"))}  # not o_proj, not down_proj


def test_a_projection_wrapped_by_an_adapter_stays_out_of_its_group():
    model = Toy()
    lora.wrap_layers(model, ["attn.q_proj"])
    found = {names for _, names in invariant_fuse.sibling_groups(model)}
    assert found == {("k_proj", "v_proj"), ("gate_proj", "up_proj")}


@pytest.mark.parametrize("k_first", [False, True])
def test_fused_projections_give_each_member_its_columns_in_fewer_matmuls(fusing, tmp_path, k_first):
    model = Toy(k_first=k_first)
    tokens = mx.array([[3], [7], [11]])
    blocks = {
        invariant.signature(m): RowBlocks(4, 4) for _, m in model.named_modules() if isinstance(m, nn.Linear)
    }
    plain = _mode(model, tokens, Invariance("cpu", blocks))  # no groups: each projection alone
    assert _matmuls(tmp_path, plain) == 7  # before evaluation: the graph's nodes
    inv = Invariance.calibrate(model)
    assert len(inv.fused) == 5
    fused = _mode(model, tokens, inv)
    assert _matmuls(tmp_path, fused) == 4
    assert mx.allclose(fused, plain, atol=1e-5).item()  # each member got its own columns
    for b in range(3):  # each row bit-equal to its run alone, fused
        assert mx.array_equal(fused[b], _mode(model, tokens[b : b + 1], inv)[0]).item()


def test_fusion_keeps_the_default_path_bits_and_adds_no_memory(fusing):
    model = Toy(K=256)
    tokens = mx.array([[1, 2, 3], [4, 5, 6]])
    before = model(tokens)
    mx.eval(before, model.parameters())
    held = mx.get_active_memory()
    groups = invariant_fuse.fuse(model)
    mx.eval(model.parameters())
    fused_bytes = sum(g.module["weight"].nbytes for g in groups)  # 1.75 MiB of the 2.6 MiB of weights
    assert mx.get_active_memory() - held < fused_bytes / 10  # members are rows of the fused arrays
    assert model.attn.k_proj.weight.shape == (256, 256)
    assert mx.array_equal(model(tokens), before).item()
    assert invariant_fuse.fuse(model)[0] is groups[0]  # kept on the parent: a second scheduler reuses it


def test_a_member_whose_weights_were_replaced_runs_on_its_own(fusing):
    model = Toy()
    tokens = mx.array([[3], [7]])
    inv = Invariance.calibrate(model)
    stale = _mode(model, tokens, inv)
    model.attn.v_proj.weight = mx.zeros_like(model.attn.v_proj.weight)
    out = _mode(model, tokens, inv)
    mlp_only = {k: v for k, v in inv.fused.items() if v[0].members[0] is model.mlp.gate_proj}
    assert len(mlp_only) == 2
    assert mx.array_equal(out, _mode(model, tokens, Invariance("cpu", inv.blocks, mlp_only))).item()
    assert not mx.allclose(out, stale).item()  # the new v_proj counted: q / k / v each alone


def test_with_fusion_off_nothing_is_fused_or_rebound(monkeypatch):
    monkeypatch.setattr(invariant_fuse, "FUSE_BACKENDS", ())
    model = Toy()
    weights = [m.weight for _, m in model.named_modules() if isinstance(m, nn.Linear)]
    inv = Invariance.calibrate(model)
    assert inv.fused == {}
    assert all(m.weight is w for m, w in zip(_linears(model), weights))
    assert not any(invariant_fuse.FUSED in m.__dict__ for _, m in model.named_modules())


def test_each_fused_shape_gets_its_own_calibrated_row_blocks(fusing):
    model = Toy()
    inv = Invariance.calibrate(model)
    groups = {id(g): g for g, _ in inv.fused.values()}.values()
    assert len(groups) == 2
    for group in groups:
        assert invariant.signature(group.module) in inv.blocks
        assert invariant.signature(group.module) not in {invariant.signature(m) for m in _linears(model)}


def _linears(model):
    return [m for _, m in model.named_modules() if isinstance(m, nn.Linear)]


def _step_projections(model, tok, monkeypatch) -> int:
    """Projection calls (:func:`invariant.blocked`) in one decode step of 2 rows in the mode."""
    calls = []
    real = invariant.blocked
    sched = _scheduler(model, tok, 2, True)
    _prefilled(sched, prompts_of(model.args.vocab_size, 2, 5, 9), 8)
    with monkeypatch.context() as m:
        m.setattr(invariant, "blocked", lambda f, x, *a: calls.append(x.shape) or real(f, x, *a))
        sched.step()
    return len(calls)


@pytest.mark.model
@pytest.mark.parametrize(
    "name, quantize", [("tiny-llama", False), ("tiny-code", True), ("tiny-qwen3", False)]
)
def test_fused_every_row_is_bit_equal_to_its_run_alone_at_once_and_staggered(monkeypatch, name, quantize):
    model, tok = _model(name, quantize=quantize)
    monkeypatch.setattr(invariant_fuse, "FUSE_BACKENDS", ())
    unfused = _step_projections(model, tok, monkeypatch)
    monkeypatch.setattr(invariant_fuse, "FUSE_BACKENDS", ("cpu",))
    assert _step_projections(model, tok, monkeypatch) == unfused - 3 * len(model.layers)  # 7 -> 4 a layer
    reqs = _requests(tok)
    solo = [invariance.alone(model, tok, r, CHUNK) for r in reqs]
    for max_batch, arrivals in ((14, None), (5, [i // 2 * 3 for i in range(len(reqs))])):
        sched, got = _run(model, tok, reqs, max_batch, arrivals)
        assert len(sched.batch_invariant.fused) == 5 * len(model.layers)  # q, k, v, gate, up
        differ = [i for i, (a, b) in enumerate(zip(got, solo)) if a != b]
        assert not differ, f"{name} fused, max_batch={max_batch}: rows {differ} differ from alone"


@pytest.mark.model
def test_fused_in_the_packed_layout_every_row_is_bit_equal_to_its_run_alone(fusing, monkeypatch):
    from tests.engine.test_packed_invariant import PROMPTS, run

    model, tok = _model("tiny-llama")
    calls = []
    real = invariant_fuse.FusedGroup.__call__
    monkeypatch.setattr(
        invariant_fuse.FusedGroup, "__call__", lambda g, x: calls.append(x.shape) or real(g, x)
    )
    sched, together = run(model, tok, PROMPTS, max_batch=4, page_size=4, max_num_batched_tokens=9)
    assert len(sched.batch_invariant.fused) == 5 * len(model.layers) and calls  # the packed forward fused
    for prompt, row in zip(PROMPTS, together):
        for budget in (9, 5):
            assert run(model, tok, [prompt], max_batch=4, page_size=4, max_num_batched_tokens=budget)[1] == [
                row
            ]
