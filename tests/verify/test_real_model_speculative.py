"""Speculative decoding on SmolLM2-135M-Instruct (dequantized, the CPU default): rows that
copy their prompt accept prompt-lookup drafts, and every greedy row equals the same request
run alone through mlx-lm without speculation (the solo oracle)."""

from __future__ import annotations

import pytest

import workbench as wb
from tests.real_model import chat_ids, dense_real_model
from workbench.verify import oracle

pytestmark = pytest.mark.realmodel

CODE = (
    "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative')\n"
    "    return width * height\n"
)


def test_prompt_lookup_rows_that_copy_their_prompt_equal_each_request_run_alone():
    model, tokenizer = dense_real_model()
    sched = wb.Scheduler(model, tokenizer, max_batch=3, speculative="prompt-lookup", num_draft_tokens=4)
    questions = [
        f"Repeat this code exactly:\n```python\n{CODE}```",
        "Name a primary colour.",
        f"Add type hints to this function:\n```python\n{CODE}```",
    ]
    uids = [sched.submit(wb.Request(prompt=chat_ids(tokenizer, q), max_tokens=28)) for q in questions]
    sched.run()
    table = sched.report().speculation.set_index("uid")
    assert table.loc[uids[0], "accepted_tokens"] > 5 and table.loc[uids[0], "tokens_per_forward"] > 1.2
    check = oracle.solo_check(model, sched)
    assert len(check.rows) == 3 and check.ok, check.text()
    assert check.n_match == 3 and check.noise < 1e-4  # token for token; log-probs within 1e-4
