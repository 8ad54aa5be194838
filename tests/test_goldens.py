"""Goldens written by ``workbench goldens`` from mlx-lm: the engine matches them, and the
live mlx-lm oracle still reproduces them (so a golden cannot silently drift)."""

from importlib.metadata import version

import pytest

import workbench as wb
from workbench import oracle
from workbench.goldens import GOLDEN_MAX_BATCH, golden_requests, read_goldens
from workbench.loading import DATA_DIR

pytestmark = pytest.mark.model

GOLDEN = DATA_DIR.parent / "goldens" / "tiny-llama.json"


@pytest.fixture(scope="module")
def golden():
    return read_goldens(GOLDEN)


def test_golden_records_versions_and_requests(golden):
    assert golden["mlx_version"] and golden["mlx_lm_version"]
    assert golden["max_batch"] == GOLDEN_MAX_BATCH
    assert len(golden["requests"]) == 6 and all(r["solo_tokens"] for r in golden["requests"])


def test_scheduler_matches_goldens(bundled, golden):
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=golden["max_batch"])
    uids = [sched.submit(wb.Request(prompt=r["prompt_ids"], max_tokens=r["max_tokens"], stop_ids=r["stop_ids"]))
            for r in golden["requests"]]
    sched.run()
    for uid, r in zip(uids, golden["requests"]):
        assert sched.tokens(uid) == r["solo_tokens"] == r["batch_tokens"]
        assert sched.logprobs(uid) == pytest.approx(r["solo_logprobs"], abs=1e-4)


def test_live_mlx_lm_oracle_still_reproduces_the_goldens(bundled, golden):
    model, tokenizer = bundled
    reqs = golden_requests(tokenizer)
    assert [list(r.prompt_ids) for r in reqs] == [r["prompt_ids"] for r in golden["requests"]]
    for req, r in zip(reqs, golden["requests"]):
        live = oracle.solo_reference(model, req)
        assert live.tokens == r["solo_tokens"], (
            f"mlx-lm now gives other tokens than the golden (written with mlx {golden['mlx_version']}, "
            f"mlx-lm {golden['mlx_lm_version']}; running mlx {version('mlx')}, mlx-lm {version('mlx-lm')}); "
            "rerun `workbench goldens` and review the diff")
        assert live.logprobs == pytest.approx(r["solo_logprobs"], abs=1e-4)
