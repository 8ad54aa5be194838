"""The model-family walk (``workbench families``) classifies architectures by what they
really do in the engine."""

import pytest

from workbench.verify.families import BASE_CONFIG, build, families_markdown, try_family, walk_families  # noqa: F401

pytestmark = pytest.mark.model


def test_llama_batches_and_matches_solo_and_gpt_bigcode_goes_to_the_serial_lane():
    assert try_family("llama") == ("batches", "2 rows of 3 and 7 tokens, 2/2 match solo")
    result, detail = try_family("gpt_bigcode")
    assert result == "serial lane" and "Only length-1 arrays" in detail


def test_an_architecture_the_base_config_cannot_build_is_listed_as_not_built_not_refused():
    result, detail = try_family("Klear")
    assert result == "not built" and "missing" in detail


def test_the_documented_table_lists_every_architecture_once_with_a_known_result():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "families.md").read_text()
    rows = [
        line.split(" | ")[:2] for line in text.splitlines() if line.startswith("| ") and "---" not in line
    ][1:]
    names = [r[0][2:] for r in rows]
    assert len(names) == len(set(names)) > 100
    assert {r[1] for r in rows} <= {
        "batches",
        "serial lane",
        "refused",
        "not built",
        "fails",
        "differs from solo",
    }
    assert ("llama", "batches") in {(n, r[1]) for n, r in zip(names, rows)}


def test_the_walk_is_deterministic_where_random_weights_decide_the_result():
    table = walk_families(["gemma2", "gemma2"])  # serial lane: its log-probability gap depends on the weights
    assert table.result.tolist() == ["serial lane"] * 2 and table.detail[0] == table.detail[1]


def test_an_architecture_that_would_build_gigabytes_is_not_built_and_nothing_is_allocated():
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    config = dict(
        BASE_CONFIG, model_type="gemma4"
    )  # its default text config: 35 layers, 262,144 x 8,960 embeddings
    with pytest.raises(MemoryError, match="MiB of weights"):
        build("gemma4", config)
    assert (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024
    )  # KiB: 16 GB were never allocated
    result, detail = try_family(
        "deepseek_v41"
    )  # its expert sizes are fixed: over the bound with any base config
    assert result == "not built" and "MemoryError" in detail and "MiB of weights" in detail


@pytest.mark.parametrize("name", ["gemma4", "gemma4_text", "phixtral"])
def test_architectures_with_their_own_field_names_are_built_small_and_batch(name):
    assert try_family(name) == ("batches", "2 rows of 3 and 7 tokens, 2/2 match solo")


def test_the_probe_feeds_an_architecture_without_args_vocab_size_only_ids_of_its_embedding():
    """phixtral's args name the vocabulary ``num_vocab`` (256 here): the probe's prompts were
    ids of a 4,096-token default, read from outside the embedding table, so its verdict changed
    from one build to the next (about 1 in 12 went to the serial lane)."""
    import mlx.core as mx

    from workbench.engine import probe

    model = build("phixtral")
    assert not hasattr(model.args, "vocab_size") and model.args.num_vocab == 256
    ids = [t for prompt in probe._prompts(model) for t in prompt]
    assert 0 <= min(ids) and max(ids) < 256
    outputs = {bytes(memoryview(build("phixtral")(mx.array([ids]))[0, -1])) for _ in range(6)}
    assert len(outputs) == 1  # the same weights give the same logits on every build
