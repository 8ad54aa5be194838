"""The prompt set is a corpus, not a model input: tokenizing it warns about nothing and
gives the same ids as the transformers front end (which would warn)."""

from __future__ import annotations

from mlx_lm.tokenizer_utils import load as load_tokenizer

from workbench.runtime.loading import BUNDLED_MODEL
from workbench.workloads.workload import PROMPT_SOURCE, source_ids

WARNING = "Token indices sequence length is longer than the specified maximum sequence length"


def _said(capfd, caplog) -> str:
    text = "".join(capfd.readouterr()) + caplog.text
    caplog.clear()
    return text


def test_the_prompt_set_is_longer_than_the_context_yet_tokenized_without_the_transformers_warning(
    capfd, caplog
):
    tokenizer = load_tokenizer(BUNDLED_MODEL)  # fresh: transformers warns once per tokenizer object
    _said(capfd, caplog)
    ids = source_ids.__wrapped__(tokenizer)  # not a cached result: tokenize now
    assert WARNING not in _said(capfd, caplog)
    assert len(ids) > tokenizer.model_max_length  # 766 > 512 tokens
    front = tokenizer.encode(PROMPT_SOURCE.read_text(), add_special_tokens=False)
    assert WARNING in _said(capfd, caplog)  # what the front end says about the same text
    assert list(ids) == front
