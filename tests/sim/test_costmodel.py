"""The cost model: fitting recovers known coefficients, charging follows the formulas,
and measuring this machine produces fittable data."""

import numpy as np
import pandas as pd
import pytest
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache

from workbench.engine.levers.cost import nonnegative_lstsq
from workbench.sim.calibrate import DECODE_COLUMNS, PREFILL_COLUMNS, fit_cost_model, measure_costs
from workbench.sim.costmodel import CostedModel, CostModel

TRUE = CostModel(
    prefill_s_per_chunk=2e-3,
    prefill_s_per_token=5e-4,
    prefill_s_per_pair=2e-7,
    decode_s_per_step=4e-3,
    decode_s_per_row=6e-4,
    decode_s_per_kv_token=3e-7,
)


def _synthetic_measurements(cost, noise_s=0.0, seed=0):
    rng = np.random.default_rng(seed)
    prefill = pd.DataFrame(
        [(b, k, s, cost.prefill_s(k, s, b)) for b in (1, 4) for k in (8, 32, 128) for s in range(0, 512, 64)],
        columns=PREFILL_COLUMNS,
    )
    decode = pd.DataFrame(
        [(b, w, cost.decode_s(b, w)) for b in (1, 2, 4, 8) for w in (16, 128, 1024)], columns=DECODE_COLUMNS
    )
    for f in (prefill, decode):
        f["time_s"] += rng.normal(0, noise_s, len(f)) if noise_s else 0.0
    return prefill, decode


def test_fitting_noise_free_measurements_recovers_the_coefficients():
    fitted = fit_cost_model(*_synthetic_measurements(TRUE), label="synthetic")
    for name in (
        "prefill_s_per_chunk",
        "prefill_s_per_token",
        "prefill_s_per_pair",
        "decode_s_per_step",
        "decode_s_per_row",
        "decode_s_per_kv_token",
    ):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=1e-6, abs=1e-12), name
    assert fitted.label == "synthetic"


def test_repeated_configurations_are_fitted_by_their_median_so_a_spike_does_not_move_the_fit():
    prefill, decode = _synthetic_measurements(TRUE)
    spiky = pd.concat([decode, decode, decode.assign(time_s=decode.time_s + 1.0).head(3)])
    fitted = fit_cost_model(prefill, spiky)
    assert fitted.decode_s_per_row == pytest.approx(TRUE.decode_s_per_row, rel=1e-6)


def test_a_coefficient_that_would_be_negative_is_held_at_zero():
    X = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    assert nonnegative_lstsq(X, np.array([3.0, 2.0, 1.0])).tolist() == pytest.approx([2.0, 0.0])
    with pytest.raises(ValueError, match="at least 2 measurements"):
        nonnegative_lstsq(X[:1], np.array([1.0]))


def test_costs_follow_the_documented_formulas():
    assert TRUE.prefill_s(10, 100) == pytest.approx(2e-3 + 10 * 5e-4 + (10 * 100 + 55) * 2e-7)
    assert TRUE.decode_s(3, 50) == pytest.approx(4e-3 + 3 * 6e-4 + 150 * 3e-7)
    assert TRUE.decode_s(0, 50) == 0.0


class _FakeModel:
    layers = ("layer",)

    def __call__(self, inputs, cache=None):
        return inputs.shape


class _Shape:
    def __init__(self, *shape):
        self.shape = shape


def test_a_costed_model_charges_prefill_chunks_at_their_start_and_one_token_feeds_as_decode():
    from workbench.sim.clocks import VirtualClock

    clock = VirtualClock()
    model = CostedModel(_FakeModel(), clock, TRUE)
    group, other = [object.__new__(type("C", (), {}))], [object.__new__(type("C", (), {}))]
    assert model(_Shape(2, 16), cache=group) == (2, 16) and clock() == 0.0  # not charging: free
    assert model.layers == ("layer",)  # everything else is the wrapped model's
    with model.charging():
        model(_Shape(2, 16), cache=group)  # 16 more columns after the uncharged 16
        assert clock() == pytest.approx(TRUE.prefill_s(16, 16, rows=2))
        model(_Shape(2, 1), cache=group)  # the join: a [2, 1] feed at width 32
        model(_Shape(3, 8), cache=other)
    assert clock() == pytest.approx(
        TRUE.prefill_s(16, 16, rows=2) + TRUE.decode_s(2, 32) + TRUE.prefill_s(8, 0, 3)
    )
    assert TRUE.prefill_s(8, 0, rows=3) == pytest.approx(2e-3 + 3 * (8 * 5e-4 + 36 * 2e-7))


def test_a_cost_model_round_trips_through_json(tmp_path):
    TRUE.save(tmp_path / "c.json")
    assert CostModel.load(tmp_path / "c.json") == TRUE
    assert "decode step" in TRUE.text()
    with pytest.raises(ValueError, match="unknown field"):
        CostModel.from_dict({"prefill_s_per_tok": 1.0})


