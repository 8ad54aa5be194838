"""Chat requests (``messages`` through the chat template) and text prompts encoded as
mlx-lm's ``generate`` encodes them (BOS where the tokenizer adds one)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx_lm
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

import workbench as wb
from workbench.runtime.loading import BUNDLED_MODEL

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def bos_tokenizer(tmp_path_factory):
    """The bundled tokenizer, configured like a chat model's: a BOS (``<|endoftext|>``, id 0)
    added in front of every encoded text by a TemplateProcessing post-processor, and a
    chat template."""
    folder = tmp_path_factory.mktemp("bos-tokenizer")
    source = Path(BUNDLED_MODEL)
    shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}},
    }
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.update(bos_token="<|endoftext|>", chat_template=TEMPLATE)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(folder)


def test_the_bos_tokenizer_really_adds_a_bos_and_the_bundled_one_adds_none(bundled, bos_tokenizer):
    _, plain = bundled
    assert bos_tokenizer.encode("import os\n")[0] == 0
    assert bos_tokenizer.encode("import os\n")[1:] == plain.encode("import os\n")
    assert plain.encode("import os\n", add_special_tokens=True) == plain.encode(
        "import os\n", add_special_tokens=False
    )


@pytest.mark.model
def test_a_text_prompt_gets_the_same_ids_and_greedy_tokens_as_mlx_lm_generate(bundled, bos_tokenizer):
    model, _ = bundled
    text = "def fibonacci(n):"
    sched = wb.Scheduler(model, bos_tokenizer, max_batch=2)
    uid = sched.submit(wb.Request(prompt=text, max_tokens=12, stop_ids=[]))
    other = sched.submit(wb.Request(prompt="import os\n", max_tokens=5, stop_ids=[]))  # a neighbour row
    sched.run()
    assert sched.request_of(uid).prompt_ids == tuple(bos_tokenizer.encode(text))
    assert sched.request_of(uid).prompt_ids[0] == 0  # the BOS
    theirs = [r.token for r in mlx_lm.stream_generate(model, bos_tokenizer, text, max_tokens=12)]
    assert sched.tokens(uid) == theirs
    theirs_text = mlx_lm.generate(model, bos_tokenizer, text, max_tokens=12)
    assert sched.text(uid) == bos_tokenizer.decode(theirs)
    assert sched.text(uid) in (theirs_text, " " + theirs_text)  # mlx-lm's detokenizer drops a leading space
    assert len(sched.tokens(other)) == 5


def test_a_prompt_already_starting_with_the_bos_gets_no_second_one(make_sched, bundled, bos_tokenizer):
    model, _ = bundled
    sched = wb.Scheduler(model, bos_tokenizer)
    uid = sched.submit(wb.Request(prompt="<|endoftext|>import os", max_tokens=1))
    assert sched.request_of(uid).prompt_ids.count(0) == 1 and sched.request_of(uid).prompt_ids[0] == 0


def test_messages_are_encoded_with_the_chat_template_and_its_generation_prompt(bundled, bos_tokenizer):
    model, _ = bundled
    sched = wb.Scheduler(model, bos_tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sort a list?"}]
    uid = sched.submit(wb.Request(messages=messages, max_tokens=4))
    expected = bos_tokenizer.encode(
        "<|system|>Be brief.\n<|user|>Sort a list?\n<|assistant|>", add_special_tokens=False
    )
    assert sched.request_of(uid).prompt_ids == tuple(expected)
    assert sched.request_of(uid).prompt_ids == tuple(
        bos_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    )
    sched.run()
    assert sched.finish_reason(uid) in ("stop", "length")


def test_prompt_and_messages_together_are_refused_naming_both_fields(bundled, bos_tokenizer):
    model, _ = bundled
    sched = wb.Scheduler(model, bos_tokenizer)
    with pytest.raises(ValueError, match=r"either 'prompt' or 'messages', not both"):
        sched.submit(wb.Request(prompt="x", messages=[{"role": "user", "content": "x"}]))
    with pytest.raises(ValueError, match=r"'prompt'.*or 'messages'.*required"):
        wb.Request(max_tokens=3)
    assert sched.idle and sched.state.next_uid == 0


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], r"messages must be a non-empty list"),
        ("hello", r"messages must be a non-empty list"),
        ([{"role": "user"}], r"messages\[0\] must be a dict with str 'role' and 'content'"),
        ([{"role": "user", "content": "a"}, ("user", "b")], r"messages\[1\] must be a dict"),
    ],
)
def test_malformed_messages_are_refused_naming_the_bad_turn(bundled, bos_tokenizer, messages, match):
    model, _ = bundled
    with pytest.raises(ValueError, match=match):
        wb.Scheduler(model, bos_tokenizer).submit(wb.Request(messages=messages))


@pytest.mark.parametrize(
    "messages, words",
    [
        ([{"role": "bot", "content": "hi"}], "bad role bot"),
        ([{"role": "assistant", "content": "hi"}], "Conversation roles must alternate"),
    ],
)
def test_a_chat_template_that_raises_is_a_value_error_naming_messages(
    bundled, refusing_tokenizer, messages, words
):
    """A break-it pass (2026-12-08): the template's raise_exception left submit as a jinja2.TemplateError."""
    from jinja2 import TemplateError

    sched = wb.Scheduler(bundled[0], refusing_tokenizer)
    with pytest.raises(ValueError, match=f"^messages: the chat template refuses them: {words}") as refused:
        sched.submit(wb.Request(messages=messages))
    assert isinstance(refused.value.__cause__, TemplateError)
    assert sched.idle and sched.state.next_uid == 0
    assert sched.submit(wb.Request(messages=[{"role": "user", "content": "hi"}], max_tokens=1)) == 0


def test_messages_for_a_tokenizer_without_a_chat_template_get_a_clear_error(make_sched):
    sched = make_sched()
    assert not sched.tokenizer.has_chat_template
    with pytest.raises(ValueError, match=r"chat template.*has none.*pass prompt="):
        sched.submit(wb.Request(messages=[{"role": "user", "content": "hi"}]))
    assert sched.idle


def test_request_signature_shows_messages_and_stop(bundled):
    import inspect

    params = inspect.signature(wb.Request).parameters
    assert params["messages"].default is None and params["stop"].default is None
    assert params["prompt"].default is None
