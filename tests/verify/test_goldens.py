"""Goldens written by ``workbench goldens`` from mlx-lm: the engine matches them, and the
live mlx-lm oracle still reproduces them (so a golden cannot silently drift). Each bundled
model has its golden: the trained default and the random-weight tiny-llama."""

from importlib.metadata import version

import pytest

import workbench as wb
from workbench.runtime.loading import BUNDLED_MODEL, DATA_DIR, RANDOM_MODEL
from workbench.verify import oracle
from workbench.verify.goldens import GOLDEN_MAX_BATCH, golden_requests, read_goldens

pytestmark = pytest.mark.model

# golden file name -> fixture giving that model's (model, tokenizer)
MODELS = {BUNDLED_MODEL.name: "bundled", RANDOM_MODEL.name: "random_llama"}


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    """``(golden dict, (model, tokenizer))`` for each bundled model."""
    golden = read_goldens(DATA_DIR.parent / "goldens" / f"{request.param}.json")
    return golden, request.getfixturevalue(MODELS[request.param])


def test_golden_records_versions_and_requests(case):
    golden, _ = case
    assert golden["mlx_version"] and golden["mlx_lm_version"]
    assert golden["max_batch"] == GOLDEN_MAX_BATCH
    assert len(golden["requests"]) == 6 and all(r["solo_tokens"] for r in golden["requests"])


def test_scheduler_matches_goldens(case):
    golden, (model, tokenizer) = case
    sched = wb.Scheduler(model, tokenizer, max_batch=golden["max_batch"])
    uids = [
        sched.submit(wb.Request(prompt=r["prompt_ids"], max_tokens=r["max_tokens"], stop_ids=r["stop_ids"]))
        for r in golden["requests"]
    ]
    sched.run()
    for uid, r in zip(uids, golden["requests"]):
        assert sched.tokens(uid) == r["solo_tokens"] == r["batch_tokens"]
        assert sched.logprobs(uid) == pytest.approx(r["solo_logprobs"], abs=1e-4)


def test_live_mlx_lm_oracle_still_reproduces_the_goldens(case):
    golden, (model, tokenizer) = case
    reqs = golden_requests(tokenizer)
    assert [list(r.prompt_ids) for r in reqs] == [r["prompt_ids"] for r in golden["requests"]]
    for req, r in zip(reqs, golden["requests"]):
        live = oracle.solo_reference(model, req)
        assert live.tokens == r["solo_tokens"], (
            f"mlx-lm now gives other tokens than the golden (written with mlx {golden['mlx_version']}, "
            f"mlx-lm {golden['mlx_lm_version']}; running mlx {version('mlx')}, mlx-lm {version('mlx-lm')}); "
            "rerun `workbench goldens` and review the diff"
        )
        assert live.logprobs == pytest.approx(r["solo_logprobs"], abs=1e-4)
