"""2-D forward masks from hand-built event logs, and agreement with mlx-lm's mask formula."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.base import create_causal_mask

from tests.observe.event_logs import event_log
from tests.views.test_views import full_snapshot
from workbench.observe.forward_masks import causal_mask, decode_forward, prefill_forwards


def prefill_log(prompt_tokens: dict[int, int], chunks: list[tuple[int, int]], joins=()) -> list:
    """Each uid admitted with its prompt length, then the prefill chunks ``(uid, tokens)`` in
    order, then the joins of ``joins``."""
    return event_log(
        "\n".join(
            [f"admit {uid} n_tokens={n}" for uid, n in prompt_tokens.items()]
            + [f"prefill {uid} n_tokens={n}" for uid, n in chunks]
            + [f"join {uid}" for uid in joins]
        )
    )


@pytest.mark.parametrize("n,cached,lp", [(3, 0, None), (2, 4, None), (1, 3, [0, 2]), (4, 2, [1, 0, 2])])
def test_causal_mask_equals_mlx_lm_create_causal_mask(n, cached, lp):
    theirs = create_causal_mask(n, offset=cached, left_padding=None if lp is None else mx.array(lp))
    theirs = np.broadcast_to(np.array(theirs), (len(lp or [0]), 1, n, cached + n)).reshape(-1, n, cached + n)
    assert np.array_equal(causal_mask(n, cached, lp), theirs)


def test_a_right_padded_group_is_one_forward_padded_to_its_longest_row():
    log = prefill_log({0: 6, 1: 2}, [(0, 5), (1, 1)], joins=(0, 1))
    (fm,) = prefill_forwards(log)
    assert fm.uids == (0, 1) and fm.shape == (2, 5, 5) and fm.n_cached == 0 and fm.first_event == 2
    assert fm.query_padding.astype(int).tolist() == [[0, 0, 0, 0, 0], [0, 1, 1, 1, 1]]
    assert fm.key_padding.astype(int).tolist() == fm.query_padding.astype(int).tolist()
    assert np.array_equal(fm.mask[1], np.tril(np.ones((5, 5), bool)))


def test_chunks_of_one_prompt_are_separate_forwards_over_the_cached_keys():
    log = event_log(
        """
        admit 0 n_tokens=11 n_cached=2
        prefill 0 n_tokens=4
        token 5
        prefill 0 n_tokens=4
        """
    )
    first, second = prefill_forwards(log)
    assert (first.n_cached, first.shape) == (2, (1, 4, 6))
    assert (second.n_cached, second.shape) == (6, (1, 4, 10))
    assert second.label == "prefill uid 0: positions 6-9, 6 cached"


def test_consecutive_chunks_of_different_rows_with_different_starts_are_different_forwards():
    log = prefill_log({0: 9, 1: 5}, [(0, 4), (0, 4), (1, 4)])
    assert [(f.uids, f.n_cached) for f in prefill_forwards(log)] == [((0,), 0), ((0,), 4), ((1,), 0)]


def test_decode_forward_is_one_query_per_row_with_the_left_padding_as_padding():
    fm = decode_forward(full_snapshot(uids=(7, 9), left_padding=(0, 2), width=3))
    assert fm.shape == (2, 1, 4) and fm.n_cached == 3
    assert fm.key_padding.astype(int).tolist() == [[0, 0, 0, 0], [1, 1, 0, 0]]
    assert fm.mask[:, 0].astype(int).tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
