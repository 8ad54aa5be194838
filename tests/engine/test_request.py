"""Bad input is refused at submit with a ValueError naming the field, before any state
changes, and never disturbs the running rows."""

import math

import pytest

import workbench as wb

OUTSIDE = 1_000_000  # a token id beyond any bundled model's vocabulary

# (fields, message regex); "{vocab}" stands for the bundled model's vocabulary size
BAD = [
    (dict(prompt=""), "prompt"),
    (dict(prompt=[]), "prompt"),
    (dict(prompt=[1, OUTSIDE]), r"prompt\[1\] = 1000000 is outside the vocabulary \[0, {vocab}\)"),
    (dict(prompt=[-1]), "prompt"),
    (dict(prompt=[1.5]), "prompt"),
    (dict(prompt=42), "prompt"),
    (dict(prompt=[1], max_tokens=0), "max_tokens must be an int >= 1"),
    (dict(prompt=[1], max_tokens=-3), "max_tokens"),
    (dict(prompt=[1], max_tokens=2.0), "max_tokens"),
    (dict(prompt=[1], temperature=-1.0), "temperature"),
    (dict(prompt=[1], temperature=math.nan), "temperature"),
    (
        dict(prompt=[1], temperature=1e-45),
        r"temperature must be 0 \(greedy\) or >= 1e-37 \(1 / temperature must be finite",
    ),
    (dict(prompt=[1], temperature=2e-39), r"temperature must be 0 \(greedy\) or >= 1e-37"),
    (dict(prompt=[1], temperature=0.5, top_p=0.0), r"top_p must be a number in \(0, 1\]"),
    (dict(prompt=[1], temperature=0.5, top_k=-1), "top_k"),
    (dict(prompt=[1], top_p=0.9), "temperature > 0"),
    (dict(prompt=[1], stop_ids=[OUTSIDE]), "stop_ids"),
    (dict(prompt=[1], stop_ids=3), "stop_ids"),
    (dict(prompt=[1], logit_bias={5: float("nan")}), r"logit_bias\[5\] must be a finite number"),
    (dict(prompt=[1], logit_bias={OUTSIDE: 1.0}), r"logit_bias\[0\] = 1000000 is outside the vocabulary"),
    (dict(prompt=[1], logit_bias=[1, 2]), "logit_bias must be a mapping"),
    (
        dict(prompt="ab\ud800c"),
        r"prompt must be valid Unicode text: a lone surrogate '\\ud800' at character 2",
    ),
    (
        dict(prompt=[1], logit_bias={9: 1e39}),  # overflowed float32: the row ended in error mid-run
        r"logit_bias\[9\] must be a finite number in \[-100, 100\] \(MAX_LOGIT_BIAS\)",
    ),
    (dict(prompt=[1], seed=-2), "seed must be an int >= 0"),
    (dict(prompt=[1], min_p=0.1), "min_p needs temperature > 0"),
    (dict(prompt=[1], temperature=0.5, min_p=1.5), r"min_p must be a number in \[0, 1\)"),
    (dict(prompt=[1], repetition_penalty=0.0), r"repetition_penalty must be a number in \[0.01, 100\]"),
    (dict(prompt=[1], presence_penalty=math.inf), "presence_penalty must be a finite number"),
    (
        dict(prompt=[1], frequency_penalty=-1e300),
        r"frequency_penalty must be a finite number in \[-2, 2\] \(MAX_PENALTY\)",
    ),
    (
        dict(prompt=[1], repetition_penalty=1e-300),
        r"repetition_penalty must be a number in \[0.01, 100\] \(MAX_REPETITION_PENALTY\)",
    ),
    (dict(prompt=[1], presence_penalty=2.5), r"presence_penalty must be a finite number in \[-2, 2\]"),
    (dict(prompt=[1], logits_processors=[3]), "logits_processors must be a list of callables"),
    (dict(prompt=[1], on_token="print"), "on_token must be callable"),
    (dict(prompt=[1], sampler=5), "sampler must be callable"),
    (dict(prompt=[1], priority=1.5), "priority must be an int"),
    (dict(prompt=[1] * 10, max_tokens=10**6), "exceeds the model's context"),
    (
        dict(prompt=[1], stop=[f"s{i}" for i in range(65)]),
        r"stop has 65 strings; at most 64 \(MAX_STOP_STRINGS\)",
    ),
    (
        dict(prompt=[1], stop=["x" * 257]),
        r"stop\[0\] is 257 characters long; at most 256 \(MAX_STOP_LENGTH\)",
    ),
    # A break-it pass (2026-12-08): these raised a bare UnicodeEncodeError / took the stop string.
    (dict(prompt=[1], stop=["ok", "a\ud800"]), r"stop\[1\] must be valid Unicode text: a lone surrogate"),
    (
        dict(messages=[{"role": "\ud800", "content": "hi"}]),
        r"messages\[0\]\.role must be valid Unicode text: a lone surrogate '\\ud800' at character 0",
    ),
    # An int beyond float's range raised OverflowError ("int too large to convert to float").
    (
        dict(prompt=[1], temperature=10**400),
        r"^temperature must be a finite number >= 0, got an int of 401 digits$",
    ),
    (
        dict(prompt=[1], temperature=1, top_p=10**400),
        r"^top_p must be a number in \(0, 1\], got an int of 401",
    ),
    (
        dict(prompt=[1], temperature=1, min_p=-(10**400)),
        r"^min_p must be a number .*got a negative int of 401",
    ),
    (dict(prompt=[1], presence_penalty=10**400), r"^presence_penalty must be a finite number in \[-2, 2\]"),
    (dict(prompt=[1], frequency_penalty=10**400), r"^frequency_penalty must be a finite number in \[-2, 2\]"),
    (dict(prompt=[1], repetition_penalty=10**400), r"^repetition_penalty must be a number in \[0.01, 100\]"),
    (dict(prompt=[1], logit_bias={5: 10**400}), r"^logit_bias\[5\] must be a finite number in \[-100, 100\]"),
    # Beyond 4,300 digits Python refuses to write an int: the message still names the field.
    (dict(prompt=[1], max_tokens=10**5000), r"^prompt \(1 tokens\) \+ max_tokens \(an int of 5001 digits\)"),
    (dict(prompt=[1], logit_bias={10**5000: 1}), r"^logit_bias\[0\] = an int of 5001 digits is outside"),
]


