"""The benchmark shapes: built from width, depth, heads and vocabulary in proportion, they
keep the sizes every documented benchmark number was measured at."""

import pytest

from workbench.bench.gpu import LLAMA_1B
from workbench.bench.model import FULL, QUICK, ModelShape


def test_the_benchmark_shapes_keep_their_measured_sizes():
    # (hidden, layers, MLP, query heads, KV heads, head dim, vocabulary, tied)
    sizes = lambda s: (  # noqa: E731
        s.hidden_size,
        s.num_hidden_layers,
        s.intermediate_size,
        s.num_attention_heads,
        s.num_key_value_heads,
        s.head_dim,
        s.vocab_size,
        s.tie_word_embeddings,
    )
    assert sizes(FULL) == (1024, 8, 2816, 16, 4, 64, 32000, False)
    assert sizes(QUICK) == (256, 4, 704, 8, 2, 32, 4096, False)
    assert sizes(LLAMA_1B) == (2048, 16, 8192, 32, 8, 64, 128256, True)
    assert LLAMA_1B.config()["model_type"] == "llama" and "name" not in LLAMA_1B.config()


@pytest.mark.parametrize(
    "args, kw",
    [((256, 4, 6, 4096), {}), ((256, 4, 8, 4096), {"gqa": 3}), ((258, 4, 2, 4096), {"gqa": 1})],
)
def test_proportions_that_do_not_divide_are_refused_naming_the_sizes(args, kw):
    with pytest.raises(ValueError, match="num_attention_heads=.* must divide hidden_size="):
        ModelShape.from_proportions("odd", *args, **kw)
