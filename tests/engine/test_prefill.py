"""Prefill: in chunks, interleaved with decode steps or not, in groups capped by
``prompt_concurrency``, visible in snapshots while it runs, and skipped for a prefix the
prompt cache holds. Scheduling is not math: the tokens never change."""

import mlx.core as mx
import numpy as np
import pytest

import workbench as wb
from workbench.verify import oracle

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("solo_references_once")]


@pytest.mark.parametrize("interleave", [False, True])
def test_prefill_in_chunks_of_8_interleaved_or_not_gives_the_tokens_of_whole_prefill(run_specs, interleave):
    whole, _, _, _ = run_specs(max_batch=3, prefill_step_size=2048)
    chunked, _, report, sched = run_specs(max_batch=3, prefill_step_size=8, interleave_prefill=interleave)
    assert chunked == whole
    # a prompt of n tokens prefills the n - 1 before its last one, 8 per chunk (a 1-token prompt: none)
    # (a row riding in a batched chunk after its own prompt ended logs n_tokens=0: on a GPU padded
    # prompts prefill batched, docs/gpu.md; those are not its chunks)
    prefills = report.events[(report.events.kind == "prefill") & (report.events.n_tokens > 0)]
    prefill_chunks = prefills.groupby("uid").size().to_dict()
    assert prefill_chunks == {0: 1, 1: 8, 2: 2, 4: 4}  # prompts of 3, 60, 17, 1, 33 tokens
    check = oracle.solo_check(sched.model, sched)
    assert check.ok, check.text()


def test_running_rows_stall_at_most_one_chunk_while_a_long_prompt_joins(make_sched, prompt):
    sched = make_sched(max_batch=3, prefill_step_size=16)
    runners = [sched.submit(wb.Request(prompt=prompt(n, n), max_tokens=30)) for n in (4, 9)]
    sched.admit()
    sched.step()
    long_uid = sched.submit(wb.Request(prompt=prompt(200, 50), max_tokens=4))
    report = sched.run()
    ev = report.events
    chunks = ev[(ev.kind == "prefill") & (ev.uid == long_uid)]
    assert len(chunks) == 13  # 199 prompt tokens before the last one, 16 per chunk
    # between two consecutive tokens of a running row, at most one prefill chunk ran
    for uid in runners:
        token_idx = ev.index[(ev.kind == "token") & (ev.uid == uid)].tolist()
        for a, b in zip(token_idx, token_idx[1:]):
            assert (ev.loc[a:b].kind == "prefill").sum() <= 1
    join_step = int(ev[(ev.kind == "join") & (ev.uid == long_uid)].step.iloc[0])
    assert join_step >= 13, "the long prompt joined only after all its chunks"
    assert oracle.solo_check(sched.model, sched).ok


def test_prompt_concurrency_caps_the_prefilling_group(make_sched, prompt):
    sched = make_sched(max_batch=4, prompt_concurrency=2)
    for n in (5, 6, 7, 8):
        sched.submit(wb.Request(prompt=prompt(n), max_tokens=3))
    first = sched.admit()  # group [0, 1] prefills in one chunk and joins; group [2, 3] forms
    assert [e.uid for e in first if e.kind == "join"] == [0, 1]
    assert [e.uid for e in first if e.kind == "admit"] == [0, 1, 2, 3]
    assert [e.uid for e in sched.admit() if e.kind == "join"] == [2, 3]
    sched2 = make_sched(max_batch=4, prompt_concurrency=2, prefill_step_size=2)
    for n in (5, 6, 7, 8):
        sched2.submit(wb.Request(prompt=prompt(n), max_tokens=3))
    sched2.admit()
    snap = sched2.snapshot()
    assert [uid for uid, _, _ in snap.prefilling] == [0, 1] and snap.queue == (2, 3)


