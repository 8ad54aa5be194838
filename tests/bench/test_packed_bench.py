"""The packed benchmark's arithmetic on hand-built frames, and its KV sample on a live
scheduler against an independent count."""

import pandas as pd
import pytest

import workbench as wb
from workbench.bench.packed import (
    MLX_LM,
    PACKED,
    PADDED,
    PackedBenchResult,
    decode_table,
    goal_lines,
    kv_sample,
    kv_table,
    summary,
)
from workbench.workloads.workload import prompt_of_length


def result():
    decode = pd.DataFrame(
        [
            dict(engine=e, B=8, pair=p, tok_per_s=v)
            for p, vals in enumerate([(100, 98, 90), (110, 99, 95)])
            for e, v in zip((PADDED, PACKED, MLX_LM), vals, strict=True)
        ]
    )
    lat = pd.DataFrame(
        [
            dict(scenario="azure", engine=e, round=0, ttft_p95_s=t, itl_p95_s=i)
            for e, t, i in ((PADDED, 2.0, 0.2), (PACKED, 1.0, 0.1), (MLX_LM, 2.0, 0.2))
        ]
    )
    kv = pd.DataFrame(
        [
            dict(
                scenario="azure",
                engine=e,
                round=0,
                peak_held_bytes=h,
                peak_token_bytes=100,
                peak_allocated_bytes=a,
            )
            for e, h, a in ((PACKED, 105, 120), (PADDED, 900, 900))
        ]
    )
    return PackedBenchResult(decode, lat, kv, {})


def test_the_tables_give_ratios_to_mlx_lm_and_to_the_padded_layout():
    r = result()
    s = summary(r).set_index("engine")
    assert s.loc[PACKED, "ttft_p95_vs_mlx_lm"] == 0.5 and s.loc[PACKED, "itl_p95_vs_mlx_lm"] == 0.5
    d = decode_table(r).iloc[0]
    assert d.packed_vs_padded == pytest.approx((0.98 + 0.9) / 2)
    k = kv_table(r).set_index("engine")
    assert k.loc[PACKED, "held_vs_tokens"] == 1.05 and k.loc[PADDED, "held_vs_tokens"] == 9.0
    lines = goal_lines(summary(r), kv_table(r), decode_table(r))
    assert lines.pop(0).startswith(
        "- reference for the latency goals: mlx-lm as shipped"
    )  # no equal-capacity run
    # per engine (packed, then padded): TTFT, ITL, both at once
    assert lines[0].startswith("- azure, workbench, packed: TTFT p95 0.50x") and lines[0].endswith(": met")
    assert lines[2].endswith("both goals at once: met")
    assert lines[3].startswith("- azure, workbench: TTFT p95 1.00x") and "no floor measured" in lines[3]
    assert lines[5].endswith("both goals at once: missed")
    # issue 40's decode goals: against the padded layout (missed, no profile in this result) and mlx-lm
    assert "decode B=8: packed 0.94x the padded layout's tok/s (goal >= 1): missed" in lines[6]
    assert lines[6].endswith("no profile at this B")
    assert "decode B=8: packed 1.07x mlx-lm's tok/s (goal >= 1): met" in lines[7]
    assert lines[8].startswith("- azure: packed peak KV bytes 1.050x") and lines[8].endswith("met")


@pytest.mark.model
def test_the_kv_sample_counts_pages_and_tokens_as_an_independent_count(bundled):
    model, tok = bundled
    sched = wb.Scheduler(model, tok, layout="packed", max_batch=2, page_size=4, max_num_batched_tokens=8)
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 6, 0), max_tokens=4))
    sched.submit(wb.Request(prompt=prompt_of_length(tok, 5, 30), max_tokens=4))
    sched.admit()
    sched.step()
    sched.step()
    held, tokens, allocated = kv_sample(sched)
    per_token = sched.batch.page_bytes // 4
    # 6 + 1 + 1 and 5 + 1 tokens in pages of 4 (the second step's read launched the next forward,
    # each row's next token, pipelined): 2 + 2 pages (the second row's last page not full)
    assert sched.batch.launched is not None
    assert tokens == (8 + 6) * per_token and held == 4 * 4 * per_token and allocated >= held


def test_the_report_renders_its_tables_without_optional_packages():
    from workbench.bench.packed import report_text

    text = report_text(result())
    assert "| B | mlx-lm | workbench | workbench, packed | packed_vs_padded | packed_vs_mlx_lm |" in text
    assert "| azure | workbench, packed | 1 | 0.1 | 0.5 | 0.5 |" in text
    assert text.count("## ") == 4 and "- decode B=8: packed 0.94x" in text
