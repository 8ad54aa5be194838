"""The batch-invariant mode's CPU attention in fixed key blocks (issue 39): the block's two
BLAS calls are bit-stable for every batch count and position, a row's bits are its run
alone behind any padding and beside any rows, the check catches a leak or a width-dependent
sum (and the mode then keeps the strided attention), and the mode takes the blocks for the
bundled model's and the bench's shapes, with this process's BLAS (MLX's reference one,
``tests/conftest.py``) and with OpenBLAS in a subprocess: a BLAS whose block kernel stops
being bit-stable fails here rather than slowing the mode down silently."""

import json
import os
import subprocess
import sys
import textwrap

import mlx.core as mx
import pytest

from workbench.engine.levers import invariant
from workbench.engine.levers import invariant_keyblocks as kb
from workbench.runtime.blas import find_blas

SHAPES = ((4, 64), (2, 32), (1, 64), (3, 128))  # (query heads per KV head, head dim): bench, bundled, ...


@pytest.mark.parametrize(("R", "D"), SHAPES)
def test_the_block_calls_give_a_block_the_same_bits_at_every_batch_count_and_position(R, D):
    assert kb.unstable_block_counts(R, D, mx.float32, counts=range(1, 70)) == []


def test_each_row_gets_its_bits_alone_behind_any_padding_within_rounding_of_fused_attention():
    lengths = (1, 2, 31, 32, 33, 63, 64, 65, 130, 257)
    for R, D in SHAPES[:2]:
        assert kb.rows_alone_agree(R, D, mx.float32, lengths=lengths, pads=(0, 3, 31, 32, 70))
        assert kb.rows_alone_agree(R, D, mx.bfloat16, lengths=lengths[:6], pads=(0, 5))
    B, H, Hkv, D, S = 3, 8, 2, 32, 100
    k0, k1, k2 = mx.random.split(mx.random.key(2), 3)
    q = mx.random.normal((B, H, 1, D), key=k0)
    k, v = mx.random.normal((B, Hkv, S, D), key=k1), mx.random.normal((B, Hkv, S, D), key=k2)
    starts = mx.array([0, 37, 99])
    mask = (mx.arange(S)[None, :] >= starts[:, None])[:, None, None, :]
    fused = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask)
    blocks = kb.key_block_attention(q, k, v, starts, 0.2, S)
    assert mx.abs(blocks - fused).max().item() < 1e-5
    assert mx.array_equal(blocks, kb.key_block_attention(q, k, v, starts, 0.2, None, block=32)).item()


def test_the_check_catches_a_neighbour_leak_and_a_width_dependent_sum_and_the_mode_falls_back(monkeypatch):
    def leak(q, k, v, starts, scale, longest, block):  # a neighbour's queries reach every row
        return kb.key_block_attention(q, k, v, starts, scale, longest, block) + 1e-3 * q.mean(0)

    def width(q, k, v, starts, scale, longest, block):  # the cache's width changes the bits
        return kb.key_block_attention(q, k, v, starts, scale, longest, block) * (1 + 1e-5 * k.shape[2])

    assert kb.rows_alone_agree(4, 64, mx.float32)
    assert not kb.rows_alone_agree(4, 64, mx.float32, attend=leak)
    assert not kb.rows_alone_agree(4, 64, mx.float32, attend=width)
    q = mx.random.normal((2, 4, 1, 16), key=mx.random.key(0))
    k = mx.random.normal((2, 2, 40, 16), key=mx.random.key(1))
    starts = mx.array([0, 9])
    monkeypatch.setitem(kb._AGREE, (2, 16, str(mx.float32), kb.KEY_BLOCK), False)  # as if the check failed
    assert mx.array_equal(
        invariant.row_attention(q, k, k, starts, 0.25), invariant.strided_row_attention(q, k, k, starts, 0.25)
    ).item()
    monkeypatch.setitem(kb._AGREE, (2, 16, str(mx.float32), kb.KEY_BLOCK), True)
    assert mx.array_equal(
        invariant.row_attention(q, k, k, starts, 0.25), kb.key_block_attention(q, k, k, starts, 0.25)
    ).item()


OPENBLAS_SCRIPT = textwrap.dedent("""
    import json
    import mlx.core as mx
    from workbench.engine.levers import invariant_keyblocks as kb
    from workbench.runtime.blas import STATUS

    assert STATUS.library, STATUS.note
    shapes = ((4, 64), (2, 32), (1, 64), (3, 128))
    print(json.dumps({
        "unstable": {f"{R}x{D}": kb.unstable_block_counts(R, D, mx.float32, counts=range(1, 70)) for R, D in shapes},
        "agree": {f"{R}x{D}": kb.blocks_agree(R, D, mx.float32) for R, D in shapes},
        "rows": kb.rows_alone_agree(4, 64, mx.float32, lengths=(1, 31, 32, 33, 64, 65, 257), pads=(0, 3, 32, 70)),
    }))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is the Linux CPU's optimized BLAS")
def test_with_openblas_the_block_kernel_is_bit_stable_and_the_mode_takes_the_blocks(monkeypatch):
    monkeypatch.delenv("WORKBENCH_BLAS", raising=False)  # the suite itself runs with it off
    if find_blas() is None:
        pytest.skip("no optimized BLAS installed here (.ci/run installs Debian's libopenblas0-pthread)")
    done = subprocess.run(
        [sys.executable, "-c", OPENBLAS_SCRIPT],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(v == [] for v in got["unstable"].values()), got
    assert all(got["agree"].values()) and got["rows"], got


def test_the_mode_attends_in_key_blocks_for_the_bundled_and_the_bench_shapes():
    assert kb.blocks_agree(2, 32, mx.float32) and kb.blocks_agree(4, 64, mx.float32)  # bundled, llama-155m


def test_the_attention_finding_names_the_route_the_mode_takes_here():
    """``workbench invariance`` (and notebook 15) say how the mode attends: on the CPU in
    key blocks wherever :func:`blocks_agree` passed for the shape, which is what
    ``row_attention`` then runs."""
    from workbench.engine.levers.invariant_keyblocks import KEY_BLOCK, blocks_agree
    from workbench.verify.invariance import attention_findings

    (finding,) = attention_findings(heads=4, kv_heads=2, head_dim=32)
    if blocks_agree(2, 32, mx.float32):
        assert finding.mode_choice == f"each row's keys in fixed blocks of {KEY_BLOCK}, from its last key"
    else:
        assert finding.mode_choice == "each row on its own keys, no mask"
    assert finding.mode_diff == 0.0