def test_a_prefilling_group_is_visible_in_snapshots(make_sched, prompt):
    sched = make_sched(max_batch=2, prefill_step_size=10)
    sched.submit(wb.Request(prompt=prompt(35), max_tokens=3))
    sched.admit()
    snap = sched.snapshot()
    assert snap.prefilling == ((0, 10, 34),) and snap.batch_size == 0
    assert "prefilling uid 0: 10/34 prompt tokens" in snap.text()
    assert not sched.idle


def test_warm_prompt_cache_gives_the_cold_tokens_inside_a_batch(bundled, make_sched, prompt):
    model, _ = bundled
    sched = make_sched(max_batch=3, prompt_cache=8)
    p = prompt(40, 20)
    cold = sched.submit(wb.Request(prompt=p, max_tokens=10))
    sched.submit(wb.Request(prompt=prompt(7, 300), max_tokens=12))
    sched.run()
    warm = sched.submit(wb.Request(prompt=p, max_tokens=10))
    sched.submit(wb.Request(prompt=prompt(25, 500), max_tokens=9))
    follow = sched.submit(wb.Request(prompt=p + sched.tokens(cold) + prompt(5, 700), max_tokens=8))
    report = sched.run().requests.set_index("uid")
    assert sched.tokens(warm) == sched.tokens(cold)
    assert report.loc[cold, "cached_tokens"] == 0
    assert (
        report.loc[warm, "cached_tokens"] == 38
    )  # of the 39 to prefill; mlx-lm trims a longer entry to leave one
    assert report.loc[follow, "cached_tokens"] == 40 + 10  # the whole stored entry: prompt + generated tokens
    check = oracle.solo_check(model, sched)
    assert check.ok, check.text()


def test_a_padded_group_longer_than_a_chunk_runs_batched_on_full_attention_caches_and_per_row_otherwise(
    bundled, prompt
):
    """mlx-lm's PromptProcessingBatch chunks right-padded prompts of full-attention models;
    so does the workbench on a GPU, or where asked (one forward per chunk for all rows, not
    one per row and chunk), and each row's cache equals the same prompt run alone. A sliding-window model keeps
    the per-row mode (its batch cache is not safe with right padding across chunks)."""
    from mlx_lm.models.cache import make_prompt_cache

    from workbench.engine.prefill import PrefillGroup

    model, _ = bundled
    prompts = [prompt(n, 7 * n) for n in (5, 30, 13)]
    from workbench.runtime.device import on_gpu

    assert PrefillGroup(model, prompts, prefill_step_size=8).per_row is not on_gpu()  # the default: GPU only
    group = PrefillGroup(model, prompts, prefill_step_size=8, chunked_padding=True)
    assert group.chunked_padding and not group.per_row
    forwards = 0
    while not group.done:
        assert group.next_chunk()[0] == 3  # every row in every chunk
        group.run_chunk()
        forwards += 1
    assert forwards == 4  # ceil(30 / 8), against 1 + 4 + 2 = 7 per row
    for b, p in enumerate(prompts):
        solo = make_prompt_cache(model)
        model(mx.array([p], dtype=mx.uint32), cache=solo)
        for layer, ref in zip(group.caches, solo):
            pad = int(layer.left_padding[b].item())
            ours = layer.keys[b : b + 1, :, pad : layer._idx]
            np.testing.assert_allclose(
                np.array(ours), np.array(ref.keys[..., : ref.offset, :]), rtol=1e-5, atol=1e-5
            )

    gemma, _ = wb.load("tiny-gemma3")
    rotating = PrefillGroup(gemma, [[1] * 5, [2] * 30], prefill_step_size=8, chunked_padding=True)
    assert rotating.per_row and not rotating.chunked_padding


