"""Mask and padding math on hand-built arrays, and agreement with mlx-lm's mask."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.base import create_causal_mask

from workbench.observe.masks import decode_mask, mask_grid, padding_waste


def test_decode_mask_of_two_rows_masks_exactly_the_left_padding():
    expected = np.array([[1, 1, 1, 1], [0, 0, 1, 1]], dtype=bool)
    assert np.array_equal(decode_mask([0, 2], 3), expected)


def test_decode_mask_of_three_rows_with_zero_width_attends_only_the_fed_slot():
    assert np.array_equal(decode_mask([0, 0, 0], 0), np.ones((3, 1), dtype=bool))


@pytest.mark.parametrize("left_padding,width", [([0, 2], 3), ([4, 0, 1], 4), ([0], 0), ([3, 3], 5)])
def test_decode_mask_equals_mlx_lm_create_causal_mask(left_padding, width):
    theirs = create_causal_mask(1, offset=width, left_padding=mx.array(left_padding))
    theirs = np.array(theirs).reshape(len(left_padding), -1)
    assert np.array_equal(decode_mask(left_padding, width), theirs)


def test_decode_mask_refuses_padding_wider_than_the_cache():
    with pytest.raises(ValueError, match=r"left_padding must be in \[0, 2\]"):
        decode_mask([3], 2)


def test_padding_waste_is_pad_slots_over_all_slots():
    assert padding_waste([0, 2, 4], 4) == pytest.approx(6 / 12)
    assert padding_waste([], 4) == 0.0
    assert padding_waste([0, 0], 0) == 0.0


def test_mask_grid_labels_rows_by_uid_and_marks_pads_and_fed_slot():
    text = mask_grid(decode_mask([0, 2], 3), uids=[7, 12])
    assert text.splitlines() == ["uid  7 | # # # @", "uid 12 | . . # @"]


def test_mask_grid_of_an_empty_batch():
    assert mask_grid(np.zeros((0, 1), dtype=bool), []) == "(no rows)"


def test_a_ring_grid_marks_the_write_slot_w_so_at_means_only_the_fed_token():
    from workbench.observe.snapshot import LayerGroup

    ring = np.array([[True, True, False, True]])
    group = LayerGroup(
        "window4",
        ("0",),
        1024,
        ring,
        window_tokens=4,
        write_index=1,
        wrapped=True,
        mask_temporal=np.array([[False, True, True, True]]),
        kv_width_tokens=4,
    )
    storage, temporal = group.text([7]).split("temporal order")
    assert "uid 7 | # w . #" in storage and "@" not in storage.split("\n", 1)[1]
    assert "uid 7 | . # # @" in temporal
