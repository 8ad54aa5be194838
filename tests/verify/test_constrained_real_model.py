"""Structured output on SmolLM2-135M-Instruct (``wb.load("smollm2-135m")``, its own 49,152-token
tokenizer mapped by llguidance): JSON-schema, regex and choices rows beside free chat rows in
one batch; every output satisfies its constraint, every constrained row equals its
constrained solo run (mlx-lm's ``generate_step`` with the same mask) and every free row its
unconstrained one."""

from __future__ import annotations

import pytest

import workbench as wb
from tests.real_model import chat_ids, dense_real_model
from workbench.verify import oracle
from workbench.verify.constrained import constrained_reference, satisfies

pytestmark = pytest.mark.realmodel

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 40},
    },
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def smollm2():
    return dense_real_model()


def test_constrained_chat_rows_beside_free_ones_equal_their_solo_runs(smollm2):
    model, tok = smollm2
    asks = [
        ("Describe Paris as JSON with city, country and population.", dict(json_schema=CITY)),
        ("Is the sky blue? Answer yes or no.", dict(choices=["yes", "no"])),
        ("Give a year in the 1900s.", dict(regex=r"19[0-9]{2}")),
        ("What is the capital of France?", {}),
        ("Name a color.", {}),
    ]
    sched = wb.Scheduler(model, tok, max_batch=len(asks))
    reqs = [wb.Request(prompt=chat_ids(tok, q), max_tokens=60 if c else 12, **c) for q, c in asks]
    uids = [sched.submit(r) for r in reqs]
    sched.run()
    for uid, req in zip(uids, reqs, strict=True):
        valid = sched.request_of(uid)
        if req.constrained:
            assert sched.finish_reason(uid) == "stop" and satisfies(req, sched.text(uid)), sched.text(uid)
            ref = constrained_reference(model, tok, valid, sched.vocab_size)
        else:
            ref = oracle.solo_reference(model, oracle.ref_request(valid))
        result = oracle.compare_row(uid, oracle.scheduler_trace(sched, uid), ref)
        assert result.match, result.describe()
    assert '"city":"Paris"' in sched.text(uids[0]).replace(" ", ""), sched.text(uids[0])
