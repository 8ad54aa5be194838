"""The page-sharing view on a real packed run: submit_n siblings share their prompt's full
pages, each writes into its own copy of the partly filled one (copy-on-write), and a later
request with the same prompt takes the same pages from the prompt cache."""

import pytest
from matplotlib.figure import Figure

import workbench as wb
from tests.views.test_views import full_snapshot
from workbench.views.sharing import cached_tokens, page_holders, render_sharing, sharing_text


def test_siblings_share_full_pages_copy_the_partial_one_and_a_hit_reuses_them(bundled):
    model, tok = bundled
    sched = wb.Scheduler(model, tok, max_batch=4, layout="packed", page_size=4, prompt_cache=8)
    prompt = tok.encode("def add(a, b):\n    return a + b\n")
    assert len(prompt) == 13  # pages 0-2 full, page 3 holds position 12
    siblings = sched.submit_n(
        wb.Request(prompt=prompt, max_tokens=6, temperature=0.8, seed=1, stop_ids=[]), 3
    )
    sched.submit(wb.Request(prompt=tok.encode("hello world"), max_tokens=4, stop_ids=[]))
    sched.run()
    later = sched.submit(wb.Request(prompt=prompt + tok.encode("x"), max_tokens=3, stop_ids=[]))
    sched.run()
    joined = next(s for s in sched.history if s.packed and set(siblings) <= set(dict(s.packed.pages)))
    hit = next(s for s in sched.history if s.packed and later in dict(s.packed.pages))
    pages = dict(joined.packed.pages)
    holders = page_holders(joined)
    shared = [p for p, u in holders.items() if len(u) > 1]
    assert sorted(shared) == sorted(pages[siblings[0]][:3])  # the three full prompt pages, one copy
    assert all(holders[p] == tuple(siblings) for p in shared)
    assert len({pages[u][3] for u in siblings}) == 3  # the partial page: one copy per sibling
    assert (
        dict(hit.packed.pages)[later][:3] == pages[siblings[0]][:3]
    )  # the prompt cache's hit: the same pages
    text = sharing_text([joined, hit], cached_tokens(sched.events))
    s0 = pages[siblings[0]]
    assert f"  uid {siblings[0]} | " + " ".join(f"{p}[0,1,2]" for p in s0[:3]) + f" {s0[3]}" in text
    assert f"  uid {later} | " + " ".join(f"{p}c" for p in s0[:3]) in text
    assert text.splitlines()[0] == f"step {joined.step}: 3 page(s) shared"
    assert isinstance(render_sharing([("joined", joined), ("hit", hit)], cached_tokens(sched.events)), Figure)


def test_a_padded_snapshot_is_refused_naming_the_layout():
    with pytest.raises(ValueError, match=r"step 3 has no page table \(layout='packed' only\)"):
        page_holders(full_snapshot())
    with pytest.raises(ValueError, match="at least one"):
        render_sharing([])
