"""The packed forward's pieces: per-token RoPE (and that it is inert in every other call),
the forward's logits against the model run on each request alone."""

import mlx.core as mx
import mlx.nn as nn
import pytest

from workbench.engine.packed.attention import PerTokenRoPE, Pools, packed_forward, per_token_rope
from workbench.engine.packed.pages import PageTable
from workbench.observe.packed import Chunk


def test_per_token_rope_rotates_each_token_at_its_own_position():
    rope = nn.RoPE(32, base=10000)
    x = mx.random.normal((1, 4, 6, 32), key=mx.random.key(0))
    positions = [3, 4, 5, 0, 1, 7]
    ours = PerTokenRoPE(rope)(x, offset=mx.array(positions))
    alone = mx.concatenate([rope(x[:, :, i : i + 1], offset=p) for i, p in enumerate(positions)], axis=2)
    assert mx.array_equal(ours, alone).item()


def test_per_token_rope_leaves_int_and_per_row_offsets_to_the_layers_rope():
    rope = nn.RoPE(32, base=10000)
    x = mx.random.normal((3, 4, 5, 32), key=mx.random.key(1))
    wrapped = PerTokenRoPE(rope)
    assert mx.array_equal(wrapped(x, offset=7), rope(x, offset=7)).item()
    rows = mx.array([0, 2, 9])
    assert mx.array_equal(wrapped(x, offset=rows), rope(x, offset=rows)).item()


def test_the_rope_swap_is_undone_after_the_block(bundled):
    model, _ = bundled
    attn = model.model.layers[0].self_attn
    with per_token_rope(model.model):
        assert isinstance(attn.rope, PerTokenRoPE)
    assert isinstance(attn.rope, nn.RoPE)


@pytest.mark.model
def test_a_mixed_forward_gives_each_request_the_logits_of_its_run_alone(bundled):
    model, tok = bundled
    a, b = tok.encode("def add(a, b):\n    return"), tok.encode("import os\nimport sys\n")
    table, pools = PageTable(4), Pools(len(model.model.layers))
    table.reserve(0, 5)
    table.reserve(1, len(b))
    first = packed_forward(
        model, pools, table, [Chunk(0, 0, 5, "prefill", False), Chunk(1, 0, len(b), "prefill")], a[:5] + b
    )
    assert first.shape == (1, model.args.vocab_size)
    assert mx.allclose(first[0], model(mx.array(b)[None])[0, -1], atol=1e-4).item()
    table.reserve(0, len(a))
    table.reserve(1, len(b) + 1)
    second = packed_forward(
        model, pools, table, [Chunk(1, len(b), 1, "decode"), Chunk(0, 5, len(a) - 5, "prefill")], [7] + a[5:]
    )
    assert mx.allclose(second[0], model(mx.array(b + [7])[None])[0, -1], atol=1e-4).item()
    assert mx.allclose(second[1], model(mx.array(a)[None])[0, -1], atol=1e-4).item()


@pytest.mark.model
def test_attention_by_groups_equals_the_masked_attention_over_every_requests_keys(bundled):
    model, tok = bundled
    prompts = [
        tok.encode(t) for t in ("def add(a, b):\n    return", "import os\n", "class A:\n    pass\n\nx = 1")
    ]

    def run(masked):
        table, pools = PageTable(4), Pools(len(model.model.layers))
        for u, p in enumerate(prompts[:2]):
            table.reserve(u, len(p))
        packed_forward(
            model,
            pools,
            table,
            [Chunk(u, 0, len(p), "prefill") for u, p in enumerate(prompts[:2])],
            prompts[0] + prompts[1],
            masked,
        )
        for u, p in enumerate(prompts):
            table.reserve(u, len(p) + (u < 2))
        chunks = [
            Chunk(0, len(prompts[0]), 1, "decode"),
            Chunk(1, len(prompts[1]), 1, "decode"),
            Chunk(2, 0, 5, "prefill", False),
        ]
        table.reserve(2, 5)
        return packed_forward(model, pools, table, chunks, [11, 12] + prompts[2][:5], masked)

    grouped, masked = run(False), run(True)
    assert grouped.shape == masked.shape == (2, model.args.vocab_size)
    assert mx.allclose(grouped, masked, atol=1e-5).item()