def test_scheduled_runs_with_batched_padded_chunks_equal_each_request_alone(make_sched, prompt, monkeypatch):
    """The GPU's default, forced on the CPU: a padded group prefilled batched in 8-token
    chunks, interleaved with decode steps, joins with every row equal to its solo run."""
    from workbench.engine import prefill

    monkeypatch.setattr(prefill, "chunked_padding_default", lambda: True)
    sched = make_sched(max_batch=4, prefill_step_size=8)
    sched.submit(wb.Request(prompt=prompt(6), max_tokens=12))
    sched.admit()
    sched.step()
    for n in (3, 41, 19):
        sched.submit(wb.Request(prompt=prompt(n, n), max_tokens=6))
    report = sched.run()
    chunks = report.events[report.events.kind == "prefill"]
    assert chunks.groupby("step").uid.nunique().max() >= 2  # rows of the padded group share chunks
    check = oracle.solo_check(sched.model, sched)
    assert check.ok, check.text()


@pytest.mark.parametrize("first_window, second_window", [(None, 64), (64, None), (64, 48)])
def test_schedulers_of_different_windows_sharing_one_prompt_cache_never_take_each_others_entries(
    first_window, second_window
):
    """One mlx-lm LRUPromptCache shared by two schedulers on one model (as ``fresh()``
    shares it) that differ in ``max_kv_size``: a windowed row never resumes a
    full-attention entry (it would see past its window), nor the reverse; every row equals
    its solo run at its own scheduler's window; schedulers of one configuration still share."""
    from mlx_lm.models.cache import LRUPromptCache

    from workbench.runtime.loading import DATA_DIR
    from workbench.workloads.workload import prompt_of_length

    model, tok = wb.load(DATA_DIR / "models" / "tiny-qwen3")  # no make_cache: max_kv_size applies
    lru = LRUPromptCache(max_size=8)
    first = wb.Scheduler(model, tok, max_batch=2, prompt_cache=lru, max_kv_size=first_window)
    p = prompt_of_length(tok, 40, 20)
    stored = first.submit(wb.Request(prompt=p, max_tokens=10, stop_ids=[]))  # 50 tokens: within either window
    first.submit(wb.Request(prompt=prompt_of_length(tok, 7, 300), max_tokens=12, stop_ids=[]))
    first.run()
    assert len(lru) >= 1
    follow = p + first.tokens(stored) + prompt_of_length(tok, 5, 700)  # 55 tokens + 20 new: past the window
    second = first.fresh(max_kv_size=second_window)
    assert second.prompt_cache.lru is lru
    uids = [
        second.submit(wb.Request(prompt=follow, max_tokens=20, stop_ids=[])),
        second.submit(wb.Request(prompt=p, max_tokens=10, stop_ids=[])),
    ]
    report = second.run().requests.set_index("uid")
    assert list(report.loc[uids, "cached_tokens"]) == [0, 0]
    check = oracle.solo_check(model, second, uids)
    assert check.ok, check.text()
    again = first.fresh()  # the first one's configuration: its entries are found
    uid = again.submit(wb.Request(prompt=follow, max_tokens=20, stop_ids=[]))
    assert again.run().requests.set_index("uid").loc[uid, "cached_tokens"] == 50
    check = oracle.solo_check(model, again, [uid])
    assert check.ok, check.text()


def test_the_prompt_cache_key_names_everything_that_shapes_a_cache(make_sched):
    """Schedulers on one model share entries only when nothing else differs that changes what
    their caches hold: here the decode fast paths (a compiled MLP writes keys within 1e-5)."""
    from mlx_lm.models.cache import LRUPromptCache

    lru = LRUPromptCache(max_size=4)
    plain, same, compiled = (
        make_sched(prompt_cache=lru),
        make_sched(prompt_cache=lru),
        make_sched(prompt_cache=lru, fast_decode=True),
    )
    assert plain.prompt_cache.key == same.prompt_cache.key
    assert compiled.prompt_cache.key != plain.prompt_cache.key
    assert "max_kv_size=None" in plain.prompt_cache.key and "kv_quant=None" in plain.prompt_cache.key
    assert "compile_mlp=True" in compiled.prompt_cache.key