@pytest.mark.model
def test_measuring_this_machine_gives_rows_a_cost_model_can_be_fitted_from(bundled):
    prefill, decode = measure_costs(
        *bundled,
        batch_sizes=(1, 2),
        kv_widths_tokens=(8, 24),
        chunk_tokens=(8, 16),
        group_rows=(1, 2),
        prefill_context_tokens=32,
        decode_steps=2,
        repeats=1,
    )
    assert list(prefill.columns) == PREFILL_COLUMNS and list(decode.columns) == DECODE_COLUMNS
    assert (
        prefill.groupby("rows").tokens.sum().to_dict() == {1: 64, 2: 64}
        and len(decode) == 8
        and (decode.time_s > 0).all()
    )
    assert sorted(set(decode.kv_width_tokens)) == [9, 10, 25, 26]  # width W + 1 after the warm-up step
    fitted = fit_cost_model(prefill, decode)
    assert fitted.decode_s(1, 10) > 0 and fitted.prefill_s(16) > 0


class _WritingModel:
    """Writes each forward's keys into every layer cache (as an attention layer does), so
    the caches hold what a real forward would leave; returns the input shape."""

    layers = ("layer", "layer")

    def __call__(self, inputs, cache=None):
        import mlx.core as mx

        rows, tokens = inputs.shape
        for c in cache:
            if not isinstance(c, ArraysCache):
                c.update_and_fetch(mx.zeros((rows, 1, tokens, 4)), mx.zeros((rows, 1, tokens, 4)))
        return inputs.shape


def _charged(model, clock, rows, tokens, cache):
    before = clock()
    with model.charging():
        model(_Shape(rows, tokens), cache=cache)
    return clock() - before


def test_a_filtered_batch_cache_is_charged_by_the_padded_width_it_still_holds():
    """mlx-lm's ``BatchKVCache.filter`` drops the rows that left and their common left padding:
    the next forwards attend the narrower width, not every column ever fed into the object."""
    from workbench.sim.clocks import VirtualClock

    clock = VirtualClock()
    model = CostedModel(_WritingModel(), clock, TRUE)
    cache = [BatchKVCache([0, 200]), BatchKVCache([0, 200])]  # prompts of 300 and 100 tokens
    assert _charged(model, clock, 2, 300, cache) == pytest.approx(TRUE.prefill_s(300, 0, rows=2))
    assert _charged(model, clock, 2, 1, cache) == pytest.approx(TRUE.decode_s(2, 300))
    for c in cache:
        c.filter([1])  # the 300-token row finished: the 100-token row's 101 keys remain
    # decode charges grow with the row's keys, from what it holds
    assert [_charged(model, clock, 1, 1, cache) for _ in range(3)] == pytest.approx(
        [TRUE.decode_s(1, w) for w in (101, 102, 103)]
    )


def test_a_fresh_prompt_in_a_reused_cache_object_is_charged_from_its_own_start():
    """mlx-lm's prompt batch keeps its cache objects across the prompts that pass through it;
    a prompt fed after the last one left (filtered out, or trimmed away) starts where the cache
    stands, not after every token the object has seen (the 2.8 s for a lone 511-token chunk)."""
    from workbench.sim.clocks import VirtualClock

    clock = VirtualClock()
    model = CostedModel(_WritingModel(), clock, TRUE)
    solo = [KVCache(), KVCache()]
    _charged(model, clock, 1, 400, solo)
    for c in solo:
        c.trim(400)  # the prompt left; the same objects take the next one
    assert _charged(model, clock, 1, 200, solo) == pytest.approx(TRUE.prefill_s(200, 0))
    batch = [BatchKVCache([0]), BatchKVCache([0])]
    for _ in range(3):  # 511-token prompts through one prompt batch: join the batch, the last one leaves
        for c in batch:
            c.extend(BatchKVCache([0]))  # an empty row joins, left-padded to the width held
            c.filter([len(c.left_padding) - 1])  # the previous prompt's row leaves with its keys
        assert _charged(model, clock, 1, 511, batch) == pytest.approx(TRUE.prefill_s(511, 0))


def test_a_copied_cache_and_layers_of_other_kinds_are_charged_by_the_keys_they_hold():
    """A deep copy (mlx-lm's ``PromptProcessingBatch.split``) holds its rows' keys from birth;
    state layers (``ArraysCache``) hold none; ``QuantizedKVCache`` tells by ``offset``; a cache
    that tells nothing is priced by the tokens fed into it."""
    import copy

    from workbench.sim.clocks import VirtualClock

    clock = VirtualClock()
    model = CostedModel(_WritingModel(), clock, TRUE)
    cache = [ArraysCache(2), KVCache()]
    _charged(model, clock, 1, 64, cache)
    assert _charged(model, clock, 1, 1, copy.deepcopy(cache)) == pytest.approx(TRUE.decode_s(1, 64))
    from workbench.sim.costmodel import held_keys

    assert held_keys(cache) == 64
    quantized = KVCache().to_quantized(group_size=64, bits=8)
    quantized.offset = 130
    assert held_keys([ArraysCache(2), quantized]) == 130 and held_keys([ArraysCache(2)]) is None


def test_a_cache_that_tells_no_keys_is_priced_by_the_tokens_fed_into_it():
    """The fallback of ``held_keys() is None`` (only state layers here): the tokens every forward
    fed into that cache list so far, charged or not."""
    from workbench.sim.clocks import VirtualClock

    clock = VirtualClock()
    model = CostedModel(_WritingModel(), clock, TRUE)
    states = [ArraysCache(2), ArraysCache(2)]
    model(_Shape(1, 64), cache=states)  # not charged, but counted
    assert _charged(model, clock, 1, 1, states) == pytest.approx(TRUE.decode_s(1, 64))
    assert _charged(model, clock, 1, 16, states) == pytest.approx(TRUE.prefill_s(16, 65))
