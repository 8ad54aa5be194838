"""The teaching experiments measure real effects (and nothing where there is none)."""

import pytest

import workbench as wb
from workbench.runtime.loading import DATA_DIR
from workbench.verify import lessons
from workbench.workloads.workload import prompt_of_length

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def mamba():
    return wb.load(DATA_DIR / "models" / "tiny-mamba2")


def test_scanning_pads_into_an_ssm_state_changes_the_next_token(mamba):
    model, tok = mamba
    assert lessons.pad_scan_gap(model, prompt_of_length(tok, 6, 500), n_pads=5) > 0.05
    assert lessons.pad_scan_gap(model, prompt_of_length(tok, 6, 500), n_pads=0) == 0.0


def test_a_stale_ssm_state_changes_the_next_token(mamba):
    model, tok = mamba
    assert (
        lessons.stale_state_gap(model, prompt_of_length(tok, 20, 300), prompt_of_length(tok, 6, 500)) > 0.05
    )


def test_sink_tokens_change_a_windowed_solo_run():
    model, tok = wb.load(DATA_DIR / "models" / "tiny-qwen3")
    gap = lessons.sink_gap(model, prompt_of_length(tok, 30, 5), max_kv_size=8, max_tokens=6)
    assert gap.max_logprob_gap > 1e-3 and len(gap.keep0.tokens) == len(gap.keep4.tokens) == 6
    short = lessons.sink_gap(model, prompt_of_length(tok, 3, 5), max_kv_size=8, max_tokens=3)
    assert short.first_token_divergence is None and short.max_logprob_gap == 0.0  # never wraps