@pytest.mark.parametrize("fields,message", BAD)
def test_bad_request_field_raises_value_error_naming_it(bundled, make_sched, fields, message):
    sched = make_sched()
    with pytest.raises(ValueError, match=message.replace("{vocab}", str(bundled[0].args.vocab_size))):
        sched.submit(wb.Request(**fields))
    assert sched.idle and sched.events == []


def test_the_catalogue_covers_at_least_twenty_kinds_of_bad_input():
    assert len(BAD) >= 20


def test_max_tokens_of_one_and_duplicate_stop_ids_are_valid(make_sched, prompt):
    sched = make_sched(max_batch=2)
    one = sched.submit(wb.Request(prompt=prompt(5), max_tokens=1))
    dup = sched.submit(wb.Request(prompt=prompt(7), max_tokens=4, stop_ids=[3, 3, 3]))
    sched.run()
    assert len(sched.tokens(one)) == 1 and sched.finish_reason(one) == "length"
    assert sched.request_of(dup).stop_ids == frozenset({3})


def test_unknown_request_field_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['temprature'\]"):
        wb.Request(prompt=[1], temprature=0.5)


def test_missing_prompt_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"'prompt' .* or 'messages' .* is required"):
        wb.Request(max_tokens=3)


def test_prompt_plus_max_tokens_over_the_context_is_refused(make_sched):
    sched = make_sched()
    limit = sched.context_tokens
    with pytest.raises(ValueError, match=f"exceeds the model's context of {limit} tokens"):
        sched.submit(wb.Request(prompt=[1] * 10, max_tokens=limit - 9))
    sched.submit(wb.Request(prompt=[1] * 10, max_tokens=limit - 10))  # exactly fits


def test_numpy_token_ids_are_accepted_as_plain_ints(make_sched):
    import numpy as np

    sched = make_sched()
    uid = sched.submit(wb.Request(prompt=np.array([5, 9, 11]), max_tokens=2, stop_ids=[np.int64(0)]))
    assert sched.request_of(uid).prompt_ids == (5, 9, 11)
    assert all(type(t) is int for t in sched.request_of(uid).prompt_ids)


def test_numpy_scalars_are_accepted_for_the_sampling_numbers(make_sched):
    import numpy as np

    sched = make_sched()
    uid = sched.submit(
        wb.Request(
            prompt=[5, 9], max_tokens=np.int64(3), temperature=np.float32(0.5), top_p=np.float32(0.9), seed=3
        )
    )
    sched.run()
    assert len(sched.tokens(uid)) == 3 and sched.finish_reason(uid) == "length"
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        sched.submit(wb.Request(prompt=[5], temperature=np.float32("nan")))


def test_unknown_field_in_a_submitted_dict_is_refused(make_sched):
    with pytest.raises(ValueError, match="unknown field"):
        make_sched().submit({"prompt": [1], "colour": "red"})


def test_something_that_is_not_a_request_is_refused(make_sched):
    with pytest.raises(ValueError, match="request must be a workbench.Request"):
        make_sched().submit("def f():")


def test_bad_submits_while_rows_decode_change_nothing(make_sched, prompt):
    def run(with_bad_input: bool):
        sched = make_sched(max_batch=3)
        uids = [sched.submit(wb.Request(prompt=prompt(n, 11 * n), max_tokens=10)) for n in (4, 13)]
        sched.admit()
        for _ in range(3):
            sched.step()
        if with_bad_input:
            before = (len(sched.events), sched.snapshot().queue, sched.snapshot().uids)
            for fields, _ in BAD:
                with pytest.raises(ValueError):
                    sched.submit(wb.Request(**fields))
            assert (len(sched.events), sched.snapshot().queue, sched.snapshot().uids) == before
        late = sched.submit(wb.Request(prompt=prompt(6), max_tokens=5))
        sched.run()
        return [sched.tokens(u) for u in uids + [late]], late

    clean, late_clean = run(False)
    disturbed, late_disturbed = run(True)
    assert disturbed == clean
    assert late_disturbed == late_clean  # refused requests consumed no uid


def test_request_shows_its_real_fields_to_signature_help_and_shift_tab_and_still_refuses_unknown_ones():
    import inspect

    params = inspect.signature(wb.Request).parameters
    assert list(params)[:3] == ["prompt", "max_tokens", "temperature"] and "on_token" in params
    assert params["max_tokens"].default == 32
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['max_new_tokens'\]"):
        wb.Request(prompt="x", max_new_tokens=3)


def test_the_smallest_temperature_samples_the_greedy_tokens_in_float32_and_float16(make_sched, prompt):
    """1 / MIN_TEMPERATURE stays finite: the draw is the argmax (no arbitrary token), in the
    model's float32 and for float16 log-probabilities (scaled in float32 there)."""
    import mlx.core as mx

    from workbench.engine.request import MIN_TEMPERATURE
    from workbench.engine.sampling import RowSampler

    greedy, tiny = make_sched(max_batch=2), make_sched(max_batch=2)
    g = greedy.submit(wb.Request(prompt=prompt(9, 40), max_tokens=8))
    t = tiny.submit(wb.Request(prompt=prompt(9, 40), max_tokens=8, temperature=MIN_TEMPERATURE, seed=3))
    greedy.run(), tiny.run()
    assert tiny.tokens(t) == greedy.tokens(g)
    logits = (
        mx.arange(4096, dtype=mx.float32)[None] * 0.01
    )  # the top log-prob about -4.6, its neighbour 0.01 below
    logprobs = (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).astype(mx.float16)
    for temperature in (1e-5, MIN_TEMPERATURE):  # 1 / 1e-5 is past float16's largest (65504)
        sampler = RowSampler(wb.Request(prompt=[1], temperature=temperature), seed=0, vocab_size=4096)
        assert [sampler.choose(logprobs, i).item() for i in range(4)] == [4095] * 4, temperature


@pytest.mark.parametrize(
    "value, shown",
    [
        (10**400, "an int of 401 digits"),
        (10**400 - 1, "an int of 400 digits"),
        (-(2**1025), "a negative int of 309 digits"),
        (2**1024, "an int of 309 digits"),
        (2**1023, repr(2**1023)),
        (1.5, "1.5"),
        (True, "True"),
    ],
)
def test_a_number_beyond_floats_range_is_shown_by_its_digit_count(value, shown):
    from workbench.engine.request import _shown

    assert _shown(value) == shown
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1024:
        assert f"{len(str(abs(value)))} digits" in shown  # the count is exact
